"""dense / matmul / batch_matmul on CPUs: register-blocked GEMM vectorised over N.

Matches one reduction block ``C[b.., i, j] += A[b.., i, k] * B[b.., k, j]`` (``B`` may
be broadcast over the batch dims, e.g. a weight ``[K, N]``) with only elementwise blocks
around it.  The micro-kernel keeps ``mr x nr`` outputs in registers (``nr`` = one or two
vectors of ``j``), broadcasts ``A[i, k]`` and does ``mr`` FMAs per vector of ``B``; the
``K x nr`` panel of ``B`` stays in cache across the ``i`` tiles.  The elementwise
epilogue (bias, GELU, residual add) is inlined into the write-back of the tile.
Parallel over (batch, N tiles, M tiles).  Transposed ``B`` (``B[j, k]``) is not matched:
vectorising ``j`` would gather.
"""

from __future__ import annotations


from ..base import MatchingCPURule
from . import common


def match_matmul(sch):
    """(block rv, number of batch dims) of the single NN matmul block, else None."""
    m = common.matmul_block(sch)
    if m is None:
        return None
    rv, ivs, ins = m
    *bat, i, j, k = ivs
    a_ok = b_ok = False
    for r in ins:
        idx = common.region_vars(r)
        if len(idx) >= 2 and idx[-2].same_as(i) and idx[-1].same_as(k):
            a_ok = True
        elif len(idx) >= 2 and idx[-2].same_as(k) and idx[-1].same_as(j):
            b_ok = True
    if not (a_ok and b_ok):
        return None
    return rv, len(bat)


def _b_index(block):
    """Index in ``block.reads`` of B (read at [.., k, j])."""
    *_, j, k = [iv.var for iv in block.iter_vars]
    for n, r in enumerate(block.reads):
        idx = common.region_vars(r)
        if len(idx) >= 2 and idx[-2].same_as(k) and idx[-1].same_as(j):
            return n
    raise ValueError("no B operand")


class MatmulNN(MatchingCPURule):
    """matmul / dense / batch_matmul with B as [.., K, N] + elementwise epilogue."""

    name = "cpu.matmul"

    def match(self, sch):
        return match_matmul(sch)

    def schedule(self, sch, m, target):
        mm, nbat = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, mm, keep_pads=False)
        loops = sch.get_loops(mm)
        *bat, i, j, k = loops
        ext = [common.const_extent(sch, l) for l in loops]
        if any(e is None for e in ext):
            return None
        M, N = ext[-3], ext[-2]
        jt = common.vector_tile(N, lanes)
        nv = -(-jt // lanes)
        it = common.reg_rows(M, nv, common.acc_budget(target, "matmul"))
        io, ii = sch.split(i, [None, it])
        jo, ji = sch.split(j, [None, jt])
        sch.reorder(*bat, jo, io, k, ii, ji)
        panel = M > it
        if panel:  # copy the K x jt panel of B once per column tile: contiguous, reused
            pb = sch.cache_read(mm, _b_index(sch.get(mm)), "global")
            sch.compute_at(pb, jo, preserve_unit_loops=True)
            sch.vectorize(sch.get_loops(pb)[-1])
        wb, pads = common.write_back_at(sch, mm, io, tail, pads, after)
        common.parallel(sch, [*bat, jo] if panel else [*bat, jo, io], ncores)
        sch.unroll(ii)
        sch.vectorize(ji)
        init = sch.decompose_reduction(mm, k)
        sch.vectorize(sch.get_loops(wb)[-1])
        sch.vectorize(sch.get_loops(init)[-1])
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
