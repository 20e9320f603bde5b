"""matmul with the weight pre-packed [N/nr, K, nr] (passes/pack_matmul_weights.py) on CPUs.

``C[b.., i, j] += A[b.., i, k] * Wp[j // nr, k, j % nr]``.  Each ``K x nr`` panel of the
weight is contiguous, so the micro-kernel reads it straight from memory (no panel copy, as
``cpu.matmul`` must make of a [K, N] weight): an ``mr x nr`` tile of accumulators in
registers, ``nr / lanes`` vector loads of ``Wp[jo, k, :]`` and ``mr`` broadcasts of
``A[i, k]`` per ``mr * nr / lanes`` FMAs.  The elementwise epilogue (bias, GELU, residual
add) is inlined into the write-back of the tile.  Rows padded to whole tiles (A read at
``min(i, M - 1)``) cost no branch in the inner loop: only the write-back checks ``i < M``.
A symbolic M (and batch dims) is fine when rows are so padded: the pass rounds M up to a
multiple of its ``rows`` and the register tile takes a divisor of that.
Panels run outer, each swept by all row tiles; where A outgrows half the L2, a row tile
sweeps a group of 4-8 panels instead (``_panel_group``), so A is read that many times
less.  Parallel over (batch, N panels or panel groups, M tiles).
"""

from __future__ import annotations

from tvm import tirx

from ..base import MatchingCPURule
from . import common


def match_packed_matmul(sch):
    """(block rv, panel width nr, rows clamped) of a matmul reading ``A[.., i, k]`` (or
    ``A[.., min(i, M - 1), k]``: rows padded) and ``Wp[j // nr, k, j % nr]``, writing
    float32 ``C[.., i, j]``, with only spatial blocks around it; else None."""
    m = common.matmul_block(sch)
    if m is None:
        return None
    rv, ivs, ins = m
    *_, i, j, k = ivs
    nr = a_ok = None
    clamped = False
    for r in ins:
        idx = common.region_vars(r)
        shape = r.source.shape
        if len(idx) == 3 and len(shape) == 3 and isinstance(shape[2], tirx.IntImm):
            b = int(shape[2])
            if (_is(idx[0], tirx.FloorDiv, j, b) and idx[1].same_as(k)
                    and _is(idx[2], tirx.FloorMod, j, b)):
                nr = b
                continue
        if len(idx) >= 2 and idx[-1].same_as(k):
            row = idx[-2]
            # min(i, M - 1): rows padded to whole register tiles (pack_matmul_weights)
            if _is_clamp(row, i):
                a_ok = clamped = True
            elif row.same_as(i):
                a_ok = True
    if nr is None or not a_ok:
        return None
    return rv, nr, clamped


def _is_clamp(row, i) -> bool:
    """``min(i, M - 1)``: rows padded past M read row M - 1 (M static or symbolic)."""
    return isinstance(row, tirx.Min) and row.a.same_as(i)


def _is(e, op, var, const) -> bool:
    return (isinstance(e, op) and e.a.same_as(var) and isinstance(e.b, tirx.IntImm)
            and int(e.b) == int(const))


