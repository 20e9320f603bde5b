"""Any other float32 reduction whose innermost output dim vectorises: a register tile.

``out[s.., y, x] (+|max|min)= f(in..[...]) over r..``: grouped and dilated convs the conv
rules do not take, transposed convs as TVM lowers them, reductions over a non-last axis
(ReduceSum over channels), 1-D and 3-D pooling, depthwise conv1d, matmuls with B read
[k, j].  The innermost spatial loop ``x`` becomes ``nv`` whole vectors (or one partial
vector when its extent has no whole-vector divisor), the next one ``y`` a row count within
the target's accumulator budget; the reduction loops run inside the tile, so the ``y x x``
outputs stay in registers, and the write-back applies the elementwise epilogue.  Parallel
over the outer spatial loops.

It fires only where vectorising over ``x`` reads contiguously: every input is indexed by
``x`` in its last dim only, with stride 1, or not at all (then a broadcast).  An input indexed by ``x``
elsewhere (a row reduction ``sum_k a[x, k]``, a matmul with B read [j, k]) would be a
gather: those are left to the row-reduction, matmul and dlight rules.  Before this rule such
kernels went to dlight's reduction rule or the fallback, which keep one scalar accumulator
(a conv1d at 0.3 GFLOP/s, a grouped 3x3 conv 2-5x behind onnxruntime).
"""

from __future__ import annotations

from ..base import MatchingCPURule
from . import common


def match_tiled_reduction(sch):
    """(block rv, number of spatial iters) of the function's only reduction block when its
    iters are spatial then reduction, it writes one float32 buffer at exactly its spatial
    iters, and every input reads the innermost spatial iter in its last dim or not at all;
    else None."""
    found = common.only_reduction(sch)
    if found is None:
        return None
    rv, kinds = found
    ns = len(kinds) - len(kinds.lstrip("S"))
    if ns == 0 or "S" in kinds[ns:]:
        return None
    block = sch.get(rv)
    ivs = [iv.var for iv in block.iter_vars]
    o = common.fp32_output(block, ivs[:ns], common.FLOAT_OR_KEYS)
    if o is None:
        return None
    if common.lane_reads(o[1], ivs[ns - 1]) is None:
        return None
    return rv, ns


def tile(ny: int, nx: int, lanes: int, budget: int) -> tuple:
    """(yt, xt): ``xt`` = up to 4 whole vectors dividing ``nx`` (or the largest divisor of
    ``nx`` within two vectors when no whole vector divides it), ``yt`` rows (a divisor of
    ``ny``, at most 16) so that ``yt`` x vectors fits ``budget`` accumulators."""
    if nx % lanes == 0:
        nv = max(v for v in (4, 2, 1) if (nx // lanes) % v == 0 and v <= budget)
        xt = nv * lanes
    else:
        xt = common.vector_tile(nx, lanes)
        nv = -(-xt // lanes)
    return common.reg_rows(ny, nv, budget), xt


class TiledReduction(MatchingCPURule):
    """A reduction block vectorised over its innermost output dim, y x x register tile."""

    name = "cpu.tiled_reduction"

    def match(self, sch):
        return match_tiled_reduction(sch)

    def schedule(self, sch, m, target):
        rv, ns = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        budget = common.acc_budget(target, "matmul")
        pads, after, tail = common.inline_around(sch, rv)
        loops = sch.get_loops(rv)
        ext = [common.const_extent(sch, lp) for lp in loops]
        # symbolic reduction loops are fine (a global pool over a symbolic image); the
        # tile is over the spatial ones
        if any(e is None for e in ext[:ns]) or len(loops) != len(sch.get(rv).iter_vars):
            return None
        sp, rd = loops[:ns], loops[ns:]
        yt, xt = tile(ext[ns - 2] if ns >= 2 else 1, ext[ns - 1], lanes, budget)
        if xt < 4:  # too narrow to vectorise: leave it to dlight's rules
            return None
        xo, xi = sch.split(sp[-1], [None, xt])
        if ns >= 2:
            yo, yi = sch.split(sp[-2], [None, yt])
            outer, inner = [*sp[:-2], yo, xo], [yi, xi]
        else:
            outer, inner = [xo], [xi]
        sch.reorder(*outer, *rd, *inner)
        wb, rest = common.write_back_at(sch, rv, outer[-1], tail, pads, after)
        common.parallel(sch, outer, ncores)
        if len(inner) == 2:
            sch.unroll(inner[0])
        sch.vectorize(inner[-1])
        init = sch.decompose_reduction(rv, rd[0])
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(wb)[-1])
        for p in rest:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
