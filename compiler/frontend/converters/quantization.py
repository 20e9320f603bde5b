"""onnxc's converters for integer / quantized ops TVM 0.27 lacks: QLinearMatMul, QLinearConv,
ConvInteger, and BitCast; DynamicQuantizeLinear over TVM's (its min / max over the whole
tensor in two stages).

The integer products are exact (int32 accumulation after subtracting the zero points, as
ONNX's reference); requantization multiplies by ``a_scale * b_scale / y_scale`` computed in
the scales' own type (rounded as the reference rounds it) and then in float64, rounds half
to even and saturates to the output type.
"""

from __future__ import annotations

import numpy as np
from onnx import helper
from tvm import relax

from .common import constant_value, register, refuse, static_shape, dtype_of
from ..registry import tvm_converter




_INT8 = ("int8", "uint8")


def eight_bit(ctx, *named):
    """Refuse, naming the node, any (tensor, name) pair whose tensor is not int8 / uint8."""
    for t, what in named:
        if dtype_of(t) not in _INT8:
            refuse(ctx, f"input {what} of type {dtype_of(t)}")


def per_tensor(ctx, *named):
    """Refuse any (scale or zero point, name) pair given with more than one element."""
    for v, what in named:
        if v is not None:
            _scalarize(v, ctx, what)


def _minus_zero_point(bb, x, zp, ctx, what, axis_shape=None):
    """int32(x) - int32(zp); zp a scalar / size-1 tensor, or per-channel reshaped to
    ``axis_shape`` (broadcastable against x)."""
    x32 = relax.op.astype(x, "int32")
    if zp is None:
        return bb.emit(x32)
    n = int(np.prod(static_shape(zp), dtype=np.int64))
    z = relax.op.astype(zp, "int32")
    if n == 1:
        z = relax.op.reshape(z, [])
    elif axis_shape is not None:
        z = relax.op.reshape(z, axis_shape)
    else:
        refuse(ctx, f"{what} of shape {static_shape(zp)} (per-tensor only)")
    return bb.emit(relax.op.subtract(x32, z))


def _requantize(bb, acc, scale, zp, out_dtype):
    """saturate(round_half_even(float64(acc) * scale + zp)) as ``out_dtype``."""
    y = relax.op.multiply(relax.op.astype(acc, "float64"), relax.op.astype(scale, "float64"))
    if zp is not None:
        y = relax.op.add(y, relax.op.astype(zp, "float64"))
    info = np.iinfo(out_dtype)
    y = relax.op.clip(relax.op.round(y), int(info.min), int(info.max))
    return relax.op.astype(y, out_dtype)


def _scalarize(x, ctx, what):
    n = int(np.prod(static_shape(x), dtype=np.int64))
    if n != 1:
        refuse(ctx, f"{what} of shape {static_shape(x)} (per-tensor only)")
    return relax.op.reshape(x, [])


@register("QLinearMatMul", since=10)
def qlinear_matmul(bb, inputs, attrs, ctx):
    """QLinearMatMul with per-tensor scales and zero points (int8 / uint8), exact; or a
    constant 2-D ``b`` with its scale and zero point per column (what onnxruntime's graph
    optimizer makes of a per-channel QDQ MatMul): ``Q(DQ(a) @ DQ(b))``, the QDQ form that
    ``qdq_matmul_integer`` puts on the integer kernel (within one output step of the exact
    requantisation: rounding ties)."""
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (list(inputs) + [None] * 8)[:8]
    eight_bit(ctx, (a, "a"), (b, "b"))
    if _per_column(b, b_s, b_zp):
        per_tensor(ctx, (a_s, "a_scale"), (a_zp, "a_zero_point"), (y_s, "y_scale"),
                   (y_zp, "y_zero_point"))
        y = bb.emit(relax.op.matmul(dequantized(bb, a, a_s, a_zp),
                                    dequantized(bb, b, b_s, b_zp, axis=1)))
        return quantized(bb, y, y_s, y_zp, a)
    out_dtype = dtype_of(y_zp) if y_zp is not None else dtype_of(a)
    acc = bb.emit(relax.op.matmul(_minus_zero_point(bb, a, a_zp, ctx, "a_zero_point"),
                                  _minus_zero_point(bb, b, b_zp, ctx, "b_zero_point"),
                                  out_dtype="int32"))
    scale = relax.op.divide(relax.op.multiply(_scalarize(a_s, ctx, "a_scale"),
                                              _scalarize(b_s, ctx, "b_scale")),
                            _scalarize(y_s, ctx, "y_scale"))
    zp = _scalarize(y_zp, ctx, "y_zero_point") if y_zp is not None else None
    return _requantize(bb, acc, bb.emit(scale), zp, out_dtype)


