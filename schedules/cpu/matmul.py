"""dense / matmul / batch_matmul on CPUs: register-blocked GEMM vectorised over N, any M / N.

Matches one reduction block ``C[b.., i, j] += A[b.., i, k] * B[b.., k, j]``, or with ``B``
transposed (``B[b.., j, k]``: Q @ K^T), ``B`` possibly broadcast over the batch dims (a
weight ``[K, N]``), with only elementwise blocks around it.

The micro-kernel keeps ``mr x nr`` outputs in registers (``nr`` = one or two vectors of
``j``, ``common.gemm_tile`` chooses by cost), broadcasts ``A[i, k]`` and does ``mr`` FMAs
per vector of ``B``.  M and N that no tile divides (197, 577, 77) are padded up to whole
tiles (``pad_einsum``): the padded rows of ``A`` are copied per row tile, the padded
columns of ``B`` per column panel, so the inner loop has no branch; only the write-back
checks the bounds.  ``B``'s ``K x nr`` panel is copied once per column tile, contiguous
and laid out ``[k, j]`` whatever ``B``'s layout, and stays in cache across the row tiles;
where the row tiles run outer, all of ``B`` is copied once ahead, panel after panel.
The elementwise epilogue (scale, mask add, bias, GELU) is inlined into the write-back of
the tile.  Parallel over (batch, N tiles).

A single row (GEMV, decoding: M = 1) has no rows to reuse a panel: the rule streams ``B``
row by row instead (``k`` outer, contiguous ``j`` inner, the output row block in L1), also
over a symbolic K (decoding's P V reduces over the past).  A single row against a
transposed ``B`` (decoding's Q K^T over the key cache ``[.., past + 1, K]``) is a dot
product per output of two contiguous K-vectors: vector FMAs into one accumulator, a
horizontal sum, the epilogue (scale, mask) applied to the sum; ``B`` is read once in place,
with no padded, transposed panel copy and no pass over a padded C.  A symbolic M whose
dim the compile optimises for 1 (``dims={"seq": (1, 128, 1)}``, what examples/generate.py
compiles a decoder with) takes these one-row schedules too: every decode step runs them,
a prefill runs its rows one after another.

Symbolic extents (``seq`` in attention: ``Q K^T`` is seq x seq, ``P V`` reduces over seq)
take the padded path: a symbolic M or N is always padded to whole tiles (the tile chosen
for ``SYMBOLIC_EXTENT`` rows / columns), a symbolic K or batch needs nothing.  With a
symbolic M and constant batch loops that give every core a share (attention's heads), A
is padded once per batch and the batch loops are the parallel ones (per column tile, the
pad copied A seq / 16 times: Q K^T [1,12,16,16] 47-53 -> 34-41 us, static 20-25).
"""

from __future__ import annotations

from ..base import MatchingCPURule
from . import common

# The size a symbolic M or N is tiled for (a typical sequence length).
SYMBOLIC_EXTENT = 128
# The most bytes of (padded) B that a row of tiles sweeps (from L2) when N is no whole
# number of tiles; a larger B keeps the column-panel order and a separate cut of C.
ROWWISE_B_BYTES = 1 << 19
# A row block's padded outputs (it x N' floats) up to this are cut once per row block, not
# per column tile (see Matmul.schedule): half the smallest current L1 (32 KB)
CUT_ROW_BYTES = 16 << 10


def match_matmul(sch):
    """(block rv, number of batch dims, B transposed, B in the standard layout) of the
    single matmul block reading ``A[.., i, k]`` and ``B[.., k, j]`` or ``B[.., j, k]``; else
    None.  A sequence-major key/value cache (``passes/seq_major_cache.py``) is a B read at
    ``[j, b, h // rep, k]`` (transposed) or ``[k, b, h // rep, j]``: the row of B an output
    reads is still contiguous, but the row axis leads; only the one-row schedules, which
    work on the loops alone, take such a B (``standard`` False)."""
    m = common.matmul_block(sch)
    if m is None:
        return None
    rv, ivs, ins = m
    *bat, i, j, k = ivs
    a_ok = False
    b_t = None
    standard = True
    for r in ins:
        idx = common.region_vars(r)
        if len(idx) < 2:
            return None
        if all(_batch_index(e, bat) for e in idx[:-2]):
            if idx[-2].same_as(i) and idx[-1].same_as(k):
                a_ok = True
                continue
            if idx[-2].same_as(k) and idx[-1].same_as(j):
                b_t = False
                continue
            if idx[-2].same_as(j) and idx[-1].same_as(k):
                b_t = True
                continue
        row = next((v for v in (j, k) if idx[-1].same_as(v)), None)
        other = k if row is j else j
        lead = [e for e in idx[:-1] if not _batch_index(e, bat, grouped=True)]
        if row is None or len(lead) != 1 or not lead[0].same_as(other):
            return None
        b_t, standard = row is k, False
    if not a_ok or b_t is None:
        return None
    return rv, len(bat), b_t, standard


