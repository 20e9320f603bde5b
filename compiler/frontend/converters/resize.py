"""Resize (11+) and Upsample (7-9) computed as ONNX's reference does, by gathers
(Resize-10, which the reference lacks, as onnxruntime does).

Resize is separable: each resized axis maps every output index to a few input indices
with weights (``onnx/reference/ops/op_resize.py``: the coordinate transform, the nearest
rounding, the linear/cubic/antialias coefficients, ``exclude_outside``, edge clamping and
``tf_crop_and_resize``'s extrapolation).  With static shapes and constant scales, sizes
and roi, all of that is known at compile time: it is computed here in numpy, in float64
as the reference computes it, and the graph only gathers and weighs:

    y = sum_k take(x, index[:, k], axis) * weight[:, k]      (one axis at a time)

Nearest mode (one weight 1 per output) is a plain ``take`` and exact for every dtype; an
integer upsampling whose outputs pick ``i // r`` is a ``repeat`` instead (same values, an
affine index the CPU rule ``upsample_nearest`` vectorises; a gather through the index
table ran 0.6 ms for FPN's [256, 32, 32] x2 against 0.12 ms).
Where the scales, sizes or roi are not constants the converter registered before this
one (TVM's, behind the guards above) handles the node; the session's
specialisation binds them as values when that fails (``compiler/specialize.py``).
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from .common import register, refuse, static_shape, attr_text, refuse_attribute, constant_value
from ..registry import previous, register_op

_MODES = ("nearest", "linear", "cubic")
_COORDS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
           "asymmetric", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# --------------------------------------------------------------------------- #
# Coefficients of one output position (ratio in (0, 1], as the reference's)
# --------------------------------------------------------------------------- #


def _nearest_coeffs(ratio: float, mode: str) -> list:
    if float(ratio).is_integer():
        return [0.0, 1.0]
    if mode == "round_prefer_floor":
        return [float(ratio <= 0.5), float(ratio > 0.5)]
    if mode == "round_prefer_ceil":
        return [float(ratio < 0.5), float(ratio >= 0.5)]
    return [1.0, 0.0] if mode == "floor" else [0.0, 1.0]


def _linear_coeffs(ratio: float, scale: float, antialias: bool) -> np.ndarray:
    if not antialias:
        return np.array([1 - ratio, ratio])
    scale = min(scale, 1.0)  # antialiasing widens the kernel when downsampling only
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
    c = np.clip(1 - np.abs(args), 0, 1)
    return c / c.sum()


def _cubic_coeffs(ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
    if not antialias:
        r1, r2 = ratio + 1, 1 - ratio
        return np.array([((a * r1 - 5 * a) * r1 + 8 * a) * r1 - 4 * a,
                         ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
                         ((a + 2) * r2 - (a + 3)) * r2 * r2 + 1,
                         ((a * (r2 + 1) - 5 * a) * (r2 + 1) + 8 * a) * (r2 + 1) - 4 * a])
    scale = min(scale, 1.0)

    def w(x):
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x * x + 1
        if x < 2:
            return a * x ** 3 - 5 * a * x * x + 8 * a * x - 4 * a
        return 0.0

    start = int(np.floor(-2 / scale) + 1)
    c = np.array([w(scale * (i - ratio)) for i in range(start, 2 - start)])
    return c / c.sum()


# --------------------------------------------------------------------------- #
# One axis: output index -> input indices and weights
# --------------------------------------------------------------------------- #


def _source_coords(coord: str, n_out: int, scale: float, n_in: int, roi):
    """The input coordinate of every output index, and the tf_crop_and_resize mask of the
    outputs that fall outside the input (None for the other modes)."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # the reference's float output width, not n_out
    outside = None
    if coord == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif coord == "asymmetric":
        x = y / scale
    elif coord == "tf_crop_and_resize":
        lo, hi = roi
        if width == 1:
            x = np.full(n_out, (hi - lo) * (n_in - 1) / 2)
        else:
            x = y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif coord == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif coord == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        offset = n_in / 2 * (1 - n_out / width)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def axis_plan(n_in: int, n_out: int, scale: float, coeffs_fn, coord: str, roi,
              exclude_outside: bool):
    """(index (n_out, k) int64, weight (n_out, k) float64, outside mask or None) of one
    resized axis, as ``_interpolate_1d_along_axis`` of the reference computes them."""
    x, outside = _source_coords(coord, n_out, scale, n_in, roi)
    x_int = np.floor(x)
    ratios = np.where(x == x_int, 1.0, x - x_int)  # the left pixel is preferred
    weights = np.array([coeffs_fn(float(r), scale) for r in ratios], np.float64)
    k = weights.shape[1]
    pad = int(np.ceil(k / 2))
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if k % 2 == 0:  # window of k nearest to x, ties to the smaller index
        offset = np.where(frac == 0, -(k // 2), -(k // 2) + 1)
    else:
        base = -((k - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    index = (p.astype(np.int64) + offset)[:, None] + np.arange(k)[None, :] - pad
    if exclude_outside:
        weights = np.where((index < 0) | (index >= n_in), 0.0, weights)
        total = weights.sum(axis=-1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, n_in - 1), weights, outside


# --------------------------------------------------------------------------- #
# The whole node
# --------------------------------------------------------------------------- #


def output_plan(in_shape, axes, scales, sizes, policy: str):
    """(output sizes, scale factors) over ``axes`` as the reference's ``_interpolate_nd``:
    from scales, size = floor(scale * n); from sizes, scale = size / n, or one common
    scale (min for not_larger, max for not_smaller) and size = round-half-up(scale * n)."""
    dims = [in_shape[a] for a in axes]
    if sizes is not None:
        out = [int(s) for s in sizes]
        factors = [o / n for o, n in zip(out, dims)]
        if policy != "stretch":
            scale = min(factors) if policy == "not_larger" else max(factors)
            factors = [scale] * len(dims)
            out = [int(scale * n + 0.5) for n in dims]
        return out, factors
    factors = [float(s) for s in scales]
    out = [int(np.float64(s) * n) for s, n in zip(factors, dims)]
    return out, factors


def resize_exact(bb, ctx, x, axes, out_sizes, factors, *, mode, coord, nearest_mode,
                 cubic_a, antialias, exclude_outside, roi, extrapolation):
    """Relax expression of ``x`` resized over ``axes`` (one pass per axis: ``_axis_order``)."""
    in_shape = [int(v) for v in x.ty.shape.values]
    ndim = len(in_shape)
    dtype = str(x.ty.dtype)
    is_float = dtype.startswith("float")
    if mode == "nearest":
        def coeffs_fn(r, s):
            return _nearest_coeffs(r, nearest_mode)
    elif mode == "linear":
        def coeffs_fn(r, s):
            return _linear_coeffs(r, s, antialias)
    else:
        def coeffs_fn(r, s):
            return _cubic_coeffs(r, s, cubic_a, antialias)
    compute = "float64" if dtype == "float64" else "float32"
    y, cast_back = x, False
    # tf_crop_and_resize fills what falls outside the crop axis by axis, in the given
    # order; nearest passes are copies (repeat / take), cpu.upsample_nearest takes the rows'
    # repeat inlined into the columns'
    order = range(len(axes)) if coord == "tf_crop_and_resize" or mode == "nearest" else \
        _axis_order(axes, in_shape, out_sizes)
    for i in order:
        a = axes[i]
        n_in, n_out, scale = in_shape[a], out_sizes[i], factors[i]
        lo_hi = None if roi is None else roi[i]
        if math.isclose(scale, 1.0) and n_out == n_in and (
                lo_hi is None or (math.isclose(lo_hi[0], 0.0) and math.isclose(lo_hi[1], 1.0))):
            continue  # identity along this axis (the reference skips it too)
        if n_out <= 0:
            refuse(ctx, f"an output size of {n_out} along axis {a}")
        index, weight, outside = axis_plan(n_in, n_out, scale, coeffs_fn, coord, lo_hi,
                                           exclude_outside)
        one_hot = bool(np.all((weight == 0) | (weight == 1)) and
                       np.all(weight.sum(axis=1) == 1))
        if one_hot:
            y = _pick(bb, y, index[np.arange(n_out), weight.argmax(axis=1)], n_in, a)
        else:
            if not is_float:
                refuse(ctx, f"mode={mode} on a {dtype} input (the reference rounds the "
                        "float result)")
            if dtype != compute and not cast_back:
                y, cast_back = bb.emit(relax.op.astype(y, compute)), True
            k = index.shape[1]
            if k <= _UNROLLED_TAPS:
                y = _weighted_taps(bb, y, index, weight.astype(compute), a)
            else:
                g = bb.emit(relax.op.take(y, relax.const(index.reshape(-1), "int64"), axis=a))
                shape = [int(v) for v in g.ty.shape.values]
                g = relax.op.reshape(g, shape[:a] + [n_out, k] + shape[a + 1:])
                w = relax.const(weight.astype(compute).reshape(
                    (n_out, k) + (1,) * (ndim - a - 1)), compute)
                y = bb.emit(relax.op.sum(relax.op.multiply(g, w), axis=[a + 1]))
        if outside is not None and outside.any():
            mask = relax.const(outside.reshape((n_out,) + (1,) * (ndim - a - 1)), "bool")
            fill = _fill_value(extrapolation, str(y.ty.dtype))
            y = bb.emit(relax.op.where(mask, fill, y))
    if cast_back:
        y = relax.op.astype(y, dtype)
    return y


def _pick(bb, y, picked, n_in: int, axis: int):
    """``y`` gathered along ``axis`` at the input indices ``picked`` (one per output)."""
    n_out = len(picked)
    rep = n_out // n_in
    if rep >= 2 and n_out == rep * n_in and np.array_equal(picked, np.arange(n_out) // rep):
        # an integer nearest upsampling (FPN / U-Net x2): each input repeated ``rep``
        # times, an affine index (i // rep) that cpu.upsample_nearest schedules, not a
        # gather through an index table
        return bb.emit(relax.op.repeat(y, rep, axis=axis))
    return bb.emit(relax.op.take(y, relax.const(np.asarray(picked, np.int64), "int64"),
                                 axis=axis))


def _axis_order(axes, in_shape, out_sizes) -> list:
    """Positions in ``axes`` in the order to resize them: an upsampled last axis first.
    Along the last axis every output element gathers its taps (no vector loads); along
    any other the taps are whole rows, weighed as vectors.  First, the last axis's pass
    runs over the smallest tensor: DeepLabV3's x16 bilinear [21, 20, 20] -> [21, 320, 320]
    gathered 2.15 M elements last, 134 K first."""
    order = list(range(len(axes)))
    last = [i for i in order if axes[i] == len(in_shape) - 1]
    if last and out_sizes[last[0]] > in_shape[-1]:
        order.remove(last[0])
        order.insert(0, last[0])
    return order


# Linear (2 taps) and cubic (4) without antialias: one kernel per axis that reads its taps
# through the index table and weighs them, instead of a gather of k x the output followed by
# a multiply-reduce over k (two kernels and the k-fold tensor between them; TVM's FuseOps
# does not fuse a take, whose index is not affine, into its consumer)
_UNROLLED_TAPS = 4


def _weighted_taps(bb, y, index, weight, axis: int):
    """``sum_j y[.., index[o, j], ..] * weight[o, j]`` along ``axis``, summed left to right
    as ``relax.op.sum`` over the taps would (the same float rounding)."""
    from tvm import te

    n_out, k = index.shape

    def compute(x, ix, wt):
        shape = list(x.shape)
        shape[axis] = n_out

        def tap(*i):
            acc = None
            for j in range(k):
                src = list(i)
                src[axis] = ix[i[axis], j]
                t = x[tuple(src)] * wt[i[axis], j]
                acc = t if acc is None else acc + t
            return acc
        return te.compute(shape, tap, name="resize_taps")

    return bb.emit_te(compute, y, relax.const(index.astype(np.int64), "int64"),
                      relax.const(weight, str(weight.dtype)), primfunc_name_hint="resize_taps")


def _fill_value(value: float, dtype: str):
    """``value`` in ``dtype`` as the reference's saturate_cast gives it."""
    if dtype.startswith("float"):
        return relax.const(np.array(value, dtype), dtype)
    info = np.iinfo(np.dtype(dtype))
    return relax.const(np.array(np.clip(np.round(value), info.min, info.max), dtype), dtype)


def _constant(x):
    """numpy value of a constant input (None if omitted or empty), or False if not
    constant."""
    if x is None:
        return None
    v = constant_value(x)
    if v is None:
        return False
    v = np.asarray(v).reshape(-1)
    return None if v.size == 0 else v


def _static_shape(x):
    from tvm import tirx

    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    return [int(v.value) for v in values]


# Resize 10+: TVM's, refusing antialias, which it ignores
refuse_attribute("Resize", "antialias", lambda v: bool(v), since=10)


# Resize 10+: TVM's behind the antialias refusal, refusing what TVM computes wrongly
@register("Resize", since=10, override=True)
def resize_guarded(bb, inputs, attrs, ctx):
    """Resize (the converter it overrides), refusing what TVM computes wrongly: TVM maps
    output to input coordinates with the size ratio ``in / out``, ONNX with the given
    ``scales`` (they differ when ``in * scale`` is not an integer), and in float32, so a
    nearest-mode sample that falls exactly halfway between two pixels may round the wrong
    way."""
    from fractions import Fraction


    x = inputs[0]
    if ctx.opset < 11:
        scales, sizes = (inputs[1] if len(inputs) > 1 else None), None
    else:
        scales = inputs[2] if len(inputs) > 2 else None
        sizes = inputs[3] if len(inputs) > 3 else None
    axes = attrs.get("axes")
    policy = attr_text(attrs.get("keep_aspect_ratio_policy"), "stretch")
    mode = attr_text(attrs.get("mode"), "nearest")
    coord = attr_text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    if coord == "tf_crop_and_resize" and len(getattr(x.ty, "shape", None) or ()) == 5:
        # TVM's topi _resize_3d drops the depth test of the extrapolation (its height test
        # starts again from the unmasked value): a depth coordinate outside the input gave
        # an interpolated value, not extrapolation_value.  Refused here, a session binds
        # the roi as a value and the exact converter (below) computes it.
        refuse(ctx, "coordinate_transformation_mode=tf_crop_and_resize on a 5-D input with "
                    "a roi that is not a constant (TVM's resize3d ignores the depth "
                    "extrapolation)")
    if mode != "nearest" and _static_shape(x) is None:
        # a symbolic image's bilinear / bicubic resize (a segmentation head back to the
        # input size): nothing below applies (the ties are nearest mode's)
        return previous(resize_guarded)(bb, inputs, attrs, ctx)
    in_shape = static_shape(x)
    out_shape = None
    if axes is None and policy == "stretch":
        sv = None if scales is None else constant_value(scales)
        zv = None if sizes is None else constant_value(sizes)
        if sv is not None and sv.size == len(in_shape):
            for d, (n, s) in enumerate(zip(in_shape, sv.reshape(-1).tolist())):
                if Fraction(n) * Fraction(s) != int(Fraction(n) * Fraction(s)):
                    refuse(ctx, f"attribute/input scales={sv.reshape(-1).tolist()} (axis {d}: "
                            f"{n} * {s} is not an integer; TVM would use the size ratio)")
            out_shape = [int(n * s) for n, s in zip(in_shape, sv.reshape(-1).tolist())]
        elif zv is not None and zv.size == len(in_shape):
            out_shape = [int(v) for v in zv.reshape(-1)]
    nearest = attr_text(attrs.get("nearest_mode"), "round_prefer_floor")
    if out_shape is not None and mode == "nearest" and nearest.startswith("round"):
        for d, (n, m) in enumerate(zip(in_shape, out_shape)):
            if n != m and m > 0 and not _tvm_nearest_agrees(n, m, coord, nearest):
                refuse(ctx, f"mode=nearest with nearest_mode={nearest} and "
                        f"coordinate_transformation_mode={coord} from size {n} to {m} "
                        f"(axis {d}): an output falls exactly halfway between two inputs, "
                        "which TVM's float32 arithmetic does not round as ONNX")
    return previous(resize_guarded)(bb, inputs, attrs, ctx)


def _tvm_nearest_agrees(n: int, m: int, coord: str, nearest: str) -> bool:
    """Whether TVM's float32 nearest-index computation (topi ``get_inx`` and
    ``get_closest_index``, with or without FMA contraction) gives ONNX's index for every
    output of an axis resized from ``n`` to ``m``.  Only exact ties can differ."""
    from fractions import Fraction

    half, r = Fraction(1, 2), Fraction(n, m)
    f32 = np.float32
    scale = f32(n) / f32(m)
    for o in range(m):
        if coord == "half_pixel" or (coord == "pytorch_half_pixel" and m > 1):
            exact = (o + half) * r - half
            a = f32(o) + f32(0.5)
            tvm = [f32(f32(a * scale) - f32(0.5)), f32(float(a) * float(scale) - 0.5)]
        elif coord == "pytorch_half_pixel":
            exact, tvm = Fraction(0), [f32(0)]
        elif coord == "asymmetric":
            exact, tvm = o * r, [f32(scale * f32(o))]
        elif coord == "tf_half_pixel_for_nn":
            exact, tvm = (o + half) * r, [f32((f32(o) + f32(0.5)) * scale)]
        elif coord == "align_corners":
            exact = Fraction(o * (n - 1), m - 1) if m > 1 else Fraction(0)
            tvm = [f32(f32(f32(n - 1) / f32(m - 1)) * f32(o))] if m > 1 else [f32(0)]
        else:
            return True  # not checked (tf_crop_and_resize depends on roi)
        if exact - (exact.numerator // exact.denominator) != half:
            continue  # not a tie: float error far below 1/2 cannot change the index
        want = math.floor(exact) if nearest == "round_prefer_floor" else math.ceil(exact)
        for t in tvm:
            got = math.ceil(t - f32(0.5)) if nearest == "round_prefer_floor" else \
                math.floor(t + f32(0.5))
            if got != want:
                return False
    return True


# Resize 10: Upsample under a new name (scales only, asymmetric), as onnxruntime runs it
@register("Resize", since=10, until=10, override=True)
def resize_v10(bb, inputs, attrs, ctx):
    """Resize-10 (PyTorch's opset-10 exports): input 1 is ``scales`` and the coordinates are
    asymmetric (``x_in = x_out / scale``), as Upsample's.  TVM has only Resize-18's
    converter, which reads input 1 as roi and fails.  Linear is Resize-11's asymmetric
    linear; nearest is onnxruntime's rule for opsets below 11 (onnx.reference has no
    Resize-10): ``floor(x_out / scale)`` on an upsampled axis, ``ceil`` on a downsampled one,
    clamped to the input, and output sizes ``floor(scale * n)``, all in float32 as
    onnxruntime computes them.  Scales must be constants (the session binds them as
    values when they are computed)."""
    x = inputs[0]
    in_shape = _static_shape(x)
    scales = _constant(inputs[1] if len(inputs) > 1 else None)
    if in_shape is None or scales is None or scales is False:
        refuse(ctx, "scales or an input shape not known at compile time")
    mode = attr_text(attrs.get("mode"), "nearest")
    if mode not in ("nearest", "linear"):
        refuse(ctx, f"attribute mode={mode!r}")
    scales = scales.astype(np.float32).reshape(-1)
    if scales.size != len(in_shape) or np.any(scales <= 0):
        refuse(ctx, f"scales={scales.tolist()} for an input of rank {len(in_shape)} "
                "(one scale > 0 per axis)")
    out_sizes = [int(s * np.float32(n)) for s, n in zip(scales, in_shape)]
    if min(out_sizes) <= 0:
        refuse(ctx, f"scales={scales.tolist()}: an output size of 0 from {in_shape}")
    axes = list(range(len(in_shape)))
    if mode == "linear":
        return resize_exact(bb, ctx, x, axes, out_sizes, [float(s) for s in scales],
                            mode=mode, coord="asymmetric", nearest_mode="floor",
                            cubic_a=-0.75, antialias=False, exclude_outside=False, roi=None,
                            extrapolation=0.0)
    y = x
    for a, (n_in, n_out, s) in enumerate(zip(in_shape, out_sizes, scales)):
        if n_in == n_out and s == 1:
            continue
        coord = np.arange(n_out, dtype=np.float32) / s
        picked = np.ceil(coord) if s < 1 else np.floor(coord)
        y = _pick(bb, y, np.minimum(picked.astype(np.int64), n_in - 1), n_in, a)
    return y


# Resize 11+: exact where scales, sizes and roi are constants, else the guarded TVM one above
@register("Resize", since=11, override=True)
def resize(bb, inputs, attrs, ctx):
    """Resize exactly as ONNX's reference: every mode (nearest with its four roundings,
    linear, cubic with cubic_coeff_a and exclude_outside), every coordinate transform
    (tf_crop_and_resize with roi and extrapolation_value), antialias, axes and
    keep_aspect_ratio_policy.  Needs static shapes and constant scales/sizes/roi; without
    them the previous converter (TVM's, guarded) takes the node."""
    inputs = list(inputs) + [None] * (4 - len(inputs))
    x = inputs[0]
    roi, scales, sizes = (_constant(v) for v in inputs[1:4])
    in_shape = _static_shape(x)
    if getattr(getattr(x.ty, "shape", None), "values", None) is not None and (
            in_shape is None or _symbolic_sizes(ctx)):
        return resize_symbolic(bb, ctx, x, roi, scales, attrs)
    if in_shape is None or False in (_is_known(roi), _is_known(scales), _is_known(sizes)):
        return previous(resize)(bb, inputs, attrs, ctx)
    mode = attr_text(attrs.get("mode"), "nearest")
    coord = attr_text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    nearest_mode = attr_text(attrs.get("nearest_mode"), "round_prefer_floor")
    policy = attr_text(attrs.get("keep_aspect_ratio_policy"), "stretch")
    antialias = bool(attrs.get("antialias", 0))
    for name, value, allowed in (("mode", mode, _MODES), ("nearest_mode", nearest_mode, _NEAREST),
                                 ("coordinate_transformation_mode", coord, _COORDS),
                                 ("keep_aspect_ratio_policy", policy,
                                  ("stretch", "not_larger", "not_smaller"))):
        if value not in allowed:
            refuse(ctx, f"attribute {name}={value!r}")
    if antialias and mode == "nearest":
        refuse(ctx, "antialias=1 with mode=nearest")
    ndim = len(in_shape)
    axes = attrs.get("axes")
    axes = list(range(ndim)) if axes is None else [int(a) + ndim if int(a) < 0 else int(a)
                                                   for a in axes]
    if sorted(set(axes)) != sorted(axes) or not all(0 <= a < ndim for a in axes):
        refuse(ctx, f"axes={list(attrs.get('axes'))} for an input of rank {ndim}")
    if (scales is None) == (sizes is None):
        refuse(ctx, "giving both scales and sizes (or neither)")
    given = scales if sizes is None else sizes
    if given.size != len(axes):
        refuse(ctx, f"{'scales' if sizes is None else 'sizes'} of {given.size} values for "
                f"{len(axes)} axes")
    if sizes is None and policy != "stretch":
        policy = "stretch"  # the policy applies to sizes only
    if sizes is None and np.any(scales <= 0):
        refuse(ctx, f"scales={scales.tolist()} (must be > 0)")
    out_sizes, factors = output_plan(in_shape, axes, scales, sizes, policy)
    pairs = None
    if roi is not None and coord == "tf_crop_and_resize":  # the other modes ignore roi
        if roi.size != 2 * len(axes):
            refuse(ctx, f"roi of {roi.size} values for {len(axes)} axes")
        # kept in roi's own type: ``lo * (n_in - 1)`` rounds there, in the reference and
        # in onnxruntime (0.1f * 5 is 0.5, a tie for nearest; 0.1 * 5 in float64 is not)
        pairs = [(roi[i], roi[len(axes) + i]) for i in range(len(axes))]
    elif coord == "tf_crop_and_resize":
        refuse(ctx, "coordinate_transformation_mode=tf_crop_and_resize without roi")
    return resize_exact(bb, ctx, x, axes, out_sizes, factors, mode=mode, coord=coord,
                        nearest_mode=nearest_mode,
                        cubic_a=float(attrs.get("cubic_coeff_a", -0.75)),
                        antialias=antialias,
                        exclude_outside=bool(attrs.get("exclude_outside", 0)), roi=pairs,
                        extrapolation=float(attrs.get("extrapolation_value", 0.0)))


def _is_known(v) -> bool:
    return v is not False


def _bilinear_align_corners(x, size):
    """Bilinear resize of NCHW ``x`` to ``size`` (symbolic) with align_corners coordinates:
    ``in = out * (n_in - 1) / (n_out - 1)`` (0 for one output), the two taps clamped to
    the input, in float32 as onnxruntime computes it."""
    from tvm import te, tirx

    n, c, h, w = x.shape
    oh, ow = size

    def coord(o, n_in, n_out):
        one = tirx.const(1, "int64")
        ratio = tirx.Select(n_out > one, (n_in - one).astype("float32")
                            / (n_out - one).astype("float32"), tirx.const(0.0, "float32"))
        v = o.astype("float32") * ratio
        lo = te.min(tirx.floor(v).astype("int64"), n_in - one)
        return lo, te.min(lo + one, n_in - one), v - lo.astype("float32")

    def value(b, ch, y, xx):
        y0, y1, wy = coord(y, h, oh)
        x0, x1, wx = coord(xx, w, ow)
        one = tirx.const(1.0, "float32")
        top = x[b, ch, y0, x0] * (one - wx) + x[b, ch, y0, x1] * wx
        bottom = x[b, ch, y1, x0] * (one - wx) + x[b, ch, y1, x1] * wx
        return top * (one - wy) + bottom * wy

    return te.compute((n, c, oh, ow), value, name="resize")


def _known_sizes(ctx):
    """The node's ``sizes`` input as the shape value the importer knows (ints and dims:
    ``Shape -> Slice -> Concat``), or None."""
    names = ctx.node.input
    if len(names) <= 3 or not names[3]:
        return None
    return getattr(ctx.importer, "_known", {}).get(names[3])


def _symbolic_sizes(ctx) -> bool:
    """Whether the node's ``sizes`` input is a shape value holding symbolic dims (an ASPP
    pooling branch resized from 1 x 1 back to a symbolic image's size)."""
    from ..shape_arith import symbolic

    known = _known_sizes(ctx)
    return known is not None and symbolic(np.asarray(known, dtype=object))


# ONNX's mode names as topi's resize takes them
_TOPI_MODE = {"nearest": "nearest_neighbor", "linear": "linear", "cubic": "cubic"}


def resize_symbolic(bb, ctx, x, roi, scales, attrs):
    """Resize of a 4-D input whose image size is symbolic, or to sizes that are (a model
    exported with a dynamic height and width: a segmentation head resized back to the
    input's size, an FPN / YOLO neck's x2 upsampling).  Output sizes come from ``sizes`` (a shape value the
    importer knows in terms of the dims, ``Shape -> Slice -> Concat``, or a constant) or
    from integer ``scales`` (``n * s``: exact for every size); ONNX maps outputs back with
    ``1 / scale``, the size ratio ``in / out`` then, as topi's resize computes it (in
    float32, as onnxruntime does).  A nearest upsampling by integer factors with
    asymmetric coordinates and rounding down (PyTorch's ``nn.Upsample``) is a ``repeat``
    per axis; the rest is TVM's ``image.resize2d`` over the symbolic sizes.  Refused
    (naming the node): other ranks, ``roi`` / tf_crop_and_resize, antialias, ``axes``, a
    keep-aspect-ratio policy, and non-integer scales (``floor(n * s)`` would not give
    ONNX's coordinates)."""
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    shape = list(x.ty.shape.values)
    mode = attr_text(attrs.get("mode"), "nearest")
    coord = attr_text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    nearest_mode = attr_text(attrs.get("nearest_mode"), "round_prefer_floor")
    what = "over a symbolic input size"
    if len(shape) != 4:
        refuse(ctx, f"Resize of a rank-{len(shape)} input {what}")
    for name, value, allowed in (("mode", mode, _MODES), ("nearest_mode", nearest_mode, _NEAREST),
                                 ("coordinate_transformation_mode", coord, _COORDS)):
        if value not in allowed:
            refuse(ctx, f"attribute {name}={value!r}")
    if coord == "tf_crop_and_resize" or (roi is not None and roi is not False):
        refuse(ctx, f"roi / tf_crop_and_resize {what}")
    if attrs.get("antialias", 0) or attrs.get("axes") is not None or attr_text(
            attrs.get("keep_aspect_ratio_policy"), "stretch") != "stretch":
        refuse(ctx, f"antialias, axes or keep_aspect_ratio_policy {what}")
    node = ctx.node
    sizes = None
    if len(node.input) > 3 and node.input[3]:
        known = _known_sizes(ctx)
        value = known if known is not None else constant_value(ctx.tensors[node.input[3]])
        if value is None:
            refuse(ctx, f"sizes computed from tensor values {what}")
        sizes = [int(v) if isinstance(v, (int, np.integer)) else v
                 for v in np.asarray(value, dtype=object).reshape(-1)]
    factors = None
    if sizes is None:
        if scales is None or scales is False:
            refuse(ctx, f"scales not known at compile time {what}")
        factors = [float(v) for v in np.asarray(scales).reshape(-1)]
        if len(factors) != 4 or any(f <= 0 or f != int(f) for f in factors):
            refuse(ctx, f"scales={factors} {what} (integer scales only: floor(n * scale) "
                    "would not give ONNX's coordinates)")
        sizes = [n * int(f) for n, f in zip(shape, factors)]
    if len(sizes) != 4:
        refuse(ctx, f"sizes of {len(sizes)} values for a rank-4 input")
    ana = Analyzer()
    for axis in (0, 1):
        if not ana.can_prove(tirx.const(0, "int64") + sizes[axis] == shape[axis]):
            refuse(ctx, f"resizing axis {axis} (batch or channels) {what}")
    if (mode == "nearest" and coord == "asymmetric" and nearest_mode == "floor"
            and factors is not None):
        y = x
        for axis in (2, 3):
            if factors[axis] != 1:
                y = bb.emit(relax.op.repeat(y, int(factors[axis]), axis=axis))
        return y
    size = relax.ShapeExpr([tirx.const(v, "int64") if isinstance(v, int) else v
                            for v in sizes[2:]])
    if coord == "align_corners" and mode == "linear":
        # topi's align_corners kernel fails to build over symbolic sizes (an IntImm of
        # type float32): the bilinear TE here instead
        return bb.emit_te(_bilinear_align_corners, x, list(size.values),
                          primfunc_name_hint="resize2d")
    return relax.op.image.resize2d(
        x, size=size, roi=[0.0] * 4, layout="NCHW", method=_TOPI_MODE[mode],
        coordinate_transformation_mode=coord, rounding_method=nearest_mode,
        cubic_alpha=float(attrs.get("cubic_coeff_a", -0.75)),
        cubic_exclude=int(attrs.get("exclude_outside", 0)),
        extrapolation_value=float(attrs.get("extrapolation_value", 0.0)))


@register_op("", "Upsample", since=7, until=9, implementation="onnxc", override=True)
def upsample(bb, inputs, attrs, ctx):
    """Upsample (deprecated since opset 10): Resize with asymmetric coordinates, nearest
    rounding down (the reference repeats each element ``scale`` times) or linear; scales
    from the attribute (opset 7) or the constant second input (opset 9)."""
    x = inputs[0]
    in_shape = _static_shape(x)
    scales = np.asarray(attrs["scales"], np.float32) if ctx.opset < 9 and "scales" in attrs \
        else _constant(inputs[1] if len(inputs) > 1 else None)
    if in_shape is None or scales is None or scales is False:
        return previous(upsample)(bb, inputs, attrs, ctx)
    mode = attr_text(attrs.get("mode"), "nearest")
    if mode not in ("nearest", "linear"):
        refuse(ctx, f"attribute mode={mode!r}")
    if scales.size != len(in_shape) or np.any(scales < 1):
        refuse(ctx, f"scales={scales.tolist()} for an input of rank {len(in_shape)} "
                "(one scale >= 1 per axis)")
    axes = list(range(len(in_shape)))
    out_sizes, factors = output_plan(in_shape, axes, scales, None, "stretch")
    return resize_exact(bb, ctx, x, axes, out_sizes, factors, mode=mode, coord="asymmetric",
                        nearest_mode="floor", cubic_a=-0.75, antialias=False,
                        exclude_outside=False, roi=None, extrapolation=0.0)


# --------------------------------------------------------------------------- #
# GridSample: non-finite coordinates as onnxruntime reads them
# --------------------------------------------------------------------------- #

@register("GridSample", since=16, override=True)
def grid_sample(bb, inputs, attrs, ctx):
    """GridSample with onnxruntime's reading of a non-finite grid coordinate: NaN, +Inf and
    -Inf each sample as the normalized coordinate -1 (measured on onnxruntime 1.32 for
    every mode, padding mode and align_corners: the value at -1 comes back, never NaN);
    topi's sampler would turn the coordinate into NaN weights and a NaN output.  The select
    is fused into the sampling kernel (one compare per coordinate, no pass of its own);
    the rest is the converter this one overrides (TVM's)."""
    x, grid = inputs[0], inputs[1]
    dtype = str(grid.ty.dtype)
    if dtype.startswith("float"):
        grid = relax.op.where(relax.op.isfinite(grid), grid, relax.const(-1.0, dtype))
    return previous(grid_sample)(bb, [x, grid] + list(inputs[2:]), attrs, ctx)
