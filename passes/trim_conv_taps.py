"""conv(x, W) => conv(x, W[..., live taps]) when some kernel taps only ever read padding.

A dilated conv over a small feature map reads its outer taps from the zero padding at every
output position: DeepLabV3's ASPP branches (3x3, dilation 12 / 24 / 36) over a 20x20 map
(a 320x320 input at output stride 16) have only their centre tap inside the map at dilations
24 and 36, so 8 of 9 taps multiply zeros; a kernel that loops over every tap does 9x the
work (onnxruntime's NCHWc conv skips out-of-bounds taps: 1.8 ms there against 20-25 ms
here, single thread, before this pass).  Along each spatial axis the taps that read the
input at some output position are kept (the range from the first to the last such tap),
the others cut from the constant weight, and the padding shrinks by what they covered, so
the output's size and values are unchanged (exactly: the cut taps only ever added 0 * w).
A conv left with one tap per axis and no padding is a 1x1 conv (dilation 1), which the
pointwise rules take.  Fires on conv1d/2d/3d with a constant weight and static spatial
extents; refuses a trim that would need negative padding.  Runs after fold_pad_into_conv
(explicit Pads become the conv's padding first) and before the rewrites of convs.
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import record_calls, rewrite_calls
from .relax_util import CONVS, static_conv

RULE = "conv(x, W) => conv(x, W[live taps]): taps that only read padding cut"


class TrimConvTaps(GraphPass):
    """Cut the kernel taps of a conv that read only padding at every output position."""

    name = "trim_conv_taps"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        trimmed = []
        for nd in CONVS:
            mod, done = rewrite_calls(mod, f"relax.nn.conv{nd}d",
                                      lambda m, call, nd=nd: _trimmed(m, call, nd))
            trimmed += done
        record_calls(report, RULE, trimmed)
        return mod


def tap_ranges(size: int, out: int, kernel: int, stride: int, dilation: int,
               before: int) -> list:
    """Per tap of one axis, the outputs ``[lo, hi)`` at which it reads inside ``[0,
    size)``: tap ``t`` at output ``o`` reads ``o * stride + t * dilation - before``
    (``lo >= hi``: never).  Also split_dilated_conv's."""
    ranges = []
    for t in range(kernel):
        off = t * dilation - before
        lo = min(out, -(off // stride) if off < 0 else 0)      # ceil(-off / stride)
        hi = min(out, (size - 1 - off) // stride + 1) if size - 1 - off >= 0 else 0
        ranges.append((lo, max(lo, hi)))
    return ranges


def live_taps(size: int, out: int, kernel: int, stride: int, dilation: int,
              before: int) -> tuple[int, int]:
    """The first and last tap of one axis that reads inside ``[0, size)`` at some output
    position (``tap_ranges``).  (-1, -1) when no tap does (the conv reads only padding:
    left alone)."""
    live = [t for t, (lo, hi) in enumerate(tap_ranges(size, out, kernel, stride, dilation,
                                                      before)) if lo < hi]
    return (live[0], live[-1]) if live else (-1, -1)


def _trimmed(m, call, nd: int):
    conv = static_conv(call, nd)
    if conv is None:
        return None
    size, out, w = conv
    make, a, data = CONVS[nd][2], call.attrs, call.args[0]
    padding = [int(p) for p in a.padding]
    before, after = padding[:nd], padding[nd:]
    strides, dilation = [int(s) for s in a.strides], [int(d) for d in a.dilation]
    cuts, new_before, new_after = [], [], []
    for i in range(nd):
        k = w.shape[2 + i]
        first, last = live_taps(size[i], out[i], k, strides[i],
                                dilation[i], before[i])
        if first < 0:
            return None
        nb = before[i] - first * dilation[i]
        na = after[i] - (k - 1 - last) * dilation[i]
        if nb < 0 or na < 0:
            return None
        cuts.append(slice(first, last + 1))
        new_before.append(nb)
        new_after.append(na)
    if all(c.stop - c.start == w.shape[2 + i] for i, c in enumerate(cuts)):
        return None
    trimmed = w[(slice(None), slice(None), *cuts)].copy()
    # a single tap reads at an offset of 0 whatever the dilation: say 1, as a 1x1 conv does
    dilation = [d if trimmed.shape[2 + i] > 1 else 1 for i, d in enumerate(dilation)]
    return make(m.visit_expr(data), relax.const(trimmed), strides=strides,
                padding=new_before + new_after, dilation=dilation, groups=a.groups,
                data_layout=a.data_layout, kernel_layout=a.kernel_layout,
                out_layout=a.out_layout, out_dtype=a.out_dtype)
