"""conv2d NHWC x HWIO (``--layout NHWC``) on CPUs.

``out[n, y, x, f] += pad[n, y*s + ry, x*s + rx, c] * w[ry, rx, c, f]``: output channels
are contiguous in both the weight and the output, so they are the vector.  A register tile
of ``xt`` output pixels x ``fv`` channel vectors stays in registers; per input channel it
loads ``fv`` weight vectors and broadcasts ``xt`` input values into them (the same
micro-kernel as NCHW[b]c, with the whole channel axis as the block).  The write-back is
contiguous along ``f`` and applies the elementwise epilogue.  Padding stays its own stage.
Parallel over (n, y, channel tile).  Depthwise and grouped NHWC convs are not matched (the
fallback takes them).
"""

from __future__ import annotations

from ..base import MatchingCPURule
from . import common

def match_nhwc_conv(sch):
    """(block rv,) of a conv reading ``data[n, ., ., rc]`` and ``w[ry, rx, rc, f]`` and
    writing ``out[n, y, x, f]``, with only spatial blocks around it; else None."""
    m = common.single_reduction(sch, "SSSSRRR")
    if m is None:
        return None
    rv, block, (n, y, x, f, ry, rx, rc) = m
    o = common.fp32_output(block, [n, y, x, f])  # any 4-D fp32 output indexed so
    if o is None:
        return None
    _, ins = o
    if len(ins) != 2:
        return None
    data = weight = None
    for r in ins:
        idx = common.region_vars(r)
        if len(idx) == 4 and idx[0].same_as(n) and idx[3].same_as(rc):
            data = idx
        elif len(idx) == 4 and common.same_vars(idx, [ry, rx, rc, f]):
            weight = idx
    if data is None or weight is None:
        return None
    return (rv,)


def tile(ow: int, f: int, lanes: int, budget: int = 20) -> tuple:
    """(xt, ft): ``xt`` pixels (a divisor of ``ow``) x ``ft`` channels (whole vectors,
    a divisor of ``f``) within ``budget`` accumulators, fewest loads per FMA."""
    best, best_cost = (1, f if f < lanes else lanes), None
    for fv in (4, 3, 2, 1):
        ft = fv * lanes
        if f % ft:
            continue
        for xt in common.divisors(ow):
            if xt > 16 or xt * fv > budget:
                continue
            cost = (1 / fv + 1 / xt, -xt)
            if best_cost is None or cost < best_cost:
                best, best_cost = (xt, ft), cost
    return best


class Conv2dNHWC(MatchingCPURule):
    """conv2d NHWC x HWIO weights + elementwise epilogue."""

    name = "cpu.conv2d_nhwc"

    def match(self, sch):
        return match_nhwc_conv(sch)

    def schedule(self, sch, m, target):
        (conv,) = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, conv)
        loops = sch.get_loops(conv)
        ext = [common.const_extent(sch, lp) for lp in loops]
        if any(e is None for e in ext) or ext[3] % lanes:
            return None
        n, y, x, f, ry, rx, rc = loops
        xt, ft = tile(ext[2], ext[3], lanes, common.acc_budget(target))
        xo, xi = sch.split(x, [None, xt])
        fo, fi = sch.split(f, [None, ft])
        fv, fl = sch.split(fi, [None, lanes])
        sch.reorder(n, y, fo, xo, ry, rx, rc, xi, fv, fl)
        wb, pads = common.write_back_at(sch, conv, xo, tail, pads, after)
        common.parallel(sch, [n, y, fo], ncores)
        sch.unroll(rx)
        sch.unroll(xi)
        sch.unroll(fv)
        sch.vectorize(fl)
        init = sch.decompose_reduction(conv, ry)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(wb)[-1])
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
