"""Reductions over the innermost, contiguous axis on CPUs: vector partial sums (rfactor).

``out[s..] (+|max|min)= f(x[s.., r.., k])``: ReduceSum / ReduceMean / ReduceMax over the
last axes or over everything, the ``mean(x^2)`` of an RMS norm followed by its per-element
normalisation.  Before this rule they went to the fallback (a reduce-all over
[1, 512, 3000]: one scalar add chain, 4 cycles per element, 9.8x behind onnxruntime) or
to dlight's reduction rule (scalar as well).  Here the innermost reduction loop ``k`` is
split ``(ko, ki)`` with ``ki`` = ``v`` whole vectors (the most of 4, 3, 2, 1 that divides
its extent; half vectors when no whole one does) and rfactored over ``ki``: ``v``
independent vector accumulators hide the add latency, their init is hoisted out of the
loop, a short loop folds the ``ki`` partials.  The partial sums are computed per output
(outer spatial loops fused and parallel; a reduce-all runs on one core); the elementwise
blocks after the reduction become parallel, vectorised stages.

Fires only where vectorising ``ki`` reads contiguously: every input is indexed by ``k`` in
its last dim only, with stride 1.  Row kernels that end in an elementwise row block
(softmax, layer norm) are ``cpu.row_reduction``'s; reductions vectorisable over an output
dim are ``cpu.tiled_reduction``'s (both come first in the rule list).
"""

from __future__ import annotations

from tvm.s_tir.schedule import ScheduleError

from ..base import MatchingCPURule
from . import common


def match_inner_reduction(sch):
    """(block rv, number of spatial iters) of the function's only reduction block when its
    iters are spatial then reduction (at least one), it writes one float32 buffer, and every
    input reads the last reduction iter in its last dim only, with stride 1; else None."""
    found = common.only_reduction(sch)
    if found is None:
        return None
    rv, kinds = found
    ns = len(kinds) - len(kinds.lstrip("S"))
    if "S" in kinds[ns:]:
        return None
    block = sch.get(rv)
    if len(block.writes) != 1 or block.writes[0].source.dtype != "float32":
        return None
    k = block.iter_vars[-1].var
    out = block.writes[0].source
    ins = [r for r in block.reads if not r.source.same_as(out)]
    if not ins:
        return None
    for r in ins:
        idx = common.region_vars(r)
        if not idx or any(common.uses_var(e, k) for e in idx[:-1]) \
                or not common.uses_var(idx[-1], k) or not common.unit_stride(idx[-1], k):
            return None
    return rv, ns


def vector_width(extent: int, lanes: int) -> int | None:
    """``v * w`` lanes of partial sums: ``w`` a whole vector, or half of one when no whole
    vector divides ``extent`` (3000 frames on AVX-512), ``v`` the most of 4, 3, 2, 1 that
    divides it with at least two steps left to reduce; None when neither divides."""
    for w in (lanes, lanes // 2):
        for v in (4, 3, 2, 1):
            if w >= 4 and extent % (v * w) == 0 and extent >= 2 * v * w:
                return v * w
    return None


class InnerReduction(MatchingCPURule):
    """A reduction over its innermost contiguous axis: vector partial sums, then a fold."""

    name = "cpu.inner_reduction"

    def match(self, sch):
        return match_inner_reduction(sch)

    def schedule(self, sch, m, target):
        rv, ns = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        loops = sch.get_loops(rv)
        if len(loops) != len(sch.get(rv).iter_vars):
            return None
        kext = common.const_extent(sch, loops[-1])
        width = None if kext is None else vector_width(kext, lanes)
        if width is None:
            return None
        name = sch.get(rv).name_hint
        _, after, _ = common.inline_around(sch, rv)
        rv = sch.get_sblock(name)
        _, ki = sch.split(sch.get_loops(rv)[-1], [None, width])
        out_rank = len(sch.get(rv).writes[0].source.shape)
        try:
            rf = sch.rfactor(ki, out_rank)
        except ScheduleError:
            # a reducer TVM does not know: ReduceMax / ReduceMin start from -inf / +inf,
            # not the registered identity min_value / max_value (which would turn an
            # all -inf input into -3.4e38)
            return None
        if ns:
            # per output: the partial sums of one row, then their fold; rows in parallel
            row_loops = sch.get_loops(rv)[:ns]
            row = sch.fuse(*row_loops) if ns > 1 else row_loops[0]
            sch.compute_at(rf, row, preserve_unit_loops=True)
            rf_loops = sch.get_loops(rf)
            # compute_at puts ki (now spatial) outside the reduction loops: move it inside
            ki_rf = rf_loops[1]
            sch.reorder(*rf_loops[2:], ki_rf)
            if ncores > 1 and (common.const_extent(sch, row) or 2) >= 2:
                sch.parallel(row)
        rf_loops = sch.get_loops(rf)
        sch.vectorize(rf_loops[-1])
        # the partial sums' init hoisted out of the loop (inside it: 4x slower measured)
        init = sch.decompose_reduction(rf, rf_loops[1 if ns else 0])
        sch.vectorize(sch.get_loops(init)[-1])
        for blk in after:
            common.schedule_elementwise(sch, blk, lanes, ncores)
        return sch
