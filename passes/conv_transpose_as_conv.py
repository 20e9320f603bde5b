"""conv_transpose(x, W[C, F, *K]) => conv(pad(x), V[F*S, C, *T]), then the phases
interleaved (depth-to-space) and cropped: transposed convs of few output channels, and 2-D
ones the NCHW[b]c conv rule runs faster than the phase rule.

``pack_conv_transpose`` writes a transposed conv per output phase with the output channel
block as the vector; an output channel count no block divides (an image generator's last
layer, 64 -> 3; a mask head, 16 -> 1; 21 classes) is left to TVM, which convolves an
``s``-times zero-dilated input: ``s^d`` the work, nearly all of it by zeros (pix2pix's last
layer, 128 -> 3, k4 s2 p1 at 128x128: 12.8 ms against onnxruntime's 1.7 on one Zen 4
host).  Here the same sum is one ordinary stride-1 conv whose output channels are the
``F x S`` (``S = prod(s)``) pairs of channel and phase, vectorised over its output pixels
by the conv rules like any conv with few channels::

    o + p = s*q + r:  out[f, o] = sum_{c, t < T} x[c, q - t] * W[c, f, r + s*t]
                                = sum_{c, u < T} xpad[c, q + u] * V[(f, r), c, u]

with ``T = ceil(K / s)`` taps per phase, ``V[(f, r), c, u] = W[c, f, r + s*(T - 1 - u)]``
(zero past ``K``), ``xpad`` ``x`` with ``T - 1`` zeros before and enough after for
``Q = ceil((out + p) / s)`` outputs per axis (the last one rounded up to whole
``COLUMNS`` where that adds little).  The conv's ``[N, F*S, *Q]`` result is
reshaped to ``[N, F, *s, *Q]``, its phase axes moved behind their pixel axes and merged
(``[N, F, *(Q*s)]``) and cropped to ``[p, p + out)``: exactly the products of the
transposed conv, in another order.  The bias add after it fuses into that kernel.

Fires on float32 conv{1,2,3}d_transpose with a constant weight, ``groups == 1``, dilation
1, channels-first layouts, static shapes, some stride > 1, and either an output channel
count that no block of pack_conv_transpose's divides, or 2-D with ``K <= s`` (one tap per
phase: the conv is a 1x1 GEMM; a U-Net's k2 s2 128 -> 64 at 64x64 ran 5.9 -> 3.6 ms one
thread on Zen 4) or at least ``min_channels`` input channels (pix2pix's decoder, 1024 /
512 / 256 -> 512 .. 64, k4 s2 p1 over 2x2 .. 64x64: 43.5 -> 22.6 ms for its 1024 -> 256
layer, the model 0.85 of the phase rule's time).  Narrower blocked ones stay on
pack_conv_transpose's rule, which measured as fast or faster there (64 -> 64 k4 s2 p1 at
56x56: the conv 1.25x its time, with the layout copies a lone op needs), as do 1-D and
3-D ones (a vocoder's k4 s2: 1.06x; a 3-D U-Net's k2 s2: 1.44x).  Before
``convert_layout`` (the new conv takes the layout passes like any other), after
``fold_batchnorm`` (which scales transposed-conv weights).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import emitter, record_calls, rewrite_calls
from .pack_conv_transpose import BLOCKS, LAYOUTS, output_block, phase_taps, static_transposed
from .relax_util import CONVS

# The phase conv's last axis is computed over a multiple of this many columns (the widest
# CPU fp32 vector: AVX-512's 16; AVX2's 8 and NEON's 4 divide it), the extra ones reading
# zero padding and cropped with the rest: an odd width (pix2pix's 129, a 1-D head's 41)
# left the conv rules one-lane or odd tiles, or no rule at all
COLUMNS = 16
# ... when that adds at most this share of columns (a 1-D conv always: no rows repeat the
# waste, and an odd length leaves the reduction rules no vector tile at all)
MAX_WASTE = 1 / 8

RULE = "conv_transpose(x, W) => depth_to_space(conv(pad(x), V[F*S, C, *T])) cropped"


class ConvTransposeAsConv(GraphPass):
    """A strided transposed conv => one stride-1 conv over its phases, interleaved and
    cropped (few output channels; 2-D with one tap per phase or many input channels)."""

    name = "conv_transpose_as_conv"
    opt_level = 2
    options = {"blocks": BLOCKS, "min_channels": 256}

    def rewrite(self, mod, report: PassReport, options: dict):
        blocks = tuple(int(b) for b in options["blocks"])
        low = int(options["min_channels"])
        done = []
        for nd, layouts in LAYOUTS.items():
            mod, rewritten = rewrite_calls(
                mod, f"relax.nn.conv{nd}d_transpose",
                lambda m, call, nd=nd, L=layouts: _as_conv(m, call, nd, L, blocks, low))
            done += rewritten
        record_calls(report, RULE, done)
        return mod


def phase_weight(w: np.ndarray, strides) -> np.ndarray:
    """IO* [C, F, *K] -> V [F * prod(s), C, *T]: ``V[(f, *r), c, *u] = W[c, f, *(r + s*(T - 1
    - u))]``, zero where that tap is past ``K`` (``T = ceil(K / s)``)."""
    c, f, *ks = w.shape
    nd = len(ks)
    t_axes = [2 + 2 * i for i in range(nd)]
    r_axes = [3 + 2 * i for i in range(nd)]
    # each spatial axis as (T, S), then u = T - 1 - t
    wz = np.flip(phase_taps(w, strides), axis=tuple(t_axes))
    v = wz.transpose(1, *r_axes, 0, *t_axes)  # [F, *S, C, *T]
    return np.ascontiguousarray(v.reshape(f * int(np.prod(strides)), c,
                                          *[wz.shape[a] for a in t_axes]))


def _as_conv(m, call, nd: int, layouts, blocks, min_channels: int):
    """``call`` (a relax.nn.conv{nd}d_transpose) as the phase conv, interleaved and cropped,
    emitted through ``m``; None when it does not qualify."""
    found = static_transposed(call, layouts)
    if found is None:
        return None
    w, size, s, pad, out = found
    if all(v == 1 for v in s):
        return None  # TVM's own lowering is a plain conv then: no zeros inserted
    data = call.args[0]
    n, c = (int(d) for d in data.ty.shape.values[:2])
    f, ks = int(w.shape[1]), [int(k) for k in w.shape[2:]]
    if output_block(f, blocks) and not (
            nd == 2 and (all(k <= st for k, st in zip(ks, s)) or c >= min_channels)):
        return None  # pack_conv_transpose's
    if any(p < 0 for p in pad):
        return None
    taps = [-(-k // st) for k, st in zip(ks, s)]
    # at least the input's extent: the conv's output is ``size + after`` long (an end pad of
    # K or more, which ONNX allows, would leave q below it)
    q = [max(-(-(out[i] + pad[i]) // s[i]), size[i]) for i in range(nd)]
    wide = -(-q[-1] // COLUMNS) * COLUMNS
    if nd == 1 or wide - q[-1] <= q[-1] * MAX_WASTE:
        q[-1] = wide  # whole vectors of columns for the conv rules (cropped below)
    x = m.visit_expr(data)
    emit = emitter(m)
    dl, kernel_layout, make = CONVS[nd]
    before = [t - 1 for t in taps]
    after = [max(0, q[i] - size[i]) for i in range(nd)]
    y = emit(make(x, relax.const(phase_weight(w, s)), strides=[1] * nd,
                  padding=[*before, *after], dilation=[1] * nd, groups=1, data_layout=dl,
                  kernel_layout=kernel_layout, out_layout=dl, out_dtype="float32"))
    # [N, F*S, *Q] -> [N, F, *s, *Q] -> [N, F, Q0, s0, Q1, s1, ..] -> [N, F, *(Q*s)]
    y = emit(relax.op.reshape(y, [n, f, *s, *q]))
    order = [0, 1, *[v for i in range(nd) for v in (2 + nd + i, 2 + i)]]
    y = emit(relax.op.permute_dims(y, order))
    y = emit(relax.op.reshape(y, [n, f, *[q[i] * s[i] for i in range(nd)]]))
    return relax.op.strided_slice(y, axes=list(range(2, 2 + nd)), begin=pad[:nd],
                                  end=[pad[i] + out[i] for i in range(nd)])
