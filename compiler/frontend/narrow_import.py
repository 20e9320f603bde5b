"""Narrow element types at import: bfloat16, float8, float4, int4/uint4/int2/uint2 tensors
become tensors of their bit codes (``compiler/frontend/narrow_types.py``), and every node that
touches one is checked to handle codes correctly.

``storage_model`` rewrites a checked model so that TVM's importer sees only storage types
(graph inputs / outputs / value_info typed uint8 or uint16, initializers and Constant
values holding the codes) and returns the ONNX element type of every narrow tensor, which
converters read from ``ctx.importer.elem_types``.  ``narrow_converter`` picks how a node is
converted: converters that know narrow types (``compiler/frontend/converters/narrow.py``) as they
are; ops that only move elements work on codes unchanged; a few float ops decode their
narrow float inputs to float32, compute, and encode the outputs back (exact where ONNX's
reference rounds each op's result once, as ml_dtypes does); anything else is refused.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..errors import UnsupportedError
from .narrow_types import decode, encode, fmt_of

_STORAGE_TYPE = {"uint8": TensorProto.UINT8, "uint16": TensorProto.UINT16}

# Ops that only move, copy or select elements: exact on codes, whatever the type.
MOVE_OPS = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
            "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand",
            "Tile", "Shape", "Size", "DepthToSpace", "SpaceToDepth", "Constant",
            "ConstantOfShape", "Where", "Compress", "ReverseSequence"}

# Ops computed on float32 values decoded from bfloat16 / float8 / float4 inputs, their
# float outputs encoded back once.  Exact where ONNX's reference selects or compares
# values, or computes the op in float32 and rounds its result once (numpy ufuncs and
# matmul on ml_dtypes arrays; Einsum promotes bfloat16 to float32).  Not here: ops whose
# reference rounds intermediate results to the narrow type (Softmax, Attention, Celu,
# Elu, ...) or whose float32 kernel is not correctly rounded (Exp): those are refused.
FLOAT_OPS = {"OneHot", "Neg", "Abs", "Relu", "Max", "Min", "Sign", "Add", "Sub", "Mul",
             "Div", "Sqrt", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
             "IsNaN", "IsInf", "ArgMax", "ArgMin", "MatMul", "Einsum", "Unique"}


def storage_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """(model with narrow tensors as code tensors, {tensor name: narrow Format}).

    Returns the model itself and ``{}`` when it has no narrow tensor.
    """
    types: dict = {}
    _collect(model.graph, types)
    if not types:
        return model, {}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _rewrite(out.graph)
    return out, types


def _collect(graph, types: dict) -> None:
    values = list(graph.input) + list(graph.output) + list(graph.value_info)
    for vi in values:
        if vi.type.HasField("tensor_type") and fmt_of(vi.type.tensor_type.elem_type):
            types[vi.name] = fmt_of(vi.type.tensor_type.elem_type)
    for t in graph.initializer:
        if fmt_of(t.data_type):
            types[t.name] = fmt_of(t.data_type)
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t") and fmt_of(a.t.data_type) and node.op_type == "Constant":
                types[node.output[0]] = fmt_of(a.t.data_type)
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _collect(g, types)


def _codes(t: TensorProto) -> TensorProto:
    """The tensor of ``t``'s codes, in its storage type."""
    fmt = fmt_of(t.data_type)
    arr = np.ascontiguousarray(numpy_helper.to_array(t)).view(np.dtype(fmt.storage))
    return numpy_helper.from_array(arr, t.name)


def _rewrite(graph) -> None:
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and fmt_of(tt.elem_type):
            tt.elem_type = _STORAGE_TYPE[fmt_of(tt.elem_type).storage]
    for t in graph.initializer:
        if fmt_of(t.data_type):
            t.CopyFrom(_codes(t))
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t") and fmt_of(a.t.data_type):
                a.t.CopyFrom(_codes(a.t))
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _rewrite(g)


def io_types(model: onnx.ModelProto) -> dict:
    """{graph input / output name: narrow Format} (what the manifest records)."""
    out = {}
    for vi in list(model.graph.input) + list(model.graph.output):
        fmt = fmt_of(vi.type.tensor_type.elem_type) if vi.type.HasField("tensor_type") else None
        if fmt:
            out[vi.name] = fmt
    return out


def narrow_converter(entry, node, types: dict, label: str):
    """The converter to call for ``node`` (see the module docstring), or UnsupportedError."""
    if not types:
        return entry.converter
    ins = {n: types[n] for n in node.input if n in types}
    outs = {n: types[n] for n in node.output if n in types}
    if not ins and not outs:
        return entry.converter
    if getattr(entry.converter, "handles_narrow", False) or node.op_type in MOVE_OPS:
        return entry.converter
    kinds = sorted({f.name for f in list(ins.values()) + list(outs.values())})
    if node.op_type in FLOAT_OPS and all(
            f.is_float for f in list(ins.values()) + list(outs.values())):
        return _on_float32(entry.converter, node, types)
    raise UnsupportedError(f"{label}: {node.op_type} on {', '.join(kinds)} tensors is not "
                           "supported (narrow element types are supported by Cast, CastLike, "
                           "QuantizeLinear, DequantizeLinear, ops that only move elements, "
                           f"and on float formats {', '.join(sorted(FLOAT_OPS))}); cast the "
                           "tensor to float first")


def _on_float32(converter, node, types: dict):
    """``converter`` run on float32 values: narrow inputs decoded, narrow outputs encoded."""

    def convert(bb, inputs, attrs, ctx):
        from tvm import relax
        from tvm.ir.expr import GenericConst

        inputs = type(inputs)(inputs)
        for k, name in enumerate(node.input):
            if name in types and isinstance(inputs[k], GenericConst):
                inputs[k] = _decode_constant(inputs[k], types[name])
            elif name in types and inputs[k] is not None:
                inputs[k] = decode(bb, inputs[k], types[name])
        out = converter(bb, inputs, attrs, ctx)
        if not any(n in types for n in node.output):
            return out
        out = bb.normalize(out)
        if isinstance(out, relax.Tuple):
            items = list(out.fields)
        elif isinstance(out.ty, relax.TupleType):
            items = [relax.TupleGetItem(out, i) for i in range(len(out.ty.fields))]
        else:
            items = [out]
        for k, name in enumerate(node.output[:len(items)]):
            if name in types:
                x = bb.normalize(items[k])
                if str(x.ty.dtype) != "float32":
                    x = bb.emit(relax.op.astype(x, "float32"))
                items[k] = encode(bb, x, types[name])
        return items[0] if len(items) == 1 else relax.Tuple(items)

    return convert


def _decode_constant(c, fmt):
    """A float32 constant of the values of constant codes (converters such as OneHot's read
    their constant inputs' values at import; folded here as compile-time constants)."""
    import ml_dtypes
    from tvm import relax

    codes = c.value.numpy()
    return relax.const(codes.view(getattr(ml_dtypes, fmt.ml_dtype)).astype(np.float32),
                       "float32")