def _per_column(b, b_s, b_zp) -> bool:
    """True for a constant 2-D ``b`` [K, N] whose scale (and zero point) hold N > 1 values."""
    if constant_value(b) is None or b.ty.ndim != 2:
        return False
    n = static_shape(b)[1]
    sizes = [int(np.prod(static_shape(v))) for v in (b_s, b_zp) if v is not None]
    return n > 1 and any(k == n for k in sizes) and all(k in (1, n) for k in sizes)


def _conv(bb, x, w, attrs, ctx):
    """TVM's Conv converter (auto_pad, pads, strides, dilations, group) over ``x`` and
    ``w`` as given (int32 operands, or the dequantized float ones)."""
    conv_attrs = {k: v for k, v in attrs.items()
                  if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}
    return bb.normalize(tvm_converter("Conv")(bb, [x, w, None], conv_attrs, ctx))


def _per_channel_shape(w):
    return [static_shape(w)[0]] + [1] * (w.ty.ndim - 1)


@register("ConvInteger", since=10)
def conv_integer(bb, inputs, attrs, ctx):
    """ConvInteger: int32 convolution of (x - x_zero_point) and (w - w_zero_point);
    w_zero_point per tensor or per output channel."""
    x, w, x_zp, w_zp = (list(inputs) + [None] * 4)[:4]
    eight_bit(ctx, (x, "x"), (w, "w"))
    x32 = _minus_zero_point(bb, x, x_zp, ctx, "x_zero_point")
    w32 = _minus_zero_point(bb, w, w_zp, ctx, "w_zero_point", _per_channel_shape(w))
    return _conv(bb, x32, w32, attrs, ctx)


def dequantized(bb, x, scale, zero, axis: int = 1):
    """``relax.op.dequantize`` of an 8-bit ``x`` (scale and zero point scalars, or 1-D
    along ``axis``; no zero point: 0), the op the QDQ passes read."""
    zero = zero if zero is not None else relax.const(np.zeros((), dtype_of(x)))
    if int(np.prod(static_shape(scale))) == 1 and int(np.prod(static_shape(zero))) == 1:
        axis = max(x.ty.ndim - 1, 0)  # per tensor: any axis the op accepts (a 1-D bias)
    return bb.emit(relax.op.dequantize(x, _scalar_or_axis(bb, scale),
                                       _scalar_or_axis(bb, zero), axis=axis,
                                       out_dtype="float32"))


def quantized(bb, y, scale, zero, like):
    """``relax.op.quantize`` of float ``y`` per tensor (QuantizeLinear: round half to even,
    plus the zero point, saturated to the zero point's type, or without one ``like``'s)."""
    out_dtype = dtype_of(zero) if zero is not None else dtype_of(like)
    zero = zero if zero is not None else relax.const(np.zeros((), out_dtype))
    return relax.op.quantize(y, _scalar_or_axis(bb, scale), _scalar_or_axis(bb, zero),
                             axis=-1, out_dtype=out_dtype)


def _scalar_or_axis(bb, v):
    """A scale / zero point as the QDQ passes read it: a constant scalar (or 1-D) where
    it is constant, else reshaped at run time."""
    c = constant_value(v)
    if c is not None:
        return relax.const(c.reshape(()) if c.size == 1 else c.reshape(-1))
    return bb.emit(relax.op.reshape(v, []) if int(np.prod(static_shape(v))) == 1 else v)


@register("QLinearConv", since=10)
def qlinear_conv(bb, inputs, attrs, ctx):
    """QLinearConv.  With a constant 8-bit weight (onnxruntime's QOperator quantizer
    output): ``Q(conv(DQ(x), DQ(w)) + bias * x_scale * w_scale)``, the QDQ form that
    ``qdq_conv_integer`` puts on the integer kernel where the channels block (else a float
    conv: an int32 NCHW conv has no CPU rule); results within one output step of the
    exact form.  Otherwise exact: the int32 convolution of the zero-point-shifted inputs
    plus the int32 bias, requantized with x_scale * w_scale / y_scale (w_scale per tensor
    or per output channel)."""
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = (list(inputs) + [None] * 9)[:9]
    eight_bit(ctx, (x, "x"), (w, "w"))
    if constant_value(w) is not None and constant_value(w_s) is not None and (
            w_zp is None or constant_value(w_zp) is not None) and static_shape(x_s) in (
            [], [1]) and (x_zp is None or int(np.prod(static_shape(x_zp))) == 1):
        return _qlinear_conv_qdq(bb, x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias, attrs, ctx)
    x32 = _minus_zero_point(bb, x, x_zp, ctx, "x_zero_point")
    w32 = _minus_zero_point(bb, w, w_zp, ctx, "w_zero_point", _per_channel_shape(w))
    acc = _conv(bb, x32, w32, attrs, ctx)
    nd = w.ty.ndim
    if bias is not None:
        acc = bb.emit(relax.op.add(acc, relax.op.reshape(
            relax.op.astype(bias, "int32"), [1, static_shape(w)[0]] + [1] * (nd - 2))))
    n_ws = int(np.prod(static_shape(w_s), dtype=np.int64))
    if n_ws == 1:
        ws = relax.op.reshape(w_s, [])
    elif n_ws == static_shape(w)[0]:
        ws = relax.op.reshape(w_s, [1, n_ws] + [1] * (nd - 2))
    else:
        refuse(ctx, f"w_scale of shape {static_shape(w_s)}")
    scale = relax.op.divide(relax.op.multiply(_scalarize(x_s, ctx, "x_scale"), ws),
                            _scalarize(y_s, ctx, "y_scale"))
    out_dtype = dtype_of(y_zp) if y_zp is not None else dtype_of(x)
    zp = _scalarize(y_zp, ctx, "y_zero_point") if y_zp is not None else None
    return _requantize(bb, acc, bb.emit(scale), zp, out_dtype)


