"""onnxc's own converters for default-domain ops, registered over TVM's.

Each one exists because TVM 0.27's converter is wrong or silent for part of the op's
contract (found by scripts/onnx_conformance.py): it either implements that part or
refuses it with a clear error, and delegates the rest to TVM's converter.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from tvm import relax

from .errors import UnsupportedError
from .registry import REGISTRY, register_op, tvm_converter


def tensor_const(arr: np.ndarray):
    """A Relax constant of exactly ``arr``'s dtype (``relax.const`` alone turns int64
    arrays into int32)."""
    return relax.const(arr, str(arr.dtype))


def _const_input(x, what: str, node):
    """The numpy value of a constant input, or refuse naming the node."""
    if x is None:
        return None
    if hasattr(x, "value") and hasattr(x.value, "numpy"):
        return x.value.numpy()
    raise UnsupportedError(f"node {node.name!r} ({node.op_type}): {what} must be a constant "
                           "(an initializer) for onnxc")


def _register(op, since=1):
    return register_op("", op, since=since, implementation="onnxc")


@_register("Constant")
def constant(bb, inputs, attrs, ctx):
    """Constant from value / value_float(s) / value_int(s); strings and sparse refused."""
    node = ctx.node
    for a in node.attribute:
        if a.name == "value":
            if a.t.data_type == 8:  # STRING
                raise UnsupportedError(f"node {node.name!r} (Constant): string tensors are "
                                       "not supported")
            return tensor_const(numpy_helper.to_array(a.t))
        if a.name == "value_float":
            return tensor_const(np.array(a.f, np.float32))
        if a.name == "value_floats":
            return tensor_const(np.array(list(a.floats), np.float32))
        if a.name == "value_int":
            return tensor_const(np.array(a.i, np.int64))
        if a.name == "value_ints":
            return tensor_const(np.array(list(a.ints), np.int64))
    kinds = ", ".join(a.name for a in node.attribute) or "none"
    raise UnsupportedError(f"node {node.name!r} (Constant): value attribute {kinds} is not "
                           "supported (tensor, float(s) and int(s) are)")


@_register("Dropout")
def dropout(bb, inputs, attrs, ctx):
    """Inference Dropout: output = input, mask = all true (bool); training mode refused."""
    node = ctx.node
    training = bool(attrs.get("training_mode", 0)) if "training_mode" in attrs else False
    if len(inputs) > 2 and inputs[2] is not None:
        value = _const_input(inputs[2], "training_mode", node)
        training = bool(np.asarray(value).item())
    if training:
        raise UnsupportedError(f"node {node.name!r} (Dropout): training_mode=True is not "
                               "supported (onnxc compiles inference)")
    x = inputs[0]
    if len(node.output) > 1 and node.output[1]:
        return relax.Tuple([x, relax.op.ones_like(x, dtype="bool")])
    return x


@_register("BatchNormalization")
def batch_norm(bb, inputs, attrs, ctx):
    """Inference BatchNormalization (TVM's); training_mode=1 refused."""
    if attrs.get("training_mode", 0):
        raise UnsupportedError(f"node {ctx.node.name!r} (BatchNormalization): training_mode=1 "
                               "is not supported (onnxc compiles inference)")
    return tvm_converter("BatchNormalization")(bb, inputs, attrs, ctx)


@_register("IsInf")
def is_inf(bb, inputs, attrs, ctx):
    """IsInf honouring detect_positive / detect_negative."""
    x = inputs[0]
    pos, neg = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    inf = relax.op.isinf(x)
    zero = relax.const(0, x.ty.dtype)
    if pos and neg:
        return inf
    if pos:
        return relax.op.logical_and(inf, relax.op.greater(x, zero))
    if neg:
        return relax.op.logical_and(inf, relax.op.less(x, zero))
    return relax.op.zeros_like(x, dtype="bool")


@_register("LayerNormalization", since=17)
def layer_norm(bb, inputs, attrs, ctx):
    """LayerNormalization; the optional Mean and InvStdDev outputs computed too."""
    y = tvm_converter("LayerNormalization")(bb, inputs, attrs, ctx)
    if isinstance(y, relax.Tuple):
        y = y.fields[0]
    outputs = [o for o in ctx.node.output]
    if len(outputs) <= 1 or not any(outputs[1:]):
        return y
    x = inputs[0]
    ndim = x.ty.ndim
    axis = int(attrs.get("axis", -1))
    axis = axis + ndim if axis < 0 else axis
    axes = list(range(axis, ndim))
    eps = float(attrs.get("epsilon", 1e-5))
    stash = int(attrs.get("stash_type", 1))
    xs = relax.op.astype(x, "float32") if stash == 1 and x.ty.dtype != "float32" else x
    mean = bb.emit(relax.op.mean(xs, axis=axes, keepdims=True))
    centered = bb.emit(relax.op.subtract(xs, mean))
    var = relax.op.mean(relax.op.multiply(centered, centered), axis=axes, keepdims=True)
    inv = relax.op.rsqrt(relax.op.add(var, relax.const(eps, xs.ty.dtype)))
    return relax.Tuple([y, mean, bb.emit(inv)])


def _refuse_attr(op, attr, why, since=1):
    """Refuse ``op`` when attribute ``attr`` is set (TVM ignores it), else delegate."""

    @_register(op, since)
    def convert(bb, inputs, attrs, ctx):
        if attr in attrs and why(attrs[attr]):
            raise UnsupportedError(f"node {ctx.node.name!r} ({op}): attribute {attr}="
                                   f"{attrs[attr]!r} is not supported")
        return tvm_converter(op)(bb, inputs, attrs, ctx)

    convert.__doc__ = f"{op} (TVM's), refusing {attr} which TVM ignores"
    return convert


_refuse_attr("ConvTranspose", "output_shape", lambda v: True)
_refuse_attr("RoiAlign", "mode", lambda v: (v.decode() if isinstance(v, bytes) else v) != "avg",
             since=10)



@_register("BitShift", since=11)
def bit_shift(bb, inputs, attrs, ctx):
    """BitShift with ONNX's edge cases: a shift < 0 or >= the bit width gives 0 (LEFT) or
    the sign fill (RIGHT), where C (and TVM) leave it undefined."""
    x, s = inputs
    dtype = x.ty.dtype
    bits = np.dtype(str(dtype)).itemsize * 8
    direction = attrs.get("direction", b"LEFT")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    zero, limit = relax.const(0, dtype), relax.const(bits - 1, dtype)
    safe = relax.op.minimum(relax.op.maximum(s, zero), limit)
    if direction == "LEFT":
        shifted, fill = relax.op.left_shift(x, safe), relax.op.zeros_like(x)
    else:
        shifted = relax.op.right_shift(x, safe)
        signed = np.issubdtype(np.dtype(str(dtype)), np.signedinteger)
        fill = relax.op.right_shift(x, limit) if signed else relax.op.zeros_like(x)
    out_of_range = relax.op.logical_or(relax.op.greater(s, limit), relax.op.less(s, zero))
    return relax.op.where(out_of_range, fill, shifted)


@_register("SpaceToDepth", since=1)
def space_to_depth(bb, inputs, attrs, ctx):
    """SpaceToDepth in DCR and CRD modes."""
    x = inputs[0]
    b = int(attrs["blocksize"])
    n, c, h, w = [int(d) for d in x.ty.shape.values]
    if h % b or w % b:
        raise UnsupportedError(f"node {ctx.node.name!r} (SpaceToDepth): {h}x{w} is not a "
                               f"multiple of blocksize {b}")
    mode = attrs.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    t = relax.op.reshape(x, [n, c, h // b, b, w // b, b])
    # DCR: channel = (row offset * b + column offset) * C + c; CRD: c * b*b + offsets
    t = relax.op.permute_dims(t, [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
    return relax.op.reshape(t, [n, c * b * b, h // b, w // b])


def _refuse_empty_reduce(op):
    @_register(op)
    def convert(bb, inputs, attrs, ctx):
        shape = getattr(inputs[0].ty, "shape", None)
        values = getattr(shape, "values", None) or []
        if any(getattr(v, "value", 1) == 0 for v in values):
            raise UnsupportedError(f"node {ctx.node.name!r} ({op}): reducing an empty tensor "
                                   f"(shape {[int(v) for v in values]}) is not supported")
        return tvm_converter(op)(bb, inputs, attrs, ctx)

    convert.__doc__ = f"{op} (TVM's), refusing empty inputs (TVM returns the wrong identity)"
    return convert


for _op in ("ReduceMin", "ReduceMax", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1",
            "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"):
    _refuse_empty_reduce(_op)

_refuse_attr("Resize", "antialias", lambda v: bool(v), since=10)
