"""Cast, CastLike, QuantizeLinear and DequantizeLinear on narrow element types (bfloat16,
float8, float4e2m1, int4/uint4/int2/uint2), held as codes (``compiler/frontend/narrow_types.py``);
and onnxruntime's com.microsoft QuantizeLinear / DequantizeLinear (what its quantizer writes
for 16-bit and 4-bit types below opset 21), read as the default domain's at opset 21.

Registered over the other converters of these ops; a node with no narrow tensor goes to
the converter each one overrides (TVM's: ``registry.previous``).  Conversions follow ONNX's reference
(``onnx/reference/ops/op_cast.py``, ``op_quantize_linear.py``, ``op_dequantize_linear.py``)
on ml_dtypes arrays: between two types through float32 (int32 for the narrow ints), which
is also how ml_dtypes converts float64 and int64 to bfloat16 / float8.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from onnx import TensorProto, helper
from tvm import relax

from ...lowering.legalize_nan import bind_once
from .common import constant_value, dtype_of, refuse, static_shape
from ..narrow_types import decode, encode, fmt_of
from ..registry import previous, register_op

# integer quantization ranges
_INT_RANGE = {TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15),
              TensorProto.INT2: (-2, 1), TensorProto.UINT2: (0, 3)}
_FLOAT8 = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
           TensorProto.FLOAT8E5M2FNUZ}


def _register(op):
    def wrap(fn):
        fn.handles_narrow = True  # compiler/frontend/narrow_import.py: give it narrow tensors
        return register_op("", op, since=1, implementation="onnxc", override=True)(fn)
    return wrap


def _types(ctx) -> dict:
    return getattr(ctx.importer, "elem_types", None) or {}


def _str(v, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def _to_float32(bb, x):
    return x if dtype_of(x) == "float32" else bb.emit(relax.op.astype(x, "float32"))


def cast_to(bb, x, src, to: int, saturate: bool = True, round_mode: str = "up",
            plain_cast=None):
    """``x`` (codes of narrow format ``src``, or a plain tensor when ``src`` is None) cast
    to ONNX element type ``to``; ``plain_cast(bb, x, to)`` casts between plain types."""
    dst = fmt_of(to)
    if src is not None and dst is not None and src.elem_type == dst.elem_type:
        return x
    if src is not None:
        x = decode(bb, x, src)  # float32, or int32 for the narrow ints
    if dst is None:
        want = helper.tensor_dtype_to_np_dtype(to).name
        return x if dtype_of(x) == want else plain_cast(bb, x, to)
    if dst.is_float:
        return encode(bb, _to_float32(bb, x), dst, saturate, round_mode)
    return encode(bb, x, dst)


def _plain_cast(ctx):
    """``plain(bb, x, to)`` between plain types, by the Cast converter registered before."""
    prev = previous(cast)

    def plain(bb, x, to):
        from tvm.relax.frontend.onnx.onnx_frontend import onnx_input

        done = float_to_int(bb, x, to)
        if done is not None:
            return done
        args = onnx_input()
        args.append(x)
        return bb.normalize(prev(bb, args, {"to": to}, ctx))
    return plain


def float_to_int(bb, x, to: int):
    """A float tensor cast to an integer type (not bool) as TVM's Cast converter computes
    it: a non-finite element gives 0, then its int64 (int32 for types under 32 bits),
    truncated to the type (uint64 directly); else None (the caller's converter).  One
    kernel reading each element once (a TIR ``Let``): TVM's
    ``where(logical_not(isfinite(x)), 0, x)`` reads ``x`` three times, and a fused kernel
    inlines the producer of ``x`` into each read; nested selects under those reads
    (DeBERTa's relative-position buckets over a symbolic sequence) took TVM's simplifier
    18 s to lower one elementwise kernel."""
    from tvm import te, tirx

    if not isinstance(getattr(x, "ty", None), relax.TensorType) or \
            constant_value(x) is not None:  # folded by TVM's converter's relax ops
        return None
    src = str(x.ty.dtype)
    want = helper.tensor_dtype_to_np_dtype(to)
    if not src.startswith(("float", "bfloat")) or want.kind not in "iu":
        return None
    # TVM's temporary: int64 for 32- and 64-bit types, int32 below (a value outside it is
    # undefined in ONNX; on x86 it gives what onnxruntime's static_cast gives there)
    wide = "uint64" if want.name == "uint64" else "int64" if want.itemsize >= 4 else "int32"

    def elem(v):
        return tirx.Cast(wide, tirx.Select(tirx.isfinite(v), v, tirx.const(0, src)))

    y = bb.emit_te(lambda a: te.compute(a.shape, lambda *i: bind_once(a, i, elem),
                                        name="float_to_int"),
                   x, primfunc_name_hint="float_to_int")
    return y if want.name == wide else bb.emit(relax.op.astype(y, want.name))


@_register("Cast")
def cast(bb, inputs, attrs, ctx):
    """Cast to / from / between narrow types (codes); other casts as registered before."""
    src = _types(ctx).get(ctx.node.input[0])
    to = int(attrs["to"])
    if src is None and fmt_of(to) is None:
        done = float_to_int(bb, inputs[0], to)
        return done if done is not None else previous(cast)(bb, inputs, attrs, ctx)
    return cast_to(bb, inputs[0], src, to, bool(attrs.get("saturate", 1)),
                   _str(attrs.get("round_mode"), "up"), _plain_cast(ctx))


@_register("CastLike")
def cast_like(bb, inputs, attrs, ctx):
    """CastLike to / from / between narrow types; the others as registered before."""
    types = _types(ctx)
    src, like = types.get(ctx.node.input[0]), types.get(ctx.node.input[1])
    if src is None and like is None:
        return previous(cast_like)(bb, inputs, attrs, ctx)
    to = like.elem_type if like else helper.np_dtype_to_tensor_dtype(np.dtype(dtype_of(inputs[1])))
    return cast_to(bb, inputs[0], src, to, bool(attrs.get("saturate", 1)),
                   _str(attrs.get("round_mode"), "up"), _plain_cast(ctx))


def _per_axis(bb, v, x_shape, axis, ctx, what):
    """Scale / zero point ``v`` made broadcastable against ``x``: a scalar (``axis`` is
    ignored, as the reference does), or a 1-D tensor along ``axis``; blocked quantization
    is refused."""
    n = int(np.prod(static_shape(v), dtype=np.int64))
    if n == 1:
        return bb.emit(relax.op.reshape(v, []))
    rank = len(x_shape)
    if not -rank <= axis < rank:
        refuse(ctx, f"axis {axis} for an input of rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if len(static_shape(v)) != 1 or static_shape(v)[0] != x_shape[axis]:
        refuse(ctx, f"{what} of shape {static_shape(v)} for input of shape {x_shape} "
                     "(blocked quantization)")
    dims = [1] * len(x_shape)
    dims[axis] = n
    return bb.emit(relax.op.reshape(v, dims))


def _axis(attrs, ctx) -> int:
    if int(attrs.get("block_size", 0) or 0):
        refuse(ctx, "block_size (blocked quantization) on narrow types")
    return int(attrs.get("axis", 1))


@_register("QuantizeLinear")
def quantize_linear(bb, inputs, attrs, ctx):
    """QuantizeLinear to int4/uint4/int2/uint2 (round half to even, add the zero point,
    clamp), float8 (saturate attribute; zero point ignored as the reference does) and
    float4e2m1 (plus the zero point, saturating)."""
    types = _types(ctx)
    node = ctx.node
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(node.input) > 2 and node.input[2] else None
    zp_fmt = types.get(node.input[2]) if zp is not None else None
    out_type = zp_fmt.elem_type if zp_fmt else int(attrs.get("output_dtype", 0) or 0)
    fmt = fmt_of(out_type)
    if fmt is None and not any(n in types for n in node.input if n):
        return previous(quantize_linear)(bb, inputs, attrs, ctx)
    if fmt is None or any(n in types for n in node.input[:2]):
        refuse(ctx, "QuantizeLinear with narrow x or y_scale, or a zero point of another "
                     "type than the output")
    if attrs.get("precision"):
        refuse(ctx, "the precision attribute on narrow types")
    shape = static_shape(x)
    axis = _axis(attrs, ctx)
    q = bb.emit(relax.op.divide(x, _per_axis(bb, scale, shape, axis, ctx, "y_scale")))
    q = _to_float32(bb, q)
    if out_type in _FLOAT8:
        return encode(bb, q, fmt, bool(attrs.get("saturate", 1)))
    if fmt.is_float:  # float4e2m1: x / scale + zero point, rounded once (saturating)
        if zp is not None:
            q = bb.emit(relax.op.add(q, _per_axis(bb, decode(bb, zp, fmt), shape, axis, ctx,
                                                  "y_zero_point")))
        return encode(bb, q, fmt)
    lo, hi = _INT_RANGE[out_type]
    r = bb.emit(relax.op.round(q))  # half to even (nearbyint)
    if zp is not None:
        z = decode(bb, zp, fmt, "float32")
        r = bb.emit(relax.op.add(r, _per_axis(bb, z, shape, axis, ctx, "y_zero_point")))
    # NaN goes to the low end, as the reference's int32 conversion sends it
    r = bb.emit(relax.op.where(relax.op.isnan(r), relax.const(float(lo), "float32"),
                               relax.op.clip(r, lo, hi)))
    return encode(bb, bb.emit(relax.op.astype(r, "int32")), fmt)


@_register("DequantizeLinear")
def dequantize_linear(bb, inputs, attrs, ctx):
    """DequantizeLinear of narrow x: (x - zero point) * scale in float32 for the narrow
    ints, x * scale for float8 / float4e2m1 (zero point ignored, as the reference), then
    rounded to the scale's type (or output_dtype)."""
    types = _types(ctx)
    node = ctx.node
    if not any(n in types for n in list(node.input) + list(node.output) if n):
        return previous(dequantize_linear)(bb, inputs, attrs, ctx)
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(node.input) > 2 and node.input[2] else None
    x_fmt = types.get(node.input[0])
    if x_fmt is None:
        refuse(ctx, "DequantizeLinear of a plain x with a narrow scale or output")
    shape = static_shape(x)
    axis = _axis(attrs, ctx)
    dx = decode(bb, x, x_fmt, "float32")
    if not x_fmt.is_float and zp is not None:
        zp_fmt = types.get(node.input[2])
        if zp_fmt is None or zp_fmt.elem_type != x_fmt.elem_type:
            refuse(ctx, "a zero point of another type than x")
        z = decode(bb, zp, zp_fmt, "float32")
        dx = bb.emit(relax.op.subtract(dx, _per_axis(bb, z, shape, axis, ctx, "x_zero_point")))
    s_fmt = types.get(node.input[1])
    s = decode(bb, scale, s_fmt) if s_fmt else _to_float32(bb, scale)
    y = bb.emit(relax.op.multiply(dx, _per_axis(bb, s, shape, axis, ctx, "x_scale")))
    out_type = int(attrs.get("output_dtype", 0) or 0) or (
        s_fmt.elem_type if s_fmt else helper.np_dtype_to_tensor_dtype(np.dtype(dtype_of(scale))))
    out_fmt = fmt_of(out_type)
    if out_fmt is not None:
        return encode(bb, y, out_fmt)
    want = helper.tensor_dtype_to_np_dtype(out_type).name
    return y if want == "float32" else bb.emit(relax.op.astype(y, want))


# onnxruntime's contrib QuantizeLinear / DequantizeLinear (com.microsoft, version 1): x,
# scale, optional zero point, ``axis`` (default 1), per tensor or per axis, 8 / 16 / 4-bit
# types; the quantizer writes them for int16 / uint16 / int4 / uint4 models below opset 21
# (and for any model with ``UseQDQContribOps``).  Their semantics are opset 21's without
# block_size / saturate / output_dtype, so they convert as those (narrow or not).
CONTRIB_OPSET = 21


def _contrib(op, default_converter):
    def convert(bb, inputs, attrs, ctx):
        for name in ("block_size", "saturate", "output_dtype", "precision"):
            if name in attrs:
                refuse(ctx, f"attribute {name!r} (not part of com.microsoft {op})")
        return default_converter(bb, inputs, attrs, dataclasses.replace(ctx, opset=CONTRIB_OPSET))
    convert.__name__ = f"contrib_{op}"
    convert.__doc__ = (f"com.microsoft {op} (onnxruntime's quantizer, 16- and 4-bit types): "
                       f"the default domain's {op} at opset {CONTRIB_OPSET}.")
    convert.handles_narrow = True
    return register_op("com.microsoft", op, since=1, implementation="onnxc")(convert)


contrib_quantize_linear = _contrib("QuantizeLinear", quantize_linear)
contrib_dequantize_linear = _contrib("DequantizeLinear", dequantize_linear)
