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
from .registry import register_op, tvm_converter


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
    """Dropout where it is deterministic: inference (training_mode false) or a ratio of 0
    give output = input and mask = all true (bool).  Training with a ratio > 0 draws
    random numbers and is refused.  training_mode and ratio given as inputs must be
    constants (the session binds them as values when they are graph inputs)."""
    node = ctx.node
    training = bool(attrs.get("training_mode", 0)) if "training_mode" in attrs else False
    if len(inputs) > 2 and inputs[2] is not None:
        value = _const_input(inputs[2], "training_mode", node)
        training = bool(np.asarray(value).item())
    if training:
        ratio = 0.5
        if len(inputs) > 1 and inputs[1] is not None:
            ratio = float(np.asarray(_const_input(inputs[1], "ratio", node)).item())
        if ratio != 0:
            raise UnsupportedError(f"node {node.name!r} (Dropout): training_mode=True with "
                                   f"ratio={ratio} is not supported (random dropout; onnxc "
                                   "compiles inference)")
    x = inputs[0]
    if len(node.output) > 1 and node.output[1]:
        return relax.Tuple([x, relax.op.ones_like(x, dtype="bool")])
    return x


@_register("BatchNormalization")
def batch_norm(bb, inputs, attrs, ctx):
    """BatchNormalization: inference is TVM's; training_mode=1 (opset 14+) normalizes with
    the batch statistics and returns the running mean and variance updated with
    ``momentum``, as the reference computes them (population variance)."""
    if not attrs.get("training_mode", 0):
        return tvm_converter("BatchNormalization")(bb, inputs, attrs, ctx)
    x, scale, bias, mean, var = inputs[:5]
    ndim = x.ty.ndim
    axes = [0] + list(range(2, ndim))
    dtype = str(x.ty.dtype)
    eps = relax.const(np.array(attrs.get("epsilon", 1e-5), dtype), dtype)
    momentum = float(attrs.get("momentum", 0.9))

    def per_channel(t):
        return relax.op.reshape(t, [1, -1] + [1] * (ndim - 2))

    batch_mean = bb.emit(relax.op.mean(x, axis=axes))
    centered = bb.emit(relax.op.subtract(x, per_channel(batch_mean)))
    batch_var = bb.emit(relax.op.mean(relax.op.multiply(centered, centered), axis=axes))
    y = relax.op.divide(relax.op.multiply(per_channel(scale), centered),
                        relax.op.sqrt(relax.op.add(per_channel(batch_var), eps)))
    y = bb.emit(relax.op.add(y, per_channel(bias)))
    m = relax.const(np.array(momentum, dtype), dtype)
    m1 = relax.const(np.array(1 - momentum, dtype), dtype)
    running_mean = relax.op.add(relax.op.multiply(mean, m), relax.op.multiply(batch_mean, m1))
    running_var = relax.op.add(relax.op.multiply(var, m), relax.op.multiply(batch_var, m1))
    outs = [y, bb.emit(running_mean), bb.emit(running_var)][:max(len(ctx.node.output), 1)]
    return outs[0] if len(outs) == 1 else relax.Tuple(outs)


@_register("Clip")
def clip(bb, inputs, attrs, ctx):
    """Clip as maximum/minimum ops (TVM's converter emits opaque kernels, which the layout
    pass cannot see through: MobileNet's Relu6 then cost two layout transforms each).
    Bounds from attributes (opset < 11) or inputs (constant or not); absent = unbounded."""
    x = inputs[0]
    if ctx.opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
        lo = None if lo is None else relax.const(float(lo), x.ty.dtype)
        hi = None if hi is None else relax.const(float(hi), x.ty.dtype)
    else:
        lo = inputs[1] if len(inputs) > 1 else None
        hi = inputs[2] if len(inputs) > 2 else None
    if lo is not None:
        x = bb.normalize(relax.op.maximum(x, lo))
    if hi is not None:
        x = relax.op.minimum(x, hi)
    return x


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


