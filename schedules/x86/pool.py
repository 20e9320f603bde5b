"""max / average pooling NCHW on x86: the depthwise schedule without weights.

``out[n, c, y, x] = max|sum over (ry, rx) of pad[n, c, y*s + ry, x*s + rx]`` is a
sliding-window reduction per channel, exactly the depthwise conv's loop nest, so it gets
the same schedule (``depthwise.schedule_window``): parallel over channels, the padded
plane built per channel, a register tile of output rows vectorised over the width, taps
unrolled; average pooling's division (by a count that depends on the position) is
applied in the write-back.  Global pooling (a whole-plane reduction) is not matched.
"""

from __future__ import annotations


from ..base import MatchingCPURule
from . import common
from .depthwise import schedule_window


def match_pool(sch):
    """(pool block rv, pad block rv or None) of a 2-D window pooling kernel, else None:
    one reduction block with iters ``SSSSRR`` writing ``out[n, c, y, x]`` from one
    input read at ``[n, c, ., .]``, every other block spatial."""
    m = common.single_reduction(sch, "SSSSRR")
    if m is None:
        return None
    rv, block, (n, c, y, x, ry, rx) = m
    o = common.nchw_fp32_output(block, [n, c, y, x])
    if o is None:
        return None
    out, ins = o
    if len(ins) != 1 or len(ins[0].region) != 4:
        return None
    idx = common.region_vars(ins[0])
    if not (idx[0].same_as(n) and idx[1].same_as(c)):
        return None
    if all(_extent(iv) == 1 for iv in block.iter_vars[2:4]):  # global pooling: one window
        return None
    pad = None
    for p in sch.get_producers(rv):
        if sch.get(p).writes[0].source.same_as(ins[0].source):
            pad = p
    return rv, pad


def _extent(iv):
    return getattr(iv.dom.extent, "value", None)


class Pool2dNCHW(MatchingCPURule):
    """max_pool2d / avg_pool2d NCHW (any window, stride, padding, ceil mode) + epilogue."""

    name = "x86.pool2d_nchw"

    def match(self, sch):
        return match_pool(sch)

    def schedule(self, sch, m, target):
        return schedule_window(sch, m[0], m[1], target)
