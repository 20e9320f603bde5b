"""onnxc's converters for the signal ops TVM 0.27 lacks: the Blackman, Hamming and Hann
windows, MelWeightMatrix, DFT and STFT.

Windows and the mel matrix depend on their scalar inputs only: they are computed at compile
time with numpy (as ONNX's reference does) and become constants.  DFT and STFT are matrix
products with cos/sin matrices computed at compile time (an O(n^2) DFT, exact for any
length).  Scalar inputs (sizes, lengths, axis, frame step) must be constants; a graph input
there raises ``UnsupportedError`` and ``compiler.specialize`` binds the fed value.
"""

from __future__ import annotations

import numpy as np
from onnx import helper
from tvm import relax

from .common import (register, refuse, static_shape, np_dtype, dtype_of, is_float,
                     tensor_const, const_input)




def _scalar_input(ctx, x, what: str):
    """The value of a constant scalar (or one-element) input, as a numpy scalar."""
    value = np.asarray(const_input(x, what, ctx.node))
    if value.size != 1:
        refuse(ctx, f"{what} of shape {list(value.shape)} (a scalar expected)")
    return value.reshape(())[()]


def _output_dtype(ctx, attrs, default: int = 1):
    code = int(attrs.get("output_datatype", default))
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(code))
    except Exception:  # noqa: BLE001  (unknown or non-numpy type code)
        refuse(ctx, f"output_datatype={code}")


# --------------------------------------------------------------------------- #
# Windows and the mel weight matrix (compile-time constants)
# --------------------------------------------------------------------------- #