@_register("ConvTranspose")
def conv_transpose(bb, inputs, attrs, ctx):
    """ConvTranspose with the output_shape attribute (TVM ignores it), as the reference:
    pads from output_shape under auto_pad SAME_UPPER/SAME_LOWER, else the pads given (0 by
    default); output pixel o reads the unpadded full result at o + pad_begin, zero where
    that falls outside it; the bias is added everywhere.  Without output_shape: TVM's."""
    if "output_shape" not in attrs:
        return tvm_converter("ConvTranspose")(bb, inputs, attrs, ctx)
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    dims = _static_dims_of(x, ctx)
    k = len(dims) - 2
    out_shape = [int(v) for v in attrs["output_shape"]][-k:]
    strides = [int(v) for v in attrs.get("strides", [1] * k)]
    dilations = [int(v) for v in attrs.get("dilations", [1] * k)]
    kernel = [int(v) for v in attrs.get("kernel_shape", _static_dims_of(w, ctx)[2:])]
    out_pad = [int(v) for v in attrs.get("output_padding", [0] * k)]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if "pads" in attrs or auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        begin = [int(v) for v in attrs.get("pads", [0] * 2 * k)][:k]
    else:
        total = [s * (n - 1) + op + (kk - 1) * d + 1 - o for s, n, op, kk, d, o in
                 zip(strides, dims[2:], out_pad, kernel, dilations, out_shape)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    full_attrs = {a: v for a, v in attrs.items()
                  if a not in ("output_shape", "pads", "output_padding", "auto_pad")}
    full = bb.normalize(tvm_converter("ConvTranspose")(bb, [x, w, None], full_attrs, ctx))
    full_dims = _static_dims_of(full, ctx)[2:]
    lo = [max(b, 0) for b in begin]
    hi = [min(b + o, f) for b, o, f in zip(begin, out_shape, full_dims)]
    if any(h <= l for l, h in zip(lo, hi)):
        raise UnsupportedError(f"node {ctx.node.name!r} (ConvTranspose): output_shape "
                               f"{out_shape} with pads {begin} leaves no computed pixel")
    y = relax.op.strided_slice(full, axes=list(range(2, 2 + k)), begin=lo, end=hi)
    before = [max(-b, 0) for b in begin]
    after = [o - p - (h - l) for o, p, l, h in zip(out_shape, before, lo, hi)]
    if any(before) or any(after):
        y = relax.op.nn.pad(bb.normalize(y), [0, 0, 0, 0] + [v for pa in zip(before, after)
                                                            for v in pa])
    if bias is not None:
        y = relax.op.add(bb.normalize(y), relax.op.reshape(bias, [1, -1] + [1] * k))
    return y
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


# The value of a reduction over no elements, as ONNX's reference gives it (per dtype kind).
def _empty_identity(op: str, dtype: np.dtype):
    kind = "bool" if dtype == np.bool_ else "int" if np.issubdtype(dtype, np.integer) else "float"
    if op in ("ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare"):
        return 0
    if op == "ReduceProd":
        return 1
    if op == "ReduceMax":
        return {"bool": False, "int": np.iinfo(dtype).min if kind == "int" else 0,
                "float": -np.inf}[kind]
    if op == "ReduceMin":
        return {"bool": True, "int": np.iinfo(dtype).max if kind == "int" else 0,
                "float": np.inf}[kind]
    if kind != "float":
        return None  # log / mean of no integers: no value in the type
    return np.nan if op == "ReduceMean" else -np.inf  # mean of nothing; log(0)


def _reduce_axes(inputs, attrs, ctx, ndim):
    """The reduced axes (a sorted list; [] means none, the noop), as the reference reads
    them: the attribute (older opsets) or the constant second input; none given reduces all
    unless noop_with_empty_axes."""
    axes = attrs.get("axes")
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        axes = _static_value(inputs[1])
        if axes is None:
            raise UnsupportedError(f"node {ctx.node.name!r} ({ctx.node.op_type}): axes must "
                                   "be a constant (an initializer) for onnxc")
    axes = [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    if not axes:
        return [] if attrs.get("noop_with_empty_axes", 0) else list(range(ndim))
    return sorted({a + ndim if a < 0 else a for a in axes})


def _reduce_with_identity(op):
    @_register(op)
    def convert(bb, inputs, attrs, ctx):
        x = inputs[0]
        dtype = str(x.ty.dtype)
        shape = getattr(x.ty, "shape", None)
        values = getattr(shape, "values", None) or []
        if any(getattr(v, "value", 1) == 0 for v in values):
            dims = [int(v) for v in values]
            axes = _reduce_axes(inputs, attrs, ctx, len(dims))
            if not axes:
                return x  # noop_with_empty_axes
            keep = bool(attrs.get("keepdims", 1))
            out = [1 if i in axes else d for i, d in enumerate(dims) if keep or i not in axes]
            ident = _empty_identity(op, np.dtype(dtype))
            if ident is None:
                raise UnsupportedError(f"node {ctx.node.name!r} ({op}): reducing an empty "
                                       f"{dtype} tensor (shape {dims}) has no value")
            return tensor_const(np.full(out, ident, dtype=dtype))
        if dtype == "bool" and op in ("ReduceMax", "ReduceMin"):
            # any / all: TVM has no min/max value for bool; uint8 0/1 reduces the same
            as_u8 = bb.normalize(relax.op.astype(x, "uint8"))
            out = tvm_converter(op)(bb, [as_u8] + list(inputs[1:]), attrs, ctx)
            return relax.op.astype(bb.normalize(out), "bool")
        return tvm_converter(op)(bb, inputs, attrs, ctx)

    convert.__doc__ = (f"{op} (TVM's); over an empty input the constant ONNX's reference "
                       "gives (TVM returns the wrong identity)"
                       + ("; bool inputs as uint8" if op in ("ReduceMax", "ReduceMin") else ""))
    return convert


for _op in ("ReduceMin", "ReduceMax", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1",
            "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"):
    _reduce_with_identity(_op)

_refuse_attr("Resize", "antialias", lambda v: bool(v), since=10)


@_register("Split", since=1)
def split(bb, inputs, attrs, ctx):
    """Split with some parts of size 0 (TVM's ``split`` wants strictly increasing indices):
    each part is a slice, an empty one a constant of its (empty) shape.  Else TVM's."""
    x = inputs[0]
    sizes = attrs.get("split")
    if ctx.opset >= 13 and len(inputs) > 1 and inputs[1] is not None:
        sizes = _static_value(inputs[1])
    if sizes is None or 0 not in [int(s) for s in np.asarray(sizes).reshape(-1)]:
        return tvm_converter("Split")(bb, inputs, attrs, ctx)
    sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
    dims = _static_dims_of(x, ctx)
    axis = int(attrs.get("axis", 0))
    axis = axis + len(dims) if axis < 0 else axis
    if sum(sizes) != dims[axis]:
        raise UnsupportedError(f"node {ctx.node.name!r} (Split): split sizes {sizes} do not "
                               f"add up to the length {dims[axis]} of axis {axis}")
    parts, start = [], 0
    for n in sizes:
        if n == 0:
            shape = dims[:axis] + [0] + dims[axis + 1:]
            parts.append(tensor_const(np.zeros(shape, dtype=str(x.ty.dtype))))
        else:
            parts.append(relax.op.strided_slice(x, axes=[axis], begin=[start], end=[start + n]))
        start += n
    return relax.Tuple(parts)


@_register("Mod", since=10)
def mod(bb, inputs, attrs, ctx):
    """Mod; floats with fmod=0 as numpy's ``np.mod`` (the reference) computes it from C's
    fmod: r = fmod(a, b); r += b where r is non-zero and of the other sign than b; a zero
    r takes b's sign.  TVM's ``a - floor(a / b) * b`` gives NaN for a finite ``a`` and an
    infinite ``b`` (numpy: ``mod(-3, inf) = inf``, ``mod(3, inf) = 3``).  Else TVM's."""
    a, b = inputs
    dtype = str(a.ty.dtype)
    if attrs.get("fmod", 0) or not dtype.startswith("float") or str(b.ty.dtype) != dtype:
        return tvm_converter("Mod")(bb, inputs, attrs, ctx)
    zero = relax.const(np.array(0, dtype), dtype)
    r = bb.normalize(relax.op.mod(a, b))  # C fmod for floats
    other_sign = relax.op.logical_xor(relax.op.less(b, zero), relax.op.less(r, zero))
    fix = relax.op.logical_and(relax.op.not_equal(r, zero), other_sign)
    r = bb.normalize(relax.op.where(fix, relax.op.add(r, b), r))
    neg_zero = relax.const(np.array(-0.0, dtype), dtype)
    signed_zero = relax.op.where(relax.op.less(b, zero), neg_zero, zero)
    return relax.op.where(relax.op.equal(r, zero), signed_zero, r)


@_register("Pow", since=7)
def pow_(bb, inputs, attrs, ctx):
    """Pow with a base and an exponent of different types (opset 12+ allows it): the
    result has the base's type.  As the reference (``np.power(a, b).astype(a.dtype)``),
    both are widened (float64, or int64 for two integer types), raised, and cast back
    (truncating toward zero for an integer base).  Same types: TVM's."""
    a, b = inputs
    at, bt = str(a.ty.dtype), str(b.ty.dtype)
    if at == bt:
        return tvm_converter("Pow")(bb, inputs, attrs, ctx)
    wide = "int64" if not (at.startswith("float") or bt.startswith("float")) else "float64"
    out = relax.op.power(relax.op.astype(a, wide), relax.op.astype(b, wide))
    return relax.op.astype(bb.normalize(out), at)


# --- Real exports: shape arithmetic of PyTorch's TorchScript exporter (HuggingFace models) --
#
# Exported attention masks and position ids are computed from Shape/Gather/Unsqueeze/Concat/
# Equal/Where/Range/ConstantOfShape/Expand.  Once input shapes are fixed all of it is known
# at compile time, but TVM 0.27's converters take wrong or dynamic paths on it: the
# converters below evaluate these ops with numpy when every input is known (a constant, a
# static shape value, or a constant scalar) and otherwise delegate to TVM's converter.

# Results up to this many elements are computed at import; larger ones stay Relax ops.
_FOLD_MAX_ELEMENTS = 1 << 16


def _static_value(x):
    """The numpy value of an input known at compile time, or None.

    A Relax constant, a shape value whose dims are all static (int64, as ONNX's Shape
    gives), or a constant scalar (TVM's Gather of a shape value returns an ``IntImm``)."""
    from tvm import tirx
    from tvm.ir.expr import GenericConst

    if isinstance(x, GenericConst):
        return x.value.numpy()
    if isinstance(x, relax.ShapeExpr):
        if all(isinstance(v, tirx.IntImm) for v in x.values):
            return np.array([int(v.value) for v in x.values], np.int64)
        return None
    if isinstance(x, (tirx.IntImm, tirx.FloatImm)):
        return np.array(x.value, dtype=str(x.ty))
    return None


def _static_inputs(inputs):
    """numpy values of all (non-omitted) inputs, or None if any is not known."""
    values = [None if x is None else _static_value(x) for x in inputs]
    if any(v is None for x, v in zip(inputs, values) if x is not None):
        return None
    return values


def _fold_result(arr: np.ndarray):
    arr = np.asarray(arr)
    return tensor_const(arr) if arr.size <= _FOLD_MAX_ELEMENTS else None


@_register("Equal", since=7)
def equal(bb, inputs, attrs, ctx):
    """Equal computed at import when both inputs are known.  TVM 0.27 compares a shape
    value with a constant by ``structural_equal`` of an int64 ``IntImm`` against a Python
    int, which is never equal: ``Equal(Shape-derived [1, -1, 5, 5], -1)`` gave all False, so
    the exporter's ``Where(Equal(shape, -1), 1, shape)`` kept the -1 and the following
    Expand failed ("Cannot use and / or / not operator to Expr").  It also did not
    broadcast."""
    values = _static_inputs(inputs)
    if values is not None:
        out = _fold_result(np.equal(values[0], values[1]))
        if out is not None:
            return out
    return tvm_converter("Equal")(bb, inputs, attrs, ctx)


@_register("Where", since=9)
def where(bb, inputs, attrs, ctx):
    """Where computed at import when all inputs are known; else TVM's.  TVM 0.27 folds only
    all-constant or all-1-D-shape inputs, and hands a constant scalar from shape arithmetic
    (an ``IntImm``, e.g. ``Where(cond, seq_len, x)``) to ``relax.op.where``, which refuses
    it ("Operator relax.where ... x1: Tensor")."""
    values = _static_inputs(inputs)
    if values is not None:
        cond, x, y = values
        out = _fold_result(np.where(cond.astype(bool), x, y).astype(np.result_type(x, y)))
        if out is not None:
            return out
    return tvm_converter("Where")(bb, inputs, attrs, ctx)


@_register("Range", since=11)
def range_(bb, inputs, attrs, ctx):
    """Range computed at import when start/limit/delta are known.  TVM 0.27 treats a
    constant scalar that comes from shape arithmetic (an ``IntImm``, e.g. the sequence length
    from Shape -> Gather) as dynamic and emits a symbolic-length ``arange`` with
    ``tensor_to_shape``, which the graph runtime cannot run."""
    values = _static_inputs(inputs)
    if values is not None:
        start, limit, delta = (np.asarray(v).reshape(()) for v in values)
        dtype = np.asarray(values[0]).dtype
        if delta == 0:
            raise UnsupportedError(f"node {ctx.node.name!r} (Range): delta is 0")
        # ONNX: max(ceil((limit - start) / delta), 0) elements start + i * delta
        count = max(int(np.ceil((np.float64(limit) - np.float64(start)) / np.float64(delta))), 0)
        out = _fold_result((start + np.arange(count, dtype=dtype) * delta).astype(dtype))
        if out is not None:
            return out
    return tvm_converter("Range")(bb, inputs, attrs, ctx)


@_register("ConstantOfShape", since=9)
def constant_of_shape(bb, inputs, attrs, ctx):
    """ConstantOfShape for every output rank.  TVM 0.27 broadcasts the 1-element ``value``
    tensor (rank 1) to the target shape, which fails for a rank-0 target (``shape`` = [],
    written by PyTorch's exporter for scalar fills in mask code): "broadcast_to expects the
    input shape to have the number of ndim at least as the input tensor's"."""
    value = attrs.get("value")
    arr = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    scalar = np.asarray(arr).reshape(-1)[0]
    dims = _static_value(inputs[0])
    if dims is not None:
        dims = [int(d) for d in np.asarray(dims).reshape(-1)]
        if any(d < 0 for d in dims):
            raise UnsupportedError(f"node {ctx.node.name!r} (ConstantOfShape): negative "
                                   f"dimension in shape {dims}")
        if int(np.prod(dims)) <= _FOLD_MAX_ELEMENTS:
            return tensor_const(np.full(dims, scalar, dtype=arr.dtype))
        return relax.op.broadcast_to(tensor_const(np.array(scalar, dtype=arr.dtype)), dims)
    shape = inputs[0]
    if not isinstance(shape, relax.ShapeExpr):
        shape = relax.op.tensor_to_shape(shape)
    return relax.op.broadcast_to(tensor_const(np.array(scalar, dtype=arr.dtype)), shape)


@_register("Expand", since=8)
def expand(bb, inputs, attrs, ctx):
    """Expand with ONNX's bidirectional broadcasting when the target shape is known: the
    output shape is numpy's broadcast of the input's shape and ``shape`` (computed at import
    when the input is known too).  TVM 0.27 gives -1 a meaning ONNX does not and keeps an
    input dim where ``shape`` says 1 only on some paths; a shape it cannot read as constant
    takes a dynamic path (``vm.builtin.tensor_to_shape``) the graph runtime cannot run."""
    data, shape = inputs[0], inputs[1]
    target = _static_value(shape)
    if target is None:
        return tvm_converter("Expand")(bb, inputs, attrs, ctx)
    target = [int(d) for d in np.asarray(target).reshape(-1)]
    value = _static_value(data)
    data_shape = list(value.shape) if value is not None else [
        int(d) for d in _static_dims_of(data, ctx)]
    try:
        out_shape = list(np.broadcast_shapes(tuple(data_shape), tuple(target)))
    except ValueError:
        raise UnsupportedError(f"node {ctx.node.name!r} (Expand): cannot broadcast input shape "
                               f"{data_shape} to {target}") from None
    if value is not None:
        out = _fold_result(np.broadcast_to(value, out_shape).copy())
        if out is not None:
            return out
    # A same-shape broadcast_to too (as TVM's converter does), not ``data`` itself: the
    # importer would bind the alias ``n_k = n_j``, across which FuseOps does not fuse.
    return relax.op.broadcast_to(data, out_shape)


def _static_dims_of(x, ctx):
    from tvm import tirx

    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        raise UnsupportedError(f"node {ctx.node.name!r} ({ctx.node.op_type}): input shape "
                               "is not known at compile time")
    return [int(v.value) for v in values]
