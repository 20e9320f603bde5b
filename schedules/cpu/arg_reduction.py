"""ArgMax / ArgMin over a non-last axis on CPUs: lanes of the innermost output dim.

Matches the function's only reduction block when it writes two buffers at exactly its
spatial iters, an integer index and a float32 value (onnxc's NaN-aware argmax / argmin,
``compiler/lowering/legalize_reductions.py``: a tuple reducer written as selects), and
every input reads the innermost spatial iter ``x`` in its last dim with stride 1 (or not
at all): ArgMax over the classes of a segmentation map ``[1, 21, H, W]``, over channels.
The fallback (no rule matched) runs one output at a time with the reduction innermost: a
chain of dependent compare-and-selects per output, ~5 ns an element, latency bound.  Here
``x`` is split into a tile of two fp32 vectors' worth of outputs (16 on AVX2, 32 on
AVX-512) inside the reduction, so each reduction step updates ``xt`` independent outputs
(no dependent chain) reading ``xt`` contiguous inputs; parallel over the outer spatial
loops.  The tile's loop stays serial: TVM 0.27's ``vectorize`` of this select chain gives
WRONG results (every lane the index of one lane: 89% of a [1, 21, 256, 256] ArgMax wrong),
and caching the tile "local" or unrolling it measured no faster.  The reduction order per
output is unchanged (same results, ties and NaNs as the legalization's reducer).
A reduction over the last axis reads ``x`` nowhere and is left to the next rules; the
ArgMax / ArgMin converter turns a long one (a decoder's vocabulary) into lanes of
independent folds (``legalize_reductions.arg_partial_compute``), which this rule tiles:
[1, 32000] 185 -> 18 us (onnxruntime 48) on an Emerald Rapids host, 2 threads.
"""

from __future__ import annotations

from ..base import MatchingCPURule
from . import common


def match_arg_reduction(sch):
    """(block rv, number of spatial iters) of the only reduction block when its iters are
    spatial then reduction, it writes an integer and a float32 buffer at exactly its
    spatial iters, and every input reads the innermost spatial iter in its last dim with
    stride 1 (some input at all); else None."""
    found = common.only_reduction(sch)
    if found is None:
        return None
    rv, kinds = found
    ns = len(kinds) - len(kinds.lstrip("S"))
    if ns == 0 or "S" in kinds[ns:]:
        return None
    block = sch.get(rv)
    ivs = [iv.var for iv in block.iter_vars]
    if len(block.writes) != 2:
        return None
    dtypes = sorted(str(w.source.dtype)[:3] for w in block.writes)
    if dtypes != ["flo", "int"] or not any(str(w.source.dtype) == "float32"
                                           for w in block.writes):
        return None
    if not all(common.same_vars(common.region_vars(w), ivs[:ns]) for w in block.writes):
        return None
    written = [w.source for w in block.writes]
    ins = [r for r in block.reads if not any(r.source.same_as(w) for w in written)]
    return (rv, ns) if common.lane_reads(ins, ivs[ns - 1]) else None


class ArgReduction(MatchingCPURule):
    """ArgMax / ArgMin over a non-last axis: a tile of the innermost output dim per step."""

    name = "cpu.arg_reduction"

    def match(self, sch):
        return match_arg_reduction(sch)

    def schedule(self, sch, m, target):
        rv, ns = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, rv, keep_pads=False)
        loops = sch.get_loops(rv)
        ext = [common.const_extent(sch, lp) for lp in loops]
        if any(e is None for e in ext) or len(loops) != len(sch.get(rv).iter_vars):
            return None
        sp, rd = loops[:ns], loops[ns:]
        nx = ext[ns - 1]
        xt = max(d for d in common.divisors(nx) if d <= 2 * lanes)
        if xt < 4:  # too few independent outputs per step: leave it to the next rules
            return None
        xo, xi = sch.split(sp[-1], [None, xt])
        sch.reorder(*sp[:-1], xo, *rd, xi)
        common.parallel(sch, [*sp[:-1], xo], ncores)
        sch.decompose_reduction(rv, rd[0])
        for p in pads + after:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