def _batch_index(e, bat, grouped: bool = False) -> bool:
    """A batch dimension of an operand is read at a batch var or a constant (broadcast);
    ``grouped``: or at ``batch var // constant`` (grouped-query attention's shared heads)."""
    from tvm import tirx

    if isinstance(e, tirx.IntImm) or any(e.same_as(b) for b in bat):
        return True
    return grouped and isinstance(e, tirx.FloorDiv) and isinstance(e.b, tirx.IntImm) and \
        any(e.a.same_as(b) for b in bat)


def _operand_index(block, transposed: bool) -> int:
    """Index in ``block.reads`` of B (read at [.., k, j], or [.., j, k] when transposed)."""
    *_, j, k = [iv.var for iv in block.iter_vars]
    want = (j, k) if transposed else (k, j)
    for n, r in enumerate(block.reads):
        idx = common.region_vars(r)
        if len(idx) >= 2 and idx[-2].same_as(want[0]) and idx[-1].same_as(want[1]):
            return n
    raise ValueError("no B operand")


def _vectorize_const(sch, loop) -> None:
    """Vectorise ``loop`` unless its extent is symbolic (a K of seq): TVM vectorises only
    constant extents on fixed-width targets; LLVM may still vectorise the serial loop."""
    if common.const_extent(sch, loop) is not None:
        sch.vectorize(loop)


def _shares(sch, loops) -> int:
    """The product of ``loops``' constant extents (the parallel work a symbolic batch
    is sure to have: attention's 12 heads)."""
    n = 1
    for lp in loops:
        n *= common.const_extent(sch, lp) or 1
    return n


def _producer_of(sch, block_rv, buffer):
    """The block among ``block_rv``'s producers that writes ``buffer``, else None."""
    for p in sch.get_producers(block_rv):
        if any(w.source.same_as(buffer) for w in sch.get(p).writes):
            return p
    return None


def _split_last_tiles(sch, jo, io, rows: bool, cols: bool):
    """Partition the last row tile (``rows``) and the last column tile (``cols``) off their
    loops: the full tiles' bounds checks simplify away (vector write-back, no select in
    the inner loop), only the last tiles keep them.  Returns the loop of full column tiles
    (to run in parallel) when ``jo`` was partitioned, else None."""
    if rows:
        sch.annotate(io, "pragma_loop_partition_hint", 1)
    if cols:
        sch.annotate(jo, "pragma_loop_partition_hint", 1)
    return None


