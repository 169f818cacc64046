"""Checks of an ai.onnx node against the ONNX operator schema of the model's opset, before its parser
runs: an input or output count outside the schema's range, a required (single) input given as '', an
attribute the schema does not define, one of another type, and a required one that is missing raise
ParseError naming the node, the op type and the input or attribute (onnxruntime refuses these models
when it loads them)."""
from __future__ import annotations

import onnx

_TYPE_NAMES = {v: k for k, v in onnx.AttributeProto.AttributeType.items()}


def _schema(op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _check_arity(p, node, schema) -> None:
    n_in, n_out = len(node.input), len(node.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise p.err(f"{n_in} inputs: expected {schema.min_input}..{schema.max_input} for {node.op_type} at opset "
                    f"{p.opset}")
    if not schema.min_output <= n_out <= schema.max_output:
        raise p.err(f"{n_out} outputs: expected {schema.min_output}..{schema.max_output} for {node.op_type} at "
                    f"opset {p.opset}")
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for name, formal in zip(node.input, schema.inputs):
        if name == "" and formal.option == single:
            raise p.err(f"input '{formal.name}' is required but given as ''")


def check_attributes(p, node) -> None:
    """ParseError (``p.err``) unless ``node``'s attributes fit the schema of its op at ``p.opset``; nodes
    of other domains, and op types the opset does not define, are left to their parsers."""
    if (node.domain or "") not in ("", "ai.onnx"):
        return
    schema = _schema(node.op_type, p.opset)
    if schema is None:
        return
    _check_arity(p, node, schema)
    defined = schema.attributes
    for a in node.attribute:
        if a.ref_attr_name:
            continue
        want = defined.get(a.name)
        if want is None:
            raise p.err(f"attribute '{a.name}' is not an attribute of {node.op_type} at opset {p.opset} (it has "
                        f"{', '.join(sorted(defined)) or 'none'})")
        if a.type and int(a.type) != int(want.type):
            raise p.err(f"attribute '{a.name}' is {_TYPE_NAMES.get(a.type, a.type)}: expected "
                        f"{_TYPE_NAMES.get(int(want.type), want.type)}")
    given = {a.name for a in node.attribute}
    for name, spec in defined.items():
        if spec.required and name not in given:
            raise p.err(f"required attribute '{name}' is missing")


