"""onnxc's converters for small default-domain ops TVM 0.27 lacks: activations (Celu, Elu
with float16, Swish, SwiGLU), LpNormalization, CenterCropPad, ReverseSequence,
TensorScatter, Det and Col2Im.

Each follows the ONNX spec and its reference implementation (``onnx/reference/ops``) and
refuses, with an ``UnsupportedError`` naming the node, what it does not implement.  Inputs
that fix output shapes (CenterCropPad's ``shape``, Col2Im's ``image_shape``) must be
constants; a graph input there raises ``UnsupportedError``, and ``compiler.specialize``
then binds the fed value (small integer inputs) and compiles again.
"""

from __future__ import annotations

import itertools

import numpy as np
from tvm import relax

from .converters import _const_input
from .converters_nn import _dtype, _is_float, _refuse, _scalar, _shape, _text
from .registry import register_op


def _register(op, since=1):
    return register_op("", op, since=since, implementation="onnxc")


def _float_only(ctx, x, what="input"):
    if not _is_float(_dtype(x)):
        _refuse(ctx, f"{what} of type {_dtype(x)}")


def _axis(ctx, axis: int, rank: int, what="axis") -> int:
    if not -rank <= axis < rank:
        _refuse(ctx, f"{what}={axis} for an input of rank {rank}")
    return axis % rank


def _int_values(ctx, x, what: str) -> list[int]:
    """The values of a constant integer input (see the module docstring)."""
    return [int(v) for v in np.asarray(_const_input(x, what, ctx.node)).reshape(-1)]


# --------------------------------------------------------------------------- #
# Activations
# --------------------------------------------------------------------------- #


@_register("Celu", since=12)
def celu(bb, inputs, attrs, ctx):
    """Celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)), in the input's type."""
    x = inputs[0]
    _float_only(ctx, x)
    dtype = _dtype(x)
    alpha = float(attrs.get("alpha", 1.0))
    if alpha == 0:
        _refuse(ctx, "alpha=0")
    zero = _scalar(0, dtype)
    neg = relax.op.multiply(
        _scalar(alpha, dtype),
        relax.op.subtract(relax.op.exp(relax.op.divide(x, _scalar(alpha, dtype))),
                          _scalar(1, dtype)))
    return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(zero, neg))


@_register("Elu", since=6)
def elu(bb, inputs, attrs, ctx):
    """Elu: x if x >= 0 else alpha * (exp(x) - 1), with constants of the input's type
    (TVM 0.27's converter builds float32 constants and fails on float16)."""
    x = inputs[0]
    _float_only(ctx, x)
    dtype = _dtype(x)
    alpha = float(attrs.get("alpha", 1.0))
    neg = relax.op.multiply(_scalar(alpha, dtype),
                            relax.op.subtract(relax.op.exp(x), _scalar(1, dtype)))
    return relax.op.where(relax.op.less(x, _scalar(0, dtype)), neg, x)


def _swish(x, alpha: float):
    """x * sigmoid(alpha * x) in x's type."""
    dtype = _dtype(x)
    scaled = x if alpha == 1.0 else relax.op.multiply(_scalar(alpha, dtype), x)
    return relax.op.multiply(x, relax.op.sigmoid(scaled))


@_register("Swish", since=24)
def swish(bb, inputs, attrs, ctx):
    """Swish: x * sigmoid(alpha * x)."""
    _float_only(ctx, inputs[0])
    return _swish(inputs[0], float(attrs.get("alpha", 1.0)))


@_register("SwiGLU", since=28)
def swiglu(bb, inputs, attrs, ctx):
    """SwiGLU: Swish_alpha(A) * B, A and B of the same shape and type (no broadcasting)."""
    a, b = inputs[0], inputs[1]
    _float_only(ctx, a, "A")
    if _dtype(a) != _dtype(b) or _shape(a) != _shape(b):
        _refuse(ctx, f"A {_shape(a)} {_dtype(a)} with B {_shape(b)} {_dtype(b)} (same shape "
                "and type required)")
    return relax.op.multiply(_swish(a, float(attrs.get("alpha", 1.0))), b)


# --------------------------------------------------------------------------- #
# LpNormalization
# --------------------------------------------------------------------------- #


@_register("LpNormalization", since=1)
def lp_normalization(bb, inputs, attrs, ctx):
    """LpNormalization, p = 1 (sum of |x|) or 2 (Euclidean) along ``axis``; a zero norm
    gives 0 (as ONNX's reference and test data)."""
    x = inputs[0]
    _float_only(ctx, x)
    dtype = _dtype(x)
    axis = _axis(ctx, int(attrs.get("axis", -1)), x.ty.ndim)
    p = int(attrs.get("p", 2))
    if p == 1:
        norm = relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True)
    elif p == 2:
        norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True))
    else:
        _refuse(ctx, f"p={p} (1 or 2)")
    norm = bb.emit(norm)
    zero = _scalar(0, dtype)
    is_zero = relax.op.equal(norm, zero)
    safe = relax.op.where(is_zero, _scalar(1, dtype), norm)
    return relax.op.where(is_zero, zero, relax.op.divide(x, safe))