def _schedule_row(sch, mm, tail, stages, N, K, lanes, ncores):
    """One output row (GEMV, decoding): ``k`` outer, the row's columns inner, so ``B`` streams
    contiguously (a register tile would read it a column panel at a time, one page per
    ``k``); the row block (at most 1024 columns) accumulates in L1, ``ku`` rows of ``B``
    per load/store of it (one over a symbolic K)."""
    *bat, i, j, k = sch.get_loops(mm)
    chunk = max(d for d in common.divisors(N) if d % lanes == 0 and d <= 1024)
    ku = 1 if K is None else max(u for u in (4, 2, 1) if K % u == 0)
    jc, jv, jl = sch.split(j, [None, chunk // lanes, lanes])
    ko, ki = sch.split(k, [None, ku])
    sch.reorder(*bat, jc, i, ko, jv, ki, jl)
    wb = sch.cache_write(mm, 0, "global")
    sch.reverse_compute_at(wb, jc, preserve_unit_loops=True)
    if tail is not None:
        sch.reverse_compute_inline(tail)
    common.parallel(sch, [*bat, jc], ncores)
    sch.unroll(ki)
    sch.vectorize(jl)
    init = sch.decompose_reduction(mm, ko)
    for blk in (wb, init):
        _, v = sch.split(sch.get_loops(blk)[-1], [None, lanes])
        sch.vectorize(v)
    for p in stages:
        common.schedule_elementwise(sch, p, lanes, ncores)
    return sch


def _schedule_dot_rows(sch, mm, nbat, tail, stages, lanes, ncores):
    """One row of A against the rows of a transposed B ``[.., N, K]``, K whole vectors: per
    output, ``K / lanes`` vector FMAs of two contiguous K-vectors into one accumulator
    (``rfactor`` over the lanes, the accumulator in registers), a horizontal sum, then the
    epilogue on that output.  Parallel over the batch (attention's heads) when it gives
    every core a share, else over blocks of ``DOT_ROWS`` outputs too."""
    *bat, i, j, k = sch.get_loops(mm)
    _, kl = sch.split(k, [None, lanes])
    rf = sch.rfactor(kl, factor_axis=nbat + 2)
    *bat, i, j, kl = sch.get_loops(mm)
    jo = None
    if _shares(sch, bat) < ncores:
        jo, j = sch.split(j, [None, DOT_ROWS])
        sch.reorder(jo, i)
    sch.compute_at(rf, j, preserve_unit_loops=True)
    sch.set_scope(rf, 0, "local")
    if tail is not None:
        sch.reverse_compute_at(tail, j, preserve_unit_loops=False)
    common.parallel(sch, [*bat] + ([jo] if jo is not None else []), ncores)
    loops = sch.get_loops(rf)
    at = next(n for n, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(j)))
    # rfactor put the lanes first and the k blocks last (unit loops kept: K = one vector)
    rkl, rko = loops[at + 1], loops[-1]
    sch.reorder(rko, rkl)
    sch.vectorize(rkl)
    init = sch.decompose_reduction(rf, rko)
    sch.vectorize(sch.get_loops(init)[-1])
    for p in stages:
        common.schedule_elementwise(sch, p, lanes, ncores)
    return sch


def _width(n, lanes: int) -> int | None:
    """The vector width of a one-row schedule over a constant extent ``n``: the target's
    ``lanes`` when they divide it, else half of them when that divides it and is at least
    8 (a full AVX2 vector): a head size of 8 or 40 on AVX-512 runs 8-lane vectors rather
    than the fallback (decoding's QK^T over a seq-major cache had no other rule)."""
    if n is None:
        return None
    if n % lanes == 0:
        return lanes
    half = lanes // 2
    return half if half >= 8 and n % half == 0 else None


# Outputs per parallel task of ``_schedule_dot_rows`` when the batch is too small to share.
DOT_ROWS = 64


class Matmul(MatchingCPURule):
    """matmul / dense / batch_matmul, B as [.., K, N] or [.., N, K], + elementwise epilogue."""

    name = "cpu.matmul"

    def match(self, sch):
        return match_matmul(sch)

    def schedule(self, sch, m, target):
        mm, nbat, b_t, standard = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, mm, keep_pads=False)
        ext = [common.const_extent(sch, lp) for lp in sch.get_loops(mm)]
        M, N, K = ext[-3:]
        stages = pads if tail is not None else pads + after
        one_row = M == 1 or (M is None and common.opt_extent(sch, sch.get_loops(mm)[-3]) == 1)
        # one row: vectors over N (B streamed), or over K (dot rows of a transposed B)
        width = _width(K if b_t else N, lanes) if one_row else None
        if width and not b_t:
            return _schedule_row(sch, mm, tail, stages, N, K, width, ncores)
        if width:
            return _schedule_dot_rows(sch, mm, nbat, tail, stages, width, ncores)
        if not standard:  # the padded tiles below copy B's panels as [.., j, k] / [.., k, j]
            return None
        it, jt = common.gemm_tile(M or SYMBOLIC_EXTENT, N or SYMBOLIC_EXTENT, lanes,
                                  common.acc_budget(target, "matmul"))
        padded = M is None or N is None or M % it or N % jt
        a_pad = b_pad = None
        rows = []
        if padded:
            # whole tiles: zero rows of A / columns of B in copies, C_pad cut back to C
            block = sch.get(mm)
            b_buf = block.reads[_operand_index(block, b_t)].source
            a_buf = [r.source for r in block.reads if not r.source.same_as(b_buf)
                     and not r.source.same_as(block.writes[0].source)][0]
            sch.pad_einsum(mm, [1] * nbat + [it, jt, 1])
            block = sch.get(mm)
            for r in block.reads:
                p = _producer_of(sch, mm, r.source)
                if p is not None and sch.get(p).name_hint == f"{a_buf.name}_pad":
                    a_pad = p
                elif p is not None and sch.get(p).name_hint == f"{b_buf.name}_pad":
                    b_pad = p
            (cut,) = sch.get_consumers(mm)  # C = C_pad[:M, :N]
            if tail is not None or after:
                sch.compute_inline(cut)
            else:
                tail = after = cut
            if N is None or N % jt:
                # a write-back guarded by column is scalar code as long as the tile's FMAs
                # (K = 64): whole tiles go to C_pad, the cut (and epilogue) is a stage
                rows = [tail] if tail is not None else after
                pads, after, tail = pads, [], None
        # N no whole tiles (QK^T over 197 or 1500 tokens): rows of tiles, B packed once
        # ahead, so the padded columns are cut off each tile while it is in L1, not in a
        # pass over C
        rowwise = (M is not None and N is not None and N % jt != 0 and len(rows) == 1
                   and K is not None and K * -(-N // jt) * jt * 4 <= ROWWISE_B_BYTES)
        # M padded, N whole tiles, B small (attention's P V over 1381 tokens, [1381, 64]):
        # B packed once ahead, row tiles outer, so A's padded it x K rows are copied once
        # per row tile, not once per column tile ([3,1381,1381] @ [3,1381,64] with the pad
        # below in whole vectors: 85 -> 40 ms, znver3 2 threads, time_evaluator)
        a_rows = (not rowwise and a_pad is not None and M is not None and N is not None
                  and K is not None and N % jt == 0 and K * N * 4 <= ROWWISE_B_BYTES)
        *bat, i, j, k = sch.get_loops(mm)
        pack_cut = None
        io, ii = sch.split(i, [None, it])
        jo, ji = sch.split(j, [None, jt])
        sch.reorder(*bat, *((io, jo) if rowwise or a_rows else (jo, io)), k, ii, ji)
        panel = M is None or M > it or b_t or b_pad is not None
        if panel:  # copy the K x jt panel of B once per column tile: contiguous, reused
            # (row-wise: all of B once, ahead of the tiles)
            pb = sch.cache_read(mm, _operand_index(sch.get(mm), b_t), "global")
            if not (rowwise or a_rows):
                sch.compute_at(pb, jo, preserve_unit_loops=True)
            if b_pad is not None:
                sch.compute_inline(b_pad)
            if rowwise or a_rows:
                # all of B packed ahead: panel-major [.., N/jt, K, jt], each tile's K x jt
                # panel contiguous (as [.., K, N] rows N apart a tile touched K pages:
                # Whisper's [8, 1500, 64] QK^T 0.88x the time, Zen 3, one thread)
                if b_t:
                    sch.transform_layout(pb, ("write", 0), lambda *x: (
                        *x[:-2], x[-2] // jt, x[-1], x[-2] % jt))
                    *_, pj, pk = sch.get_loops(pb)
                else:
                    sch.transform_layout(pb, ("write", 0), lambda *x: (
                        *x[:-2], x[-1] // jt, x[-2], x[-1] % jt))
                    *_, pk, pj = sch.get_loops(pb)
                # panel by panel, a row's jt columns one vector (contiguous stores; loads
                # contiguous too unless B is transposed): a vector over all N scattered
                # its stores across the panels, and a column guard or a transposed read
                # left the loop scalar, with a division per element (ViT's [12, 197, 64]
                # QK^T packed B in ~1/4 of its time, znver5); the last panel keeps the
                # guard
                pjo, pji = sch.split(pj, [None, jt])
                sch.reorder(pjo, pk, pji)
                sch.vectorize(pji)
                if b_pad is not None and N is not None and N > jt:
                    pack_cut = (pjo, N // jt)  # at the end: a partition makes new blocks
            elif b_t:  # laid out [k, j] as a [.., k, j] B is: the same micro-kernel
                sch.transform_layout(pb, ("write", 0), lambda *x: (*x[:-2], x[-1], x[-2]))
                *_, pj, pk = sch.get_loops(pb)
                sch.reorder(pk, pj)
            if b_pad is None and not b_t and not (rowwise or a_rows):
                # a column guard or a transposed read would scalarise TVM's vector loop;
                # LLVM vectorises the serial one (masked loads): 1.3x on ViT's QK^T
                _vectorize_const(sch, sch.get_loops(pb)[-1])
        a_once = a_pad is not None and M is None and _shares(sch, bat) >= ncores
        if a_once:  # a symbolic M: A's seq x K rows padded once per batch, not per tile
            sch.compute_at(a_pad, bat[-1], preserve_unit_loops=True)
            _vectorize_const(sch, sch.get_loops(a_pad)[-1])
        elif a_pad is not None:  # the tile's it x K rows of A, zero past M
            sch.compute_at(a_pad, io, preserve_unit_loops=True)
            # whole vectors and a tail: a K of 1381 as one 1381-lane vector was 1.6x slower
            common.vectorize_row(sch, a_pad, lanes)
        wb = sch.cache_write(mm, 0, "local")
        sch.reverse_compute_at(wb, jo if rowwise or a_rows else io, preserve_unit_loops=True)
        if tail is not None and padded:
            # the epilogue covers the real outputs, the tile the padded ones: the write-back
            # is guarded, the inner loop is not
            sch.reverse_compute_at(tail, jo if a_rows else io, preserve_unit_loops=True)
            sch.compute_inline(wb)
            wb = tail
        elif tail is not None:
            sch.reverse_compute_inline(tail)
        else:  # several consumers left (or a padded cut): schedule them as their own stages
            pads = pads + after
        # the cut of a row block's padded columns (and its epilogue): once per row block
        # when the block's it x N' outputs fit CUT_ROW_BYTES, a loop over the N real columns
        # whose only guard is the row's (scalar, outside the vectors); else per column tile
        # (a cut of Whisper's 36 KB row blocks went through L2 on Zen 3: [8, 1500, 64] QK^T
        # 0.82-0.86x the time per tile), whose column guard TVM keeps in every tile and so
        # scalarises the copy: ViT's [12, 197, 64] QK^T spent 40% of its time there
        # (znver5, one thread: 561 us against 332 for the whole tiles of [198, 224])
        cut_rows = rowwise and it * -(-N // jt) * jt * 4 <= CUT_ROW_BYTES
        if rowwise:
            cut = rows.pop()
            sch.reverse_compute_at(cut, io if cut_rows else jo, preserve_unit_loops=True)
        if (rowwise or a_rows) and panel:  # B packed ahead: over its batch loops
            common.parallel(sch, sch.get_loops(pb)[:-3], ncores)
        common.parallel(sch, bat if a_once else [*bat, io] if rowwise or a_rows
                        else [*bat, jo] if panel else [*bat, jo, io], ncores)
        sch.unroll(ii)
        sch.vectorize(ji)
        init = sch.decompose_reduction(mm, k)
        sch.vectorize(sch.get_loops(wb)[-1])
        sch.vectorize(sch.get_loops(init)[-1])
        if rowwise and not cut_rows:
            # the full column tiles' copy is whole vectors once TVM's loop partitioning
            # splits the last (guarded) tile off
            sch.vectorize(sch.get_loops(cut)[-1])
            sch.annotate(jo, "pragma_loop_partition_hint", 1)
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        for r in rows:  # rows of N, not whole vectors: LLVM vectorises the serial loop
            common.parallel(sch, sch.get_loops(r)[:-1], ncores)
        if cut_rows:  # last: whole vectors, then the row's tail (a partition: new blocks)
            common.vectorize_row(sch, cut, lanes)
        if pack_cut is not None:  # B's whole panels apart from the guarded last one
            sch.loop_partition(pack_cut[0], [pack_cut[1], None])
        return sch
