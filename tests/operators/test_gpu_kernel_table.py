"""The gpu target's kernel table (operators/gpu_lowering.py) is the one place that chooses a gpu kernel:
no op class carries a gpu-specific method or attribute, every entry names a registered op, every module
that registers entries is imported with the operators, and the elementwise statements are complete."""
import pkgutil
import re
import sys

import pytest

import mgx_graph.operators as operators
from mgx_graph.ir.operation import Operation
from mgx_graph.ir.shape import Shape
from mgx_graph.operators import make_op, registered_ops
from mgx_graph.operators import gpu_lowering
from mgx_graph.operators.base import op_class


def _all_op_classes():
    found, stack = set(), [Operation]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.add(cls)
            stack.extend(cls.__subclasses__())
    return found | {op_class(n) for n in registered_ops()}


def test_no_op_class_has_a_gpu_specific_method_or_attribute():
    """Kernel choice is the gpu target's (its table), never a hook on an op: ``gpu_kernel``, ``gpu_body``,
    ``gpu_supported``, ``runs_on_gpu`` or any other name with ``gpu`` in it, on any Operation class."""
    bad = sorted(f"{cls.__module__}.{cls.__qualname__}.{name}" for cls in _all_op_classes()
                 for name in vars(cls) if "gpu" in name.lower())
    assert not bad, f"gpu-specific members on op classes (register a kernel in the table instead): {bad}"


def test_every_table_entry_names_a_registered_op():
    table = gpu_lowering.table()
    unknown = sorted(set(table) - set(registered_ops()))
    assert not unknown, f"kernel table entries for ops that are not registered: {unknown}"
    # the fused kinds resolve through the same table
    for name in ("pointwise", "fused_reduce", "fused_scatternd", "fused_horizontal", "fused_gemv", "dot"):
        assert table[name] == "kernel", name
    assert {n for n, kind in table.items() if kind == "host"} == set(gpu_lowering.HOST_ONLY)


def test_every_module_registering_entries_is_imported_with_the_operators():
    """A family module with ``@gpu_kernel_for`` / ``gpu_body_for`` that ``operators/__init__.py`` does not
    import would leave its ops without their kernels."""
    for info in pkgutil.iter_modules(operators.__path__):
        name = f"{operators.__name__}.{info.name}"
        path = f"{operators.__path__[0]}/{info.name}.py"
        try:
            with open(path) as f:
                src = f.read()
        except FileNotFoundError:
            continue
        if info.name != "gpu_lowering" and re.search(r"\bgpu_(kernel|body)_for\(", src):
            assert name in sys.modules, f"{name} registers gpu kernels but operators/__init__.py does not import it"


def test_registering_an_op_twice_is_refused_naming_it():
    before = gpu_lowering.table()
    with pytest.raises(ValueError, match="'dot'"):
        gpu_lowering.gpu_kernel_for("dot")(lambda op, inputs, output, ins: None)
    with pytest.raises(ValueError, match="'sigmoid'"):
        gpu_lowering.gpu_body_for("sigmoid", "y = x")
    assert gpu_lowering.table() == before


def test_elementwise_statements_have_every_attribute_substituted():
    """Each statement of the table, for the op with its default attributes: its upper-case placeholders
    are all float attributes of the op (substituted), and it assigns ``y``."""
    bodies = [n for n, kind in gpu_lowering.table().items() if kind == "elementwise"]
    assert "sigmoid" in bodies and "where" in bodies
    for name in bodies:
        op = make_op(name)
        body = gpu_lowering.gpu_body(op)
        assert body is not None and body.lstrip("{ ").startswith("y ="), (name, body)
        left = re.findall(r"\b[A-Z]{2,}\b", body)
        assert not left, f"{name}: placeholders {left} are not float attributes of the op ({op.attrs})"
    assert gpu_lowering.gpu_body(make_op("add")) is None


def test_an_op_without_an_entry_gets_its_generic_kernel():
    s = Shape("float32", [4, 8])
    k = gpu_lowering.select_gpu_kernel(make_op("neg"), [s], s)
    assert (k.label, k.capturable) == ("generic", True)
    k = gpu_lowering.select_gpu_kernel(make_op("sigmoid"), [s], s)
    assert (k.label, k.capturable, k.launches) == ("elementwise sigmoid", True, 1)
    assert gpu_lowering.table_kernel(make_op("neg"), [s], s) is None


def test_the_table_is_the_lowering_passs_choice():
    """Lowering to gpu asks the table: a program of a table op and an op without an entry."""
    from mgx_graph import Program
    from mgx_graph.passes.lowering import Lowering

    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", Shape("float32", [2, 3]))
    y = m.add_instruction(make_op("sigmoid"), [x])
    z = m.add_instruction(make_op("neg"), [y])
    m.add_return([z])
    Lowering("gpu").apply(prog, None)
    assert [i.meta["kernel"].label for i in m.instructions if "kernel" in i.meta] == \
        ["elementwise sigmoid", "generic"]


def test_host_only_ops_are_not_run_on_the_device():
    assert not gpu_lowering.runs_on_gpu(make_op("unique"), [Shape("float32", [4])])
    assert gpu_lowering.runs_on_gpu(make_op("neg"), [Shape("float32", [4])])