def _window(kind: str):
    def convert(bb, inputs, attrs, ctx):
        size = int(_scalar_input(ctx, inputs[0], "size"))
        if size < 0:
            refuse(ctx, f"size={size}")
        dtype = _output_dtype(ctx, attrs)
        periodic = int(attrs.get("periodic", 1))
        denom = size if periodic else size - 1
        n = np.arange(size, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            if kind == "blackman":
                w = 0.42 - 0.5 * np.cos(2 * np.pi * n / denom) + 0.08 * np.cos(
                    4 * np.pi * n / denom)
            elif kind == "hamming":
                alpha = 25.0 / 46.0
                w = alpha - (1 - alpha) * np.cos(2 * np.pi * n / denom)
            else:
                w = np.sin(np.pi * n / denom) ** 2
        return tensor_const(w.astype(dtype))

    convert.__doc__ = (f"{kind.capitalize()}Window of a constant size, periodic or symmetric, "
                       "in output_datatype (a compile-time constant).")
    return convert


register("BlackmanWindow", since=17)(_window("blackman"))
register("HammingWindow", since=17)(_window("hamming"))
register("HannWindow", since=17)(_window("hann"))


@register("MelWeightMatrix", since=17)
def mel_weight_matrix(bb, inputs, attrs, ctx):
    """MelWeightMatrix (dft_length // 2 + 1, num_mel_bins) from constant inputs, computed
    as ONNX's reference does (triangular filters on the HTK mel scale)."""
    names = ["num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
             "upper_edge_hertz"]
    vals = [_scalar_input(ctx, x, w) for x, w in zip(inputs, names)]
    num_mel_bins, dft_length, sample_rate = (int(v) for v in vals[:3])
    lower, upper = vals[3], vals[4]   # numpy scalars of the inputs' type, as the reference
    if num_mel_bins <= 0 or dft_length <= 0 or sample_rate <= 0:
        refuse(ctx, f"num_mel_bins={num_mel_bins}, dft_length={dft_length}, "
                f"sample_rate={sample_rate}")
    bins = np.arange(0, num_mel_bins + 2)
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    step = (high_mel - low_mel) / bins.shape[0]
    freq = 700 * np.expm1((bins * step + low_mel) / 2595 * np.log(10))
    freq = (((dft_length + 1) * freq) // sample_rate).astype(int)
    n_spec = dft_length // 2 + 1
    if freq.min() < 0 or freq.max() >= n_spec + 1:
        refuse(ctx, f"edge frequencies [{lower}, {upper}] outside [0, sample_rate / 2]")
    out = np.zeros((n_spec + 1, num_mel_bins))
    for i in range(num_mel_bins):
        left, center, right = freq[i], freq[i + 1], freq[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return tensor_const(out[:n_spec].astype(_output_dtype(ctx, attrs)))


# --------------------------------------------------------------------------- #
# DFT as matrix products
# --------------------------------------------------------------------------- #


def _move_last(x, axis: int, rank: int):
    perm = [i for i in range(rank) if i != axis] + [axis]
    return relax.op.permute_dims(x, perm) if axis != rank - 1 else x


def _move_back(x, axis: int, rank: int):
    if axis == rank - 1:
        return x
    perm = list(range(rank - 1))
    perm.insert(axis, rank - 1)
    return relax.op.permute_dims(x, perm)


def _dft(bb, ctx, x, axis: int, length: int, inverse: bool, onesided: bool):
    """DFT of x (..., 1 real | 2 real/imag) along ``axis`` (not the last) with ``length``
    points; the input is truncated or zero-padded to ``length`` (to length // 2 + 1 for the
    one-sided inverse).  Returns (..., 2), or (..., 1) for the one-sided inverse."""
    dims = static_shape(x)
    rank = len(dims)
    dtype = dtype_of(x)
    if not is_float(dtype):
        refuse(ctx, f"input of type {dtype}")
    if dims[-1] not in (1, 2):
        refuse(ctx, f"input of last dimension {dims[-1]} (1 or 2)")
    if not 0 <= axis < rank - 1:
        refuse(ctx, f"axis {axis} for an input of rank {rank}")
    if length < 1:
        refuse(ctx, f"dft_length={length}")
    if inverse and onesided and dims[-1] != 2:
        refuse(ctx, "the one-sided inverse of a real input")
    complex_in = dims[-1] == 2
    n_in = dims[axis]
    n_rows = min(n_in, length // 2 + 1 if (inverse and onesided) else length)
    n_out = length // 2 + 1 if (onesided and not inverse) else length

    def part(k):
        p = relax.op.strided_slice(x, axes=[rank - 1], begin=[k], end=[k + 1])
        p = relax.op.squeeze(p, axis=[rank - 1])
        if n_rows < n_in:
            p = relax.op.strided_slice(p, axes=[axis], begin=[0], end=[n_rows])
        return bb.emit(_move_last(p, axis, rank - 1))

    xr = part(0)
    xi = part(1) if complex_in else None
    # rows: input positions (times; frequencies for the one-sided inverse), columns: outputs
    rows = np.arange(n_rows, dtype=np.int64).reshape(-1, 1)
    cols = np.arange(n_out, dtype=np.int64).reshape(1, -1)
    angle = 2 * np.pi * ((rows * cols) % length) / length
    cos, sin = np.cos(angle), np.sin(angle)
    npdt = np_dtype(dtype)

    def mat(m):
        return relax.const(np.ascontiguousarray(m).astype(npdt), dtype)

    def mm(a, m):
        return relax.op.matmul(a, mat(m))

    if inverse and onesided:
        # irfft: Hermitian spectrum; DC (and Nyquist for an even length) counted once, their
        # imaginary parts ignored
        w = np.full((n_rows, 1), 2.0)
        w[0] = 1.0
        sin_w = sin * w
        sin_w[0] = 0.0
        if length % 2 == 0 and length // 2 < n_rows:
            w[length // 2] = 1.0
            sin_w[length // 2] = 0.0
        y = relax.op.subtract(mm(xr, cos * w / length), mm(xi, sin_w / length))
        y = _move_back(bb.emit(y), axis, rank - 1)
        return relax.op.expand_dims(y, rank - 1)
    sign = 1.0 if inverse else -1.0          # exp(sign * i * angle)
    scale = 1.0 / length if inverse else 1.0
    c, s = cos * scale, sin * sign * scale
    yr = mm(xr, c)
    yi = mm(xr, s)
    if xi is not None:
        yr = relax.op.subtract(yr, mm(xi, s))
        yi = relax.op.add(yi, mm(xi, c))
    yr = _move_back(bb.emit(yr), axis, rank - 1)
    yi = _move_back(bb.emit(yi), axis, rank - 1)
    return relax.op.concat([relax.op.expand_dims(yr, rank - 1),
                            relax.op.expand_dims(yi, rank - 1)], axis=rank - 1)


@register("DFT", since=17)
def dft(bb, inputs, attrs, ctx):
    """DFT (opsets 17-19: axis attribute; 20+: axis input, default -2): forward or inverse,
    one-sided (rfft / irfft), optional dft_length; real (..., 1) or complex (..., 2) input."""
    x = inputs[0]
    rank = len(static_shape(x))
    length_in = inputs[1] if len(inputs) > 1 else None
    if ctx.opset >= 20:
        axis_in = inputs[2] if len(inputs) > 2 else None
        axis = -2 if axis_in is None else int(_scalar_input(ctx, axis_in, "axis"))
    else:
        axis = int(attrs.get("axis", 1))
    if not -rank <= axis < rank:
        refuse(ctx, f"axis={axis} for an input of rank {rank}")
    axis %= rank
    inverse = bool(attrs.get("inverse", 0))
    onesided = bool(attrs.get("onesided", 0))
    if length_in is not None:
        length = int(_scalar_input(ctx, length_in, "dft_length"))
    elif inverse and onesided:
        length = 2 * (static_shape(x)[axis] - 1)
    else:
        length = static_shape(x)[axis]
    return _dft(bb, ctx, x, axis, length, inverse, onesided)


@register("STFT", since=17)
def stft(bb, inputs, attrs, ctx):
    """STFT of (batch, length, 1 | 2) signals: frames of frame_length every frame_step,
    weighted by the window (ones without one), DFT of each frame (one-sided by default)."""
    x = inputs[0]
    inputs = list(inputs) + [None] * (4 - len(inputs))
    step = int(_scalar_input(ctx, inputs[1], "frame_step"))
    window, length_in = inputs[2], inputs[3]
    dims = static_shape(x)
    if len(dims) != 3:
        refuse(ctx, f"signal of shape {dims} ((batch, length, 1 or 2) expected)")
    if length_in is not None:
        frame = int(_scalar_input(ctx, length_in, "frame_length"))
    elif window is not None:
        frame = static_shape(window)[0]
    else:
        frame = dims[1]
    if window is not None and static_shape(window) != [frame]:
        refuse(ctx, f"window of shape {static_shape(window)} for frame_length {frame}")
    if step < 1 or frame < 1 or frame > dims[1]:
        refuse(ctx, f"frame_step={step}, frame_length={frame} for a signal of length "
                f"{dims[1]}")
    onesided = bool(attrs.get("onesided", 1))
    n_frames = 1 + (dims[1] - frame) // step
    idx = np.arange(n_frames).reshape(-1, 1) * step + np.arange(frame).reshape(1, -1)
    frames = bb.emit(relax.op.take(x, tensor_const(idx.astype(np.int64)), axis=1))
    if window is not None:        # (batch, frames, frame, c) * (frame, 1)
        w = window if dtype_of(window) == dtype_of(x) else relax.op.astype(window, dtype_of(x))
        frames = bb.emit(relax.op.multiply(frames, relax.op.reshape(w, [frame, 1])))
    return _dft(bb, ctx, frames, 2, frame, False, onesided)