class MatmulPacked(MatchingCPURule):
    """matmul / dense with a [N/nr, K, nr] packed weight + elementwise epilogue."""

    name = "cpu.matmul_packed"

    def match(self, sch):
        return match_packed_matmul(sch)

    def schedule(self, sch, m, target):
        mm, nr, rows_padded = m
        long_tail = None
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, mm, keep_pads=False)
        # W's last panel padded with zero columns: the output is narrower than the tile
        cols_padded = tail is not None and _last_dim(sch, tail) != _last_dim(sch, mm)
        padded = rows_padded or cols_padded
        loops = sch.get_loops(mm)
        *bat, i, j, k = loops
        ext = [common.const_extent(sch, lp) for lp in loops]
        if ext[-2] is None or ext[-1] is None or ext[-2] % nr:
            return None
        M = ext[-3]
        if M is None and not rows_padded and common.opt_extent(sch, loops[-3]) == 1:
            # symbolic rows compiled for one (a decode step: pack_matmul_weights left M
            # unpadded): a row at a time, each weight panel streamed once per row
            M = 1
        if M is None:  # symbolic rows: whole multiples of the pass's row padding, else none
            M = common.row_multiple(sch.get(loops[-3]).extent) if padded else None
            if M is None:
                return None
        nv = -(-nr // lanes)
        budget = common.acc_budget(target, "matmul")
        it = common.reg_rows(M, nv, budget)
        g = _panels_per_row(ext[-2] // nr, nv, budget, ncores) if it == 1 else 1
        io, ii = sch.split(i, [None, it])
        group = _panel_group(ext[-2] // (nr * g), ext[-1], nr * g, target,
                             ext[-3]) if it > 1 else 1
        if group > 1:
            # a group of panels (in L2) per row tile: the tile's rows of A (in L1) serve
            # every panel of the group before the next row tile (see _panel_group)
            jg, jo, ji = sch.split(j, [None, group, nr * g])
            sch.reorder(*bat, jg, io, jo, k, ii, ji)
            at = jo
        else:
            # panels outer: one K x nr panel stays in L2 across the row tiles (rows outer
            # or K blocks of 128-384 measured no faster single-core; panels outer also
            # splits W, not A, between threads)
            jo, ji = sch.split(j, [None, nr * g])
            sch.reorder(*bat, jo, io, k, ii, ji)
            jg, at = jo, io
        wb = sch.cache_write(mm, 0, "local")
        sch.reverse_compute_at(wb, at, preserve_unit_loops=True)
        if tail is not None and _long_epilogue(sch, tail):
            # the tile is stored to a stack tile, then the epilogue runs over it as a
            # vector loop (see _long_epilogue); over padded rows, over the real ones
            sch.reverse_compute_at(tail, at, preserve_unit_loops=True)
            sch.set_scope(wb, 0, "local")
            long_tail = tail
        elif tail is not None and padded:
            # the epilogue covers the M real rows, the tile the padded ones: the tile's
            # write-back is guarded by row, its inner loop is not
            sch.reverse_compute_at(tail, at, preserve_unit_loops=True)
            sch.compute_inline(wb)
            wb = tail
        elif tail is not None:
            sch.reverse_compute_inline(tail)
        else:  # several consumers left: schedule them as their own stages
            pads = pads + after
        # the write-back's rows unrolled, as the tile's: a row loop LLVM keeps (its guard
        # made bigger by a row count of ``batch * seq``) indexes the accumulators, which
        # then stay in memory, stored every k step (GPT-2's flattened rows, seq 64, one
        # thread: 768 x 3072 8.6 -> 5.x ms, onnxruntime 5.4)
        sch.unroll(sch.get_loops(wb)[-2])
        common.parallel(sch, [*bat, jg, io], ncores)
        sch.unroll(ii)
        _vectorize_j(sch, ji, nr * g, lanes)
        init = sch.decompose_reduction(mm, k)
        if not cols_padded:  # else the last panel's write-back is cut at N: left scalar
            _vectorize_j(sch, sch.get_loops(wb)[-1], nr * g, lanes)
        _vectorize_j(sch, sch.get_loops(init)[-1], nr * g, lanes)
        if long_tail is not None:  # rows as a loop: one vector's epilogue at a time
            _vectorize_j(sch, sch.get_loops(long_tail)[-1], nr * g, lanes)
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch


# An epilogue whose printed TIR is longer than this is a long one (GELU's erf: ~50000
# characters; bias, ReLU, a residual add: under 500).
LONG_EPILOGUE_CHARS = 4000


def _long_epilogue(sch, tail) -> bool:
    """True when the elementwise epilogue ``tail`` is long (GELU's erf, a polynomial and an
    exp per element).  Inlined into the unrolled write-back of the register tile, LLVM
    evaluates it for all ``mr x nr`` outputs at once, and its constants and temporaries
    spill: Whisper-base's MLP, [1500, 512] x [512, 2048] + GELU, took 5.5 ms more than the
    matmul alone (one thread), the GELU by itself 1.8 ms.  Such an epilogue runs after the
    tile is stored, over it, one vector at a time."""
    return len(str(sch.get(tail).body)) > LONG_EPILOGUE_CHARS


# Weight panels one row tile sweeps, at most (16 measured 1.04-1.08x the time of 8), and
# at least (groups of 2, what K = 2048-3072 panels allow, measured 1.02-1.06x the time of
# single panels at 2 threads: their A row tiles outgrow L1 anyway)
MAX_PANEL_GROUP = 8
MIN_PANEL_GROUP = 4


def _panel_group(panels: int, k: int, nr: int, target, m=None) -> int:
    """Weight panels (``K x nr`` floats each) a row tile sweeps before the next row tile:
    the largest divisor of ``panels`` up to :data:`MAX_PANEL_GROUP` whose panels fit half
    the L2 (``targets.l2_bytes``), or 1 below :data:`MIN_PANEL_GROUP`, or when A (``m``
    rows of ``k``; None: symbolic) fits in half the L2.  With one panel
    per sweep, all of A streams once per panel: from L3 once A outgrows L2 (ViT-B/384's
    [577, 768], Whisper's [1500, 512]), 96 times for a 3072-wide weight; a group of g
    panels reads A g times less.  Paired, one thread, emeraldrapids (2 MB L2), matmul +
    bias, 1 panel -> 8: 1500x512x2048 0.79, 577x768x3072 0.85 (2 threads 0.87),
    257x1024x2816 0.92, 197x768x3072 0.93 (0.96), 128x768x3072 0.97 (0.99), 50x768x3072
    0.95 (1.03); 4 panels within 5% of 8, 16 panels 1.04-1.08x of 8.  Where A stays in
    L2 the groups gave nothing at two threads in whole models (GPT-2, seq 128: paired
    1.03; wav2vec2, 49 rows: 1.08), so A must outgrow half the L2."""
    budget = common.l2_bytes(target) // 2
    if m is None or m * k * 4 <= budget:
        return 1
    fits = [d for d in common.divisors(panels)
            if d <= MAX_PANEL_GROUP and d * k * nr * 4 <= budget]
    group = max(fits, default=1)
    return group if group >= MIN_PANEL_GROUP else 1


def _panels_per_row(panels: int, nv: int, budget: int, ncores: int) -> int:
    """Weight panels a one-row tile covers: the largest divisor of ``panels`` whose
    accumulators (``nv`` vectors a panel) fit ``budget``, leaving at least two tasks per
    core.  One panel is ``nv`` accumulators, each k step an FMA chain on each: a row of
    one panel waited on the FMA latency.  Zen 3, one thread, x[1, seq, 768] @ W[768, 2304]
    in cache (opt-1 build, onnxruntime in the same run): seq 1 0.73 -> 0.41 ms (onnxruntime
    0.38-0.47), seq 64 12.1 -> 6.1 ms; from DRAM (scripts/bench_gemv.py, 8 copies)
    768x2304 1.13 -> 0.76x onnxruntime, 3072x768 1.02 -> 0.84x, the LM head 768x50257 (its
    3142 panels: 2 a row) unchanged."""
    best = 1
    for d in common.divisors(panels):
        if d * nv <= budget and panels // d >= 2 * ncores:
            best = d
    return best


def _last_dim(sch, blk):
    return int(sch.get(blk).writes[0].source.shape[-1])


def _vectorize_j(sch, loop, nr, lanes):
    """Vectorise a j loop of ``nr``: whole vectors unrolled when nr is several of them (LLVM
    splits a 48-lane vector badly), else the loop as it is."""
    if nr > lanes and nr % lanes == 0:
        vo, loop = sch.split(loop, [None, lanes])
        sch.unroll(vo)
    sch.vectorize(loop)