def _qlinear_conv_qdq(bb, x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias, attrs, ctx):
    nd = w.ty.ndim
    f = static_shape(w)[0]
    y = _conv(bb, dequantized(bb, x, x_s, x_zp), dequantized(bb, w, w_s, w_zp, axis=0),
              attrs, ctx)
    if bias is not None:
        b = constant_value(bias)
        xs, ws = constant_value(x_s), constant_value(w_s)
        if b is None or xs is None:
            refuse(ctx, "a bias or x_scale computed at run time with a constant weight")
        fb = (b.astype(np.float32) * (np.float32(xs.reshape(-1)[0])
                                      * ws.astype(np.float32).reshape(-1))).astype(np.float32)
        y = bb.emit(relax.op.add(y, relax.const(fb.reshape([1, f] + [1] * (nd - 2)))))
    return quantized(bb, y, y_s, y_zp, x)


@register("DynamicQuantizeLinear", since=11, override=True)
def dynamic_quantize_linear(bb, inputs, attrs, ctx):
    """TVM's DynamicQuantizeLinear with its whole-tensor max and min taken per row first
    (``max(max(x, axis=-1))``): a row reduction the CPU rules vectorise and run in
    parallel, then a short one, instead of one serial reduce-all loop over the tensor
    (BERT-base: 48 of them per run over 98K-393K elements each, on the fallback)."""
    from ..registry import tvm_converter

    x = inputs[0]
    if x.ty.ndim is None or x.ty.ndim < 2:
        return tvm_converter("DynamicQuantizeLinear")(bb, inputs, attrs, ctx)
    from tvm import topi

    dtype = dtype_of(x)
    qmin, qmax = relax.const(0, dtype), relax.const(255, dtype)
    # topi's plain max / min reducers, not relax.op.max (legalized with onnxruntime's
    # ReduceMax NaN rule, position-dependent, which no rule can split into vector partials):
    # a NaN input has no defined scale anyway
    x_max = relax.op.maximum(qmin, bb.emit_te(topi.max, bb.emit_te(topi.max, x, axis=-1),
                                              primfunc_name_hint="dql_max"))
    x_min = relax.op.minimum(qmin, bb.emit_te(topi.min, bb.emit_te(topi.min, x, axis=-1),
                                              primfunc_name_hint="dql_min"))
    y_scale = bb.emit(relax.op.divide(relax.op.subtract(x_max, x_min), qmax))
    zp = relax.op.subtract(qmin, relax.op.divide(x_min, y_scale))
    y_zp = bb.emit(relax.op.astype(relax.op.round(relax.op.clip(zp, 0, 255)), "uint8"))
    y = relax.op.quantize(x, y_scale, y_zp, axis=0, out_dtype="uint8")
    return relax.Tuple([y, y_scale, y_zp])


# --------------------------------------------------------------------------- #
# BitCast (26+)
# --------------------------------------------------------------------------- #


@register("BitCast", since=26)
def bitcast(bb, inputs, attrs, ctx):
    """BitCast between element types of the same width (the bits reinterpreted); bool to
    a byte type as its 0/1 value."""
    from tvm import te, tirx

    x = inputs[0]
    src = dtype_of(x)
    to = int(attrs["to"])
    try:
        dst = np.dtype(helper.tensor_dtype_to_np_dtype(to)).name
    except Exception:  # noqa: BLE001 - string, or a type numpy does not know
        dst = None
    if dst in (None, "object", "str") or src in ("object", "str"):
        refuse(ctx, f"BitCast from {src} to type {to}")
    if dst == "bool":
        refuse(ctx, f"BitCast from {src} to bool (only 0/1 bytes are valid bools)")
    if src == "bool":
        if np.dtype(dst).itemsize != 1:
            refuse(ctx, f"BitCast from bool to {dst} (widths differ)")
        return relax.op.astype(x, dst)
    if np.dtype(src).itemsize != np.dtype(dst).itemsize:
        refuse(ctx, f"BitCast from {src} to {dst} (widths differ)")
    if src == dst:
        return x
    return bb.emit_te(lambda t: te.compute(t.shape, lambda *i: tirx.reinterpret(dst, t(*i)),
                                           name="bitcast"),
                      x, primfunc_name_hint="bitcast")
