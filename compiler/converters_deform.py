"""onnxc's DeformConv converter (opset 19+): a 2-D convolution whose kernel taps sample the
input at learned fractional offsets.

``deform_conv(X, W, offset, B, mask) => matmul(W, deformed_columns(X, offset, mask)) + B``:
a TE compute gathers, for every input channel, kernel tap and output position, the input
bilinearly interpolated at the tap's offset position (zero outside the image), times the
mask; a grouped matmul with the weights then sums over channels and taps.  This follows
ONNX's reference (``onnx/reference/ops/op_deform_conv.py``: GridSample, bilinear,
``align_corners=1``, zero padding), which implements 2-D only; other ranks are refused.
For float16 the reference rounds every product and partial sum to float16; onnxc rounds the
sampled values to float16 but sums them in the matmul (accumulated in float32), which is
closer to the exact result and may differ from the reference by a few float16 ulps.
"""

from __future__ import annotations

from tvm import relax

from .converters_nn import _dtype, _is_float, _refuse, _shape
from .registry import register_op


def _ints(attrs, name: str, default: list[int]) -> list[int]:
    value = attrs.get(name)
    return [int(v) for v in value] if value is not None else list(default)


@register_op("", "DeformConv", since=19, implementation="onnxc")
def deform_conv(bb, inputs, attrs, ctx):
    """DeformConv over (N, C, H, W): bilinear sampling at ``offset`` (optional ``mask``),
    ``group``, ``offset_group``, ``pads``, ``strides``, ``dilations``, optional bias."""
    from tvm import te, tirx

    x, w, offset = inputs[0], inputs[1], inputs[2]
    bias = inputs[3] if len(inputs) > 3 else None
    mask = inputs[4] if len(inputs) > 4 else None
    dtype = _dtype(x)
    if not _is_float(dtype) or dtype == "bfloat16":
        _refuse(ctx, f"X of type {dtype}")
    others = [t for t in (w, offset, bias, mask) if t is not None]
    if any(_dtype(t) != dtype for t in others):
        _refuse(ctx, f"inputs of mixed types ({[_dtype(t) for t in [x] + others]})")
    xd, wd, od = _shape(x), _shape(w), _shape(offset)
    if len(xd) != 4:
        _refuse(ctx, f"X of shape {xd} (only 2-D deformable convolution, as ONNX's reference)")
    n, channels, height, width = xd
    oc, cg = wd[0], wd[1]
    kh, kw = _ints(attrs, "kernel_shape", wd[2:])
    if [kh, kw] != wd[2:]:
        _refuse(ctx, f"kernel_shape {[kh, kw]} with weights of shape {wd}")
    group = int(attrs.get("group", 1))
    og = int(attrs.get("offset_group", 1))
    sh, sw = _ints(attrs, "strides", [1, 1])
    dh, dw = _ints(attrs, "dilations", [1, 1])
    pads = _ints(attrs, "pads", [0, 0, 0, 0])
    if group < 1 or og < 1 or channels != cg * group or oc % group or channels % og:
        _refuse(ctx, f"X of shape {xd} with W of shape {wd}, group={group}, "
                     f"offset_group={og}")
    oh = (height + pads[0] + pads[2] - ((kh - 1) * dh + 1)) // sh + 1
    ow = (width + pads[1] + pads[3] - ((kw - 1) * dw + 1)) // sw + 1
    if od != [n, og * kh * kw * 2, oh, ow]:
        _refuse(ctx, f"offset of shape {od} (expected {[n, og * kh * kw * 2, oh, ow]} from "
                     "the kernel, pads, strides and dilations)")
    if mask is not None and _shape(mask) != [n, og * kh * kw, oh, ow]:
        _refuse(ctx, f"mask of shape {_shape(mask)} (expected {[n, og * kh * kw, oh, ow]})")
    if bias is not None and _shape(bias) != [oc]:
        _refuse(ctx, f"B of shape {_shape(bias)} (expected {[oc]})")
    per_og = channels // og
    # the reference's sampling positions go through float32 (GridSample's coordinates)
    cdt = "float64" if dtype == "float64" else "float32"

    def columns(data, off, *maybe_mask):
        def value(b, c, ky, kx, i, j):
            g = c // per_og
            tap = (g * kh + ky) * kw + kx
            y = tirx.Cast(cdt, i * sh - pads[0] + ky * dh) + tirx.Cast(cdt, off[b, tap * 2, i, j])
            xx = tirx.Cast(cdt, j * sw - pads[1] + kx * dw) + \
                tirx.Cast(cdt, off[b, tap * 2 + 1, i, j])
            y0f, x0f = tirx.floor(y), tirx.floor(xx)
            ly, lx = tirx.Cast(dtype, y - y0f), tirx.Cast(dtype, xx - x0f)
            y0, x0 = tirx.Cast("int64", y0f), tirx.Cast("int64", x0f)

            def pixel(yy, xq):
                inside = tirx.all(yy >= 0, yy < height, xq >= 0, xq < width)
                yc = tirx.max(tirx.min(yy, height - 1), 0)
                xc = tirx.max(tirx.min(xq, width - 1), 0)
                return tirx.Select(inside, data[b, c, yc, xc], tirx.const(0, dtype))

            one = tirx.const(1, dtype)
            top = (one - lx) * pixel(y0, x0) + lx * pixel(y0, x0 + 1)
            bottom = (one - lx) * pixel(y0 + 1, x0) + lx * pixel(y0 + 1, x0 + 1)
            v = (one - ly) * top + ly * bottom
            if maybe_mask:
                v = v * maybe_mask[0][b, tap, i, j]
            return v

        return te.compute([n, channels, kh, kw, oh, ow], value, name="deform_columns")

    args = [x, offset] + ([mask] if mask is not None else [])
    cols = bb.emit_te(columns, *args, primfunc_name_hint="deform_columns")
    cols = relax.op.reshape(cols, [n, group, cg * kh * kw, oh * ow])
    wmat = relax.op.reshape(w, [1, group, oc // group, cg * kh * kw])
    out = relax.op.reshape(bb.emit(relax.op.matmul(wmat, cols)), [n, oc, oh, ow])
    if bias is not None:
        out = relax.op.add(out, relax.op.reshape(bias, [1, oc, 1, 1]))
    return out
