"""Row kernels on CPUs (softmax, layer norm, RMS norm): per row, vectorised reductions.

Matches functions whose blocks all share leading spatial axes (the rows) and reduce only
over the last axis, ending in an elementwise block: ``max -> exp -> sum -> divide``
(softmax), ``sum -> mean -> var_sum -> normalise`` (layer norm).  dlight's CPU Reduction
schedules these with a scalar loop per reduction, a chain of dependent adds (4 cycles
each); LLVM may not reorder float adds to vectorise it.  Here each reduction is split
``k -> (ko, ki)`` with ``ki`` = ``vectors`` vectors and rfactored over ``ki``: the rfactor
block keeps ``ki`` partial sums (maxima) in vector registers, one add per vector per
step, and a short write-back sums them.  rfactor runs before ``compute_at`` (it needs the
reduction to be the first child of its loop).  Every block is then computed per row,
rows in parallel, elementwise row blocks vectorised; per-row scalars (the mean) are
inlined.  The summation order changes (partial sums: more accurate than one serial sum).
Odd rows: onnxc's softmax reduces a row of 197 over 192 elements then the last 5
(``legalize_vector_math``); the 192 split here, the tail (``k + 192`` reads) stays a short
scalar loop.  Elementwise row loops of an odd length run whole vectors, then a scalar loop.
A symbolic row length (softmax over ``seq``) keeps scalar reductions, as an odd static one
does (its elementwise loops are left to LLVM's loop vectoriser, which adds the scalar tail
for a runtime trip count; a vectorised split with a guard is scalarised by TVM); symbolic
row loops are not fused, and the parallel loop is the fused outer row loops when their
constant extents give every core a share (softmax's ``batch * heads``), else the innermost.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from ..base import MatchingCPURule
from . import common


def _row_dims(kinds: str):
    """Number of leading spatial axes of a block that reduces only its last axis, or of
    a spatial block; None for any other shape."""
    if "R" not in kinds:
        return len(kinds)
    if kinds.count("R") == 1 and kinds[-1] == "R":
        return len(kinds) - 1
    return None


def match_rows(sch):
    """(number of row axes, reduction block names) when every block is per row, else None."""
    blks = common.blocks(sch)
    if len(blks) < 2:
        return None
    kinds = [common.iter_kinds(sch.get(b)) for b in blks]
    if any(k is None or not k for k in kinds) or "R" in kinds[-1]:
        return None
    reds = [sch.get(b).name_hint for b, k in zip(blks, kinds) if "R" in k]
    if not reds:
        return None
    dims = [_row_dims(k) for k in kinds]
    if any(d is None for d in dims):
        return None
    nrow = len(kinds[-1]) - 1
    if nrow < 1 or any(_row_dims(k) != nrow for k in kinds if "R" in k):
        return None
    if any(d not in (nrow, nrow + 1) for d in dims):
        return None
    if not all(_reduces_rows(sch.get(b), nrow) for b, k in zip(blks, kinds) if "R" in k):
        return None
    out = sch.get(blks[-1]).writes
    # float32 rows, or rows requantised to 8 bits as they are written (QDQ models: layer
    # norm -> QuantizeLinear, which dlight's reduction rule took, one row at a time)
    if len(out) != 1 or out[0].source.dtype not in common.FLOAT_OR_8BIT:
        return None
    return nrow, reds


def _reduces_rows(block, nrow: int) -> bool:
    """Whether the block reads ``x[rows.., k]`` (or per-row values ``m[rows..]``) only, with
    its spatial vars as the rows: a reduction over the last axis (not softmax(axis=0))."""
    ivs = [iv.var for iv in block.iter_vars]
    rows, k = ivs[:nrow], ivs[nrow]
    if not common.same_vars(common.region_vars(block.writes[0]), rows):
        return False
    for r in block.reads:
        idx = common.region_vars(r)
        if not (common.same_vars(idx, rows) or (common.same_vars(idx[:-1], rows)
                                                and len(idx) == nrow + 1
                                                and _is_k_plus_const(idx[-1], k, ivs))):
            return False
    return True


def _is_k_plus_const(expr, k, ivs=()) -> bool:
    """``k`` or ``k + c``: a row's tail read from an offset that is constant along the row,
    a constant or an expression of the dims, no iteration var (``ivs``, the block's) in
    it (a row of 197 reduced over 192 elements, then the last 5; a symbolic row over
    ``n - n % 32``, then the rest; compiler/lowering/legalize_vector_math.py)."""
    if expr.same_as(k):
        return True
    from tvm.sym.analyzer import Analyzer

    offset = Analyzer().simplify(expr - k)
    return common.uses_var(expr, k) and not any(common.uses_var(offset, v)
                                                 for v in [k, *ivs])


def _dividing_width(sch, loop, lanes: int, vectors: int):
    """The widest ``v * lanes`` (v <= ``vectors``) that provably divides a symbolic loop's
    extent (a symbolic row's ``n - n % 32``), or None (the row stays a scalar loop)."""
    from tvm.sym.analyzer import Analyzer

    ext = sch.get(loop).extent
    an = Analyzer()
    # n - n % c: a multiple of c's divisors (the analyzer proves it for c itself only)
    c = ext.b.b.value if (isinstance(ext, tirx.Sub) and isinstance(ext.b, tirx.FloorMod)
                          and isinstance(ext.b.b, tirx.IntImm)
                          and tvm_ffi.structural_equal(ext.a, ext.b.a)) else 0
    return next((v * lanes for v in range(vectors, 0, -1)
                 if (c and c % (v * lanes) == 0)
                 or an.can_prove(tirx.floormod(ext, v * lanes) == 0)), None)


class RowReduction(MatchingCPURule):
    """softmax / layer norm / RMS norm: rows in parallel, vectorised row reductions."""

    name = "cpu.row_reduction"
    vectors = 2  # independent vector accumulators per reduction (hide the add latency)

    def match(self, sch):
        return match_rows(sch)

    def schedule(self, sch, m, target):
        nrow, reds = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        if any(common.const_extent(sch, sch.get_loops(sch.get_sblock(r))[-1]) is None
               for r in reds):
            _inline_row_arithmetic(sch, nrow)
        for name in reds:
            blk = sch.get_sblock(name)
            k = sch.get_loops(blk)[-1]
            kext = common.const_extent(sch, k)
            if kext is None:  # symbolic: its part that is a provable multiple of vectors
                width = _dividing_width(sch, k, lanes, self.vectors)
            else:
                width = next((v * lanes for v in range(self.vectors, 0, -1)
                              if kext % (v * lanes) == 0 and kext > v * lanes), None)
            if width is None:
                continue  # short or odd rows: a scalar reduction
            _, ki = sch.split(k, [None, width])
            sch.rfactor(ki, nrow)
            _halve(sch, blk, nrow, width)
        last = common.blocks(sch)[-1]
        loops = sch.get_loops(last)
        symbolic_rows = any(common.const_extent(sch, lp) is None for lp in loops[:nrow])
        # symbolic rows stay unfused: a fused (batch * seq) index needs divisions by seq,
        # and TVM then cannot shrink the per-row buffers to one row (it keeps them whole);
        # the innermost row loop (seq) runs in parallel
        row = loops[nrow - 1] if symbolic_rows or nrow == 1 else sch.fuse(*loops[:nrow])
        depth = nrow if symbolic_rows else 1  # loops above a row's blocks
        for blk in reversed(common.blocks(sch)[:-1]):
            b = sch.get(blk)
            if len(b.iter_vars) == nrow and "R" not in common.iter_kinds(b):
                try:  # a per-row scalar (mean): recomputed where used, no buffer
                    sch.compute_inline(blk)
                    continue
                except Exception:  # noqa: BLE001 - not inlinable: keep it per row
                    pass
            sch.compute_at(blk, row, preserve_unit_loops=True)
        for blk in common.blocks(sch):
            b = sch.get(blk)
            if _is_rf(b):  # compute_at put the partial-sum loop outside: move it inside
                ki, ko = sch.get_loops(blk)[depth], sch.get_loops(blk)[-1]
                sch.reorder(ko, ki)
                sch.vectorize(ki)
            elif "R" not in common.iter_kinds(b):
                common.vectorize_row(sch, blk, lanes)
        if ncores > 1:
            _parallel_rows(sch, last, row, nrow, symbolic_rows, ncores)
        _init_before_symbolic_reductions(sch)  # after parallel, which refuses it
        return _exp_in_output(sch)


def _inline_row_arithmetic(sch, nrow: int) -> None:
    """A symbolic row (its reductions split at ``n - n % 32``): the elementwise row blocks
    of plain arithmetic (a layer norm's ``x - x0``, ``d``, ``d * d``) are recomputed where
    read instead of stored per row.  Computed at the row, such a block's extent is the
    union of what the split reductions read, which TVM cannot bound by ``n`` when ``n`` is
    a product (a GroupNorm's ``h * w * 10``): the loops came out guarded, with min / max
    index arithmetic per element (2.7 ms against the static kernel's 1.6).  Blocks calling
    functions (softmax's exp) stay stored: recomputing them costs more than the row."""
    for blk in common.blocks(sch)[:-1]:
        b = sch.get(blk)
        if (len(b.iter_vars) == nrow + 1 and "R" not in common.iter_kinds(b)
                and not list(common.nodes(b.body, tvm.ir.expr.Call))):
            try:
                sch.compute_inline(blk)
            except Exception:  # noqa: BLE001 - not inlinable: computed at the row
                pass


def _init_before_symbolic_reductions(sch) -> None:
    """Each reduction over a symbolic extent gets its init ahead of its loops: a symbolic
    row split at ``n - n % 32`` has a tail of no elements whenever 32 divides ``n`` (and
    no whole chunks below 32), and a reduction's init inside a loop of no trips never runs:
    the row read the buffer's stale value (a [1, 32, 40960] GroupNorm was wrong on its
    first call, right on later ones)."""
    blocks = common.blocks(sch)
    nests = [[sch.get(lp) for lp in sch.get_loops(b)] for b in blocks]
    depth = 0  # the row loops every block is under (fused and parallel by now)
    while all(len(n) > depth and n[depth].same_as(nests[0][depth]) for n in nests):
        depth += 1
    for blk in blocks:
        b = sch.get(blk)
        loops = sch.get_loops(blk)[depth:]
        if "R" in common.iter_kinds(b) and loops and any(
                common.const_extent(sch, lp) is None for lp in loops):
            sch.decompose_reduction(blk, loops[0])


def _exp_in_output(sch):
    """Softmax (onnxc's legalization or TVM's: the same block names) with its exps stored in
    the output row (its ``T_softmax_norm``) and normalised there in place, as onnxruntime's
    MLAS does: the first write of each output row (a cache miss per line, 72 MB of them
    over Whisper's [8, 1500, 1500]) then happens in the exp pass, under its arithmetic,
    instead of in the bare load-multiply-store pass at the end of the row, which stalled
    on it (and no per-row scratch row is needed).  Each ``norm[i] = exp[i] * r`` reads the
    element it overwrites; the row's sum reads the exps before.  Kernels without both
    buffers (layer norm, RMS norm) are left as they are."""
    from tvm import s_tir

    func = common.alias_buffer(sch.mod["main"], "T_softmax_exp", "T_softmax_norm")
    return sch if func is None else s_tir.Schedule(func)


def _halve(sch, blk, nrow: int, width: int) -> None:
    """The ``width`` partial results of a row reduction folded in halves, each level one
    vector op (``p[i] = p[i] op p[i + w/2]``, rfactor over the lower half), down to two:
    the write-back reduced them one scalar op after another, a chain of ``width``
    dependent adds / maxima (32 on AVX-512: softmax spent ~1.5 cycles per element of a
    128-wide row there)."""
    while width > 2:
        k = sch.get_loops(blk)[-1]
        _, ki = sch.split(k, [2, None])
        sch.rfactor(ki, nrow)
        width //= 2


def _parallel_rows(sch, last, row, nrow: int, symbolic: bool, ncores: int) -> None:
    """Rows in parallel.  Symbolic rows: over the outer row loops fused (``batch * heads``
    of attention's softmax) when their constant extents alone give every core a share,
    else over the innermost (``seq`` of a layer norm's ``batch, seq`` rows: a parallel
    region per batch).  A parallel innermost row loop under ``batch x 12`` heads would
    open 12 parallel regions per batch row, 5.8x the static kernel at seq 16."""
    if symbolic and nrow >= 2:
        outer = sch.get_loops(last)[:nrow - 1]
        shares = 1
        for lp in outer:
            shares *= common.const_extent(sch, lp) or 1
        if shares >= ncores:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
            return
    if (common.const_extent(sch, row) or 2) >= 2:
        sch.parallel(row)


def _is_rf(block) -> bool:
    return block.name_hint.endswith("_rf")
