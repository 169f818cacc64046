"""Generated fused kernels on a GPU (skipped without one): each submodule of the host checks
(every op body, views and concat, every reduction) runs through one ``pointwise`` / ``fused_reduce``
instruction compiled for the gpu target (NVRTC / hipRTC) and for ref, and the results agree."""
import numpy as np
import pytest

from mgx_graph import Program
from mgx_graph.operators import make_op

pytestmark = pytest.mark.gpu


def _items():
    import test_fused_codegen as c

    items = [c._unary(n) for n in c.UNARY_FLOAT] + [c._unary(n, "float16") for n in ("exp", "tanh", "sigmoid")]
    items += [c._binary(n) for n in ("add", "sub", "mul", "div", "pow", "max", "min", "less", "prelu")]
    items += [c._binary(n, d) for d in ("int32", "int64", "uint8") for n in ("add", "div", "max", "bitwise_and")]
    items += [c._binary("mod", "int64", fmod=0), c._unary("gelu"), c._unary("convert", target_type="float16"),
              c._unary("isinf"), c._binary("logical_xor", "bool")]
    return [i for i in items + c._reduce_items() if all(s.standard() for s in i[2])]


def _program(item):
    """main(p0, p1, ...) -> the item's submodule run by one fused instruction."""
    label, sub, in_shapes, out_shape, kind, _ = item
    prog = Program()
    m = prog.get_main_module()
    params = [m.add_parameter(f"p{k}", s) for k, s in enumerate(in_shapes)]
    sub.name, sub.program = f"main:{'pointwise' if kind == 'pointwise' else 'fused_reduce'}0", prog
    prog.modules[sub.name] = sub
    attrs = {} if kind == "pointwise" else {"axes": [len(sub.get_output_shapes()[0].lens) - 1]}
    f = m.add_instruction(make_op("pointwise" if kind == "pointwise" else "fused_reduce", module=sub, **attrs),
                          params, [sub])
    outs = [f] if not isinstance(f.shape, tuple) else \
        [m.add_instruction(make_op("get_tuple_elem", index=k), [f]) for k in range(len(f.shape))]
    m.add_return(outs)
    return prog


def test_generated_kernels_match_ref(gpu_target, rng):
    from kernel_host import strided

    for item, again in zip(_items(), _items()):  # two copies: each compile takes its own submodule
        feeds = {f"p{k}": strided(s, rng)[1] for k, s in enumerate(item[2])}
        ref = _program(item).compile(target="ref").run(feeds)
        gpu = _program(again).compile(target=gpu_target)
        k = next(i for i in gpu.get_main_module().instructions if getattr(i.op, "fused", False)).meta["kernel"]
        assert k.label.startswith(("pointwise (generated", "reduce (generated")), (item[0], k.label)
        half = any(i.shape.dtype == "float16" for i in item[1].instructions if i.op.name != "@return")
        for got, want in zip(gpu.run(feeds), ref):
            if want.dtype.kind in "biu":
                np.testing.assert_array_equal(got, want, err_msg=item[0])
            else:
                tol = 4e-3 if half or want.dtype == np.float16 else 2e-5
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                           err_msg=item[0])
