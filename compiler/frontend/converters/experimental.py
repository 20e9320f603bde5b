"""ONNX 1.0-1.4's experimental default-domain ops, which later ONNX releases dropped from
the spec (``onnx.defs`` has no schema for them) but onnxruntime still runs at opsets 1-9:
ImageScaler (the first node of the Model Zoo's Tiny YOLOv2, opset 8), Crop, Affine, Scale,
ScaledTanh and ParametricSoftplus.  Each is computed as onnxruntime computes it
(``onnxruntime/contrib_ops/cpu/image_scaler.h``, ``crop.h`` and its element-wise
functors), refusing, as onnxruntime does, a node without its required attributes.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .common import refuse, static_dims, float_only
from ..registry import register_op

# onnxruntime registers them for these opsets (ImageScaler at opset 10: "not a registered
# function/op")
_SINCE, _UNTIL = 1, 9


def _experimental(op_type):
    return register_op("", op_type, since=_SINCE, until=_UNTIL, implementation="onnxc")


def _required(ctx, attrs, *names):
    for name in names:
        if name not in attrs:
            refuse(ctx, f"a node without its {name!r} attribute (onnxruntime requires it)")
    return [attrs[n] for n in names]


def _const(value, x):
    dtype = str(x.ty.dtype)
    return relax.const(np.array(value, dtype), dtype)


@_experimental("ImageScaler")
def image_scaler(bb, inputs, attrs, ctx):
    """``y[n, c, h, w] = scale * x[n, c, h, w] + bias[c]`` (scale defaults to 1)."""
    x = inputs[0]
    float_only(ctx, x)
    (bias,) = _required(ctx, attrs, "bias")
    dims = static_dims(x, ctx)
    if len(dims) != 4 or len(bias) != dims[1]:  # onnxruntime refuses these too
        refuse(ctx, f"bias of {len(bias)} values for an input of shape {dims} (NCHW, one "
               "per channel)")
    b = _const(np.reshape(bias, [dims[1], 1, 1]), x)
    return relax.op.add(relax.op.multiply(x, _const(attrs.get("scale", 1.0), x)), b)


@_experimental("Crop")
def crop(bb, inputs, attrs, ctx):
    """Crop of an NCHW input: ``border`` = (left, top, right, bottom); without ``scale``
    the rest after the borders, with ``scale`` = (height, width) that size from (top,
    left)."""
    x = inputs[0]
    (border,) = _required(ctx, attrs, "border")
    dims = static_dims(x, ctx)
    if len(dims) != 4 or len(border) != 4:
        refuse(ctx, f"border={list(border)} on an input of shape {dims} (four borders, NCHW)")
    left, top, right, bottom = (int(b) for b in border)
    h, w = dims[2:]
    scale = attrs.get("scale")
    if scale is not None:
        if len(scale) != 2:
            refuse(ctx, f"scale={list(scale)} (height and width)")
        out_h, out_w = (int(s) for s in scale)
    else:
        out_h, out_w = h - top - bottom, w - left - right
    if min(left, top, right, bottom) < 0 or out_h <= 0 or out_w <= 0 or \
            top + out_h > h or left + out_w > w:
        refuse(ctx, f"border={list(border)}"
               + (f", scale={list(scale)}" if scale is not None else "")
               + f" on an input of {h}x{w} (the crop must lie inside it)")
    return relax.op.strided_slice(x, axes=[2, 3], begin=[top, left],
                                  end=[top + out_h, left + out_w])


@_experimental("Affine")
def affine(bb, inputs, attrs, ctx):
    """``y = alpha * x + beta`` (defaults 1 and 0)."""
    x = inputs[0]
    float_only(ctx, x)
    return relax.op.add(relax.op.multiply(x, _const(attrs.get("alpha", 1.0), x)),
                        _const(attrs.get("beta", 0.0), x))


@_experimental("Scale")
def scale(bb, inputs, attrs, ctx):
    """``y = scale * x`` (default 1)."""
    x = inputs[0]
    float_only(ctx, x)
    return relax.op.multiply(x, _const(attrs.get("scale", 1.0), x))


@_experimental("ScaledTanh")
def scaled_tanh(bb, inputs, attrs, ctx):
    """``y = alpha * tanh(beta * x)``."""
    x = inputs[0]
    float_only(ctx, x)
    alpha, beta = _required(ctx, attrs, "alpha", "beta")
    return relax.op.multiply(_const(alpha, x),
                             relax.op.tanh(relax.op.multiply(x, _const(beta, x))))


@_experimental("ParametricSoftplus")
def parametric_softplus(bb, inputs, attrs, ctx):
    """``y = alpha * ln(1 + exp(beta * x))``, as ``max(bx, 0) + ln(1 + exp(-|bx|))``: no
    overflow for large ``beta * x`` (onnxruntime's functor splits on the sign likewise)."""
    x = inputs[0]
    float_only(ctx, x)
    alpha, beta = _required(ctx, attrs, "alpha", "beta")
    bx = bb.emit(relax.op.multiply(x, _const(beta, x)))
    tail = relax.op.log(relax.op.add(_const(1.0, x),
                                     relax.op.exp(relax.op.negative(relax.op.abs(bx)))))
    return relax.op.multiply(_const(alpha, x),
                             relax.op.add(relax.op.maximum(bx, _const(0.0, x)), tail))