# --------------------------------------------------------------------------- #
# CenterCropPad
# --------------------------------------------------------------------------- #


@_register("CenterCropPad", since=18)
def center_crop_pad(bb, inputs, attrs, ctx):
    """CenterCropPad: crop (the extra element on the right when odd) or zero-pad (the extra
    element on the right when odd) each of ``axes`` to the constant ``shape``."""
    x, shape_in = inputs[0], inputs[1]
    dims = _shape(x)
    rank = len(dims)
    target = _int_values(ctx, shape_in, "shape")
    axes = attrs.get("axes")
    axes = list(range(rank)) if axes is None else [_axis(ctx, int(a), rank, "axes")
                                                   for a in axes]
    if len(set(axes)) != len(axes) or len(target) != len(axes):
        _refuse(ctx, f"shape of {len(target)} values for axes {axes}")
    pads = [[0, 0] for _ in range(rank)]
    for a, want in zip(axes, target):
        have = dims[a]
        if want < 0:
            _refuse(ctx, f"negative target size {want}")
        if want < have:
            start = (have - want) // 2
            x = bb.emit(relax.op.strided_slice(x, axes=[a], begin=[start], end=[start + want]))
        elif want > have:
            before = (want - have) // 2
            pads[a] = [before, want - have - before]
    if any(p != [0, 0] for p in pads):
        width = [v for p in pads for v in p]  # (before, after) per axis
        x = relax.op.nn.pad(x, width, pad_value=0.0)
    return x


# --------------------------------------------------------------------------- #
# ReverseSequence
# --------------------------------------------------------------------------- #


@_register("ReverseSequence", since=10)
def reverse_sequence(bb, inputs, attrs, ctx):
    """ReverseSequence: reverse the first sequence_lens[b] steps along ``time_axis`` of each
    batch entry, as one GatherElements (lengths past the time size reverse all of it)."""
    x, lens = inputs[0], inputs[1]
    dims = _shape(x)
    rank = len(dims)
    if rank < 2:
        _refuse(ctx, f"input of rank {rank} (2 or more expected)")
    batch_axis = int(attrs.get("batch_axis", 1))
    time_axis = int(attrs.get("time_axis", 0))
    if sorted((batch_axis, time_axis)) != [0, 1]:
        _refuse(ctx, f"batch_axis={batch_axis}, time_axis={time_axis} (0 and 1)")
    steps = dims[time_axis]
    shape_t = [1] * rank
    shape_t[time_axis] = steps
    shape_b = [1] * rank
    shape_b[batch_axis] = dims[batch_axis]
    t = relax.const(np.arange(steps, dtype=np.int64).reshape(shape_t), "int64")
    n = relax.op.astype(lens, "int64") if _dtype(lens) != "int64" else lens
    n = relax.op.minimum(relax.op.reshape(n, shape_b), _scalar(steps, "int64"))
    n = bb.emit(n)
    rev = relax.op.subtract(relax.op.subtract(n, _scalar(1, "int64")), t)
    idx = bb.emit(relax.op.where(relax.op.less(t, n), rev, t))
    idx = bb.emit(relax.op.broadcast_to(idx, dims))
    return relax.op.gather_elements(x, idx, axis=time_axis)


# --------------------------------------------------------------------------- #
# TensorScatter
# --------------------------------------------------------------------------- #


@_register("TensorScatter", since=24)
def tensor_scatter(bb, inputs, attrs, ctx):
    """TensorScatter: write ``update`` into ``past_cache`` along ``axis`` at each batch
    entry's write index (0 without ``write_indices``); ``circular`` wraps around.  Written
    as out[j] = update[j - w] where 0 <= j - w (mod max length) < update length, else
    past[j]."""
    past, update = inputs[0], inputs[1]
    widx = inputs[2] if len(inputs) > 2 else None
    mode = _text(attrs.get("mode"), "linear")
    if mode not in ("linear", "circular"):
        _refuse(ctx, f"mode={mode!r}")
    dims, udims = _shape(past), _shape(update)
    rank = len(dims)
    axis = _axis(ctx, int(attrs.get("axis", -2)), rank)
    if axis == 0 or len(udims) != rank or any(
            d != u for i, (d, u) in enumerate(zip(dims, udims)) if i != axis) \
            or udims[axis] > dims[axis]:
        _refuse(ctx, f"past_cache {dims} with update {udims} on axis {axis}")
    length, seq = dims[axis], udims[axis]
    shape_j = [1] * rank
    shape_j[axis] = length
    j = relax.const(np.arange(length, dtype=np.int64).reshape(shape_j), "int64")
    shape_b = [1] * rank
    shape_b[0] = dims[0]
    if widx is None:
        w = relax.const(np.zeros(shape_b, np.int64), "int64")
    else:
        w = relax.op.reshape(relax.op.astype(widx, "int64"), shape_b)
    s = relax.op.subtract(j, w)
    if mode == "circular":
        s = relax.op.floor_mod(s, _scalar(length, "int64"))
    s = bb.emit(s)
    valid = bb.emit(relax.op.logical_and(relax.op.greater_equal(s, _scalar(0, "int64")),
                                         relax.op.less(s, _scalar(seq, "int64"))))
    src = relax.op.clip(s, 0, seq - 1) if seq > 0 else s
    gshape = list(dims)
    idx = bb.emit(relax.op.broadcast_to(src, gshape))
    gathered = bb.emit(relax.op.gather_elements(update, idx, axis=axis))
    return relax.op.where(relax.op.broadcast_to(valid, gshape), gathered, past)


