"""conv(x, W) => the sum over taps of 1x1 convs, each over the outputs its tap reaches, when
most of a dilated conv's (output, tap) pairs read padding.

A dilated conv over a feature map not much larger than its dilation reads padding at many
of its taps: DeepLabV3's ASPP branch with dilation 12 over a 20x20 map (a 320x320 input at
output stride 16) finds its outer rows and columns of taps inside the map at only 8 of 20
output rows / columns, so 64% of its multiply-adds are by zeros (dilations 24 and 36 there
leave only the centre tap: ``trim_conv_taps`` cuts the rest).  A kernel that loops over
every tap does all of them (onnxruntime's NCHWc conv skips the out-of-bounds taps: 7.9 ms
against our 17.7, one Zen 4 core).

Here such a conv becomes, per tap ``t`` with outputs ``[lo_t, hi_t)`` along each axis that
read inside the input, ``conv1x1(x[.., lo_t*s + t*d - before :: s], W[.., t])`` (no
padding, the tap's weight), zero-padded back to the output's extent, all summed: exactly
the same products (the cut ones were all by padding zeros), in a different order.  Each
tap's weight is kept once (a split into regions would copy the weights of every tap set).
The 1x1 convs take the pointwise rules (NCHW[b]c after convert_layout), the pads and adds
fuse into one kernel with the conv's epilogue.

Fires on conv1d/2d/3d with a constant weight, default layouts, static extents, some
dilation > 1, and at least ``min_waste`` of its multiply-adds reading padding; after
``trim_conv_taps`` (whose cut taps would count as waste here) and ``fold_batchnorm`` (which
matches a BatchNormalization on a conv, not on the sum), before ``convert_layout``.
"""

from __future__ import annotations

import itertools

import numpy as np
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import emitter, record_calls, rewrite_calls
from .relax_util import CONVS, static_conv
from .trim_conv_taps import tap_ranges

RULE = "conv(x, W) => sum of per-tap 1x1 convs over the outputs each tap reads inside x"


class SplitDilatedConv(GraphPass):
    """Split a dilated conv that mostly reads padding into per-tap 1x1 convs."""

    name = "split_dilated_conv"
    opt_level = 1
    # the fraction of a conv's multiply-adds that read padding from which it is split
    # (DeepLab's dilation-12 ASPP branch over 20x20: 0.64; over 65x65: 0.23; a 3x3
    # dilation-2 conv over 28x28: 0.08)
    options = {"min_waste": 0.3}

    def rewrite(self, mod, report: PassReport, options: dict):
        min_waste = float(options["min_waste"])
        split = []
        for nd in CONVS:
            mod, done = rewrite_calls(mod, f"relax.nn.conv{nd}d",
                                      lambda m, call, nd=nd: _split(m, call, nd, min_waste))
            split += done
        record_calls(report, RULE, split)
        return mod


def wasted(ranges: list, out: list) -> float:
    """The fraction of (output, tap) pairs that read padding, over all axes."""
    live = np.prod([sum(hi - lo for lo, hi in r) for r in ranges], dtype=np.float64)
    total = np.prod([o * len(r) for o, r in zip(out, ranges)], dtype=np.float64)
    return 1.0 - live / total


def _split(m, call, nd: int, min_waste: float):
    data_layout, kernel_layout, make = CONVS[nd]
    a, data = call.attrs, call.args[0]
    dilation = [int(d) for d in a.dilation]
    conv = static_conv(call, nd) if any(d > 1 for d in dilation) else None
    if conv is None:
        return None
    size, out, w = conv
    padding = [int(p) for p in a.padding]
    strides = [int(s) for s in a.strides]
    ranges = [tap_ranges(size[i], out[i], w.shape[2 + i], strides[i], dilation[i],
                         padding[i]) for i in range(nd)]
    if wasted(ranges, out) < min_waste:
        return None
    x = m.visit_expr(data)
    emit = emitter(m)

    # the tap reaching the most outputs first: its term needs the least padding
    taps = [t for t in itertools.product(*[range(len(r)) for r in ranges])
            if all(ranges[i][t[i]][0] < ranges[i][t[i]][1] for i in range(nd))]
    taps.sort(key=lambda t: -np.prod([ranges[i][t[i]][1] - ranges[i][t[i]][0]
                                      for i in range(nd)]))
    total = None
    for t in taps:
        lo = [ranges[i][t[i]][0] for i in range(nd)]
        hi = [ranges[i][t[i]][1] for i in range(nd)]
        begin = [lo[i] * strides[i] + t[i] * dilation[i] - padding[i] for i in range(nd)]
        end = [begin[i] + (hi[i] - lo[i] - 1) * strides[i] + 1 for i in range(nd)]
        src = x
        if begin != [0] * nd or end != size or any(s > 1 for s in strides):
            src = emit(relax.op.strided_slice(x, axes=list(range(2, 2 + nd)), begin=begin,
                                              end=end, strides=strides))
        tap_w = np.ascontiguousarray(w[(slice(None), slice(None), *t)]).reshape(
            w.shape[:2] + (1,) * nd)
        term = emit(make(src, relax.const(tap_w), strides=[1] * nd, padding=[0] * (2 * nd),
                         dilation=[1] * nd, groups=a.groups, data_layout=data_layout,
                         kernel_layout=kernel_layout, out_layout=data_layout,
                         out_dtype=a.out_dtype))
        if lo != [0] * nd or hi != out:
            pad = [0, 0, 0, 0] + [v for i in range(nd) for v in (lo[i], out[i] - hi[i])]
            term = emit(relax.op.nn.pad(term, pad))
        total = term if total is None else emit(relax.op.add(total, term))
    return total