# --------------------------------------------------------------------------- #
# Det
# --------------------------------------------------------------------------- #

_DET_MAX = 6  # Laplace expansion over column subsets: n * 2^n small products


@_register("Det", since=11)
def det(bb, inputs, attrs, ctx):
    """Det of (..., n, n) matrices by Laplace expansion along rows, memoised over column
    subsets (exact arithmetic order, no pivoting); n up to 6."""
    x = inputs[0]
    _float_only(ctx, x)
    dims = _shape(x)
    if len(dims) < 2 or dims[-1] != dims[-2]:
        _refuse(ctx, f"input of shape {dims} (square matrices (..., n, n) expected)")
    n = dims[-1]
    if n > _DET_MAX:
        _refuse(ctx, f"matrices of size {n} (at most {_DET_MAX})")
    batch = dims[:-2]
    rank = len(dims)
    if n == 0:
        return relax.op.ones(batch, _dtype(x))
    entry = {}
    for r in range(n):
        for c in range(n):
            e = relax.op.strided_slice(x, axes=[rank - 2, rank - 1], begin=[r, c],
                                       end=[r + 1, c + 1])
            entry[r, c] = bb.emit(relax.op.reshape(e, batch))
    # minor[cols] = det of rows n-len(cols).. over the sorted column subset cols
    minor = {(c,): entry[n - 1, c] for c in range(n)}
    for size in range(2, n + 1):
        row = n - size
        for cols in itertools.combinations(range(n), size):
            acc = None
            for k, c in enumerate(cols):
                rest = cols[:k] + cols[k + 1:]
                term = relax.op.multiply(entry[row, c], minor[rest])
                if acc is None:
                    acc = term
                elif k % 2:
                    acc = relax.op.subtract(acc, term)
                else:
                    acc = relax.op.add(acc, term)
            minor[cols] = bb.emit(acc)
    return minor[tuple(range(n))]


# --------------------------------------------------------------------------- #
# Col2Im
# --------------------------------------------------------------------------- #


@_register("Col2Im", since=18)
def col2im(bb, inputs, attrs, ctx):
    """Col2Im: sum the (N, C * prod(block), L) columns back into (N, C, *image_shape),
    with strides, dilations and pads; image_shape and block_shape must be constants."""
    from tvm import te, tirx

    x = inputs[0]
    dims = _shape(x)
    image = _int_values(ctx, inputs[1], "image_shape")
    block = _int_values(ctx, inputs[2], "block_shape")
    nd = len(image)
    if len(dims) != 3 or len(block) != nd or nd == 0:
        _refuse(ctx, f"input of shape {dims} with image_shape {image} and block_shape {block}")
    strides = list(attrs.get("strides", [1] * nd))
    dil = list(attrs.get("dilations", [1] * nd))
    pads = list(attrs.get("pads", [0] * (2 * nd)))
    if len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd or \
            min(strides + dil + block) < 1 or min(pads) < 0:
        _refuse(ctx, f"strides={strides}, dilations={dil}, pads={pads} for {nd} spatial axes")
    ksize = int(np.prod(block))
    nblocks = [(image[i] + pads[i] + pads[i + nd] - dil[i] * (block[i] - 1) - 1) // strides[i]
               + 1 for i in range(nd)]
    if dims[1] % ksize or min(nblocks) < 1 or int(np.prod(nblocks)) != dims[2]:
        _refuse(ctx, f"input of shape {dims}: expects C * {ksize} rows and "
                f"{int(np.prod(nblocks))} blocks {nblocks}")
    n, channels = dims[0], dims[1] // ksize
    offsets = list(itertools.product(*[range(b) for b in block]))

    def compute(t):
        def value(b, c, *pos):
            acc = tirx.const(0, t.dtype)
            for k, off in enumerate(offsets):
                ok, flat = None, None
                for i in range(nd):
                    q = pos[i] + pads[i] - off[i] * dil[i]
                    idx = tirx.floordiv(q, strides[i])
                    cond = tirx.all(q >= 0, tirx.floormod(q, strides[i]) == 0,
                                    idx < nblocks[i])
                    ok = cond if ok is None else tirx.all(ok, cond)
                    flat = idx if flat is None else flat * nblocks[i] + idx
                flat = tirx.max(tirx.min(flat, dims[2] - 1), 0)
                acc = acc + tirx.Select(ok, t[b, c * ksize + k, flat], tirx.const(0, t.dtype))
            return acc

        return te.compute([n, channels] + image, value, name="col2im")

    return bb.emit_te(compute, x, primfunc_name_hint="col2im")
