"""Row-tile variants of symbolic-row matmul kernels: each call runs the tile that fits its rows.

A matmul against constant weights whose row count M is symbolic (batch x seq tokens) is
compiled once for every M in the declared range, so its register tile cannot be chosen for
the M of a call as a static build chooses it (``pack_matmul_weights.pad_rows``).  Two cases:

* A build whose ``seq`` is declared at opt 1 (``dims={"seq": (1, 512, 1)}``: a decoder tuned
  for its one-token steps) leaves the rows unpadded, so ``cpu.matmul_packed`` runs them a row
  at a time, each weight panel streamed once per row: the fastest decode step, but a prompt
  of 64 tokens then streams every panel 64 times (GPT-2 prefill 2x slower than the build with
  padded tiles).  Such a kernel gets a variant with its rows padded to whole register tiles.
* Otherwise the pass pads M to a multiple of the target's full tile (fp32 / bf16: 12 rows
  on AVX-512, 6 on AVX2; int8: 6): a call of 16 rows computes 24, 1.5x the work (a
  BERT-base encoder compiled for seq 1..512 at opt 128, run at seq 16: 43 ms against a
  static seq-16 build's 29, one thread, Zen 4).  Such a kernel gets variants padded to a
  few smaller tiles (:func:`variant_tiles`, picked for its full tile).

A variant is a second PrimFunc with the same parameters.  For a one-row kernel: the same
kernel with the matmul block replaced by the padded TE (A read at ``min(i, M - 1)``, the
result cut back to M rows: what ``pack_matmul_weights.matmul_packed`` computes with
``rows`` > 1), the rest of the kernel (column cut, fused epilogue) unchanged
(:func:`general_variant`).  For a padded kernel, of any of the three packings: the same
kernel with every ``(M + t - 1) // t * t`` read for the smaller tile (:func:`repadded`).

The graph call keeps its kernel and lists the choices (``call["row_variants"] = {"rows":
the matmul's row count as an expression of the dims, "choices": [[kernel, tile, cost],
...]}``, the call's own kernel first); the runtime (``runtime/dims.py``
:func:`pick_variant`) runs, per binding, the choice of least ``ceil(M / tile) * tile *
cost``: the rows it computes times its tile's time per row (``pack_matmul_weights
.tile_cost``; a one-row kernel counts 1.5, a padded row costing about two thirds of an
unpadded one).  Every choice is correct at any binding: the choice is speed only.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import te, tirx

from passes.pack_matmul_weights import matmul_packed

from .symbolic import DIM_OPT_ATTR, expr_text

# Suffix of a variant's kernel symbol.
SUFFIX = "__rows"


# A one-row kernel's time per row against a full tile's (runtime/dims.py pick_variant):
# GPT-2 prefill, one thread, Zen 3, one-row build / padded 6-row variant (ms): 2 rows 48 / 43,
# 4 rows 69 / 67, 7 rows 95 / 102 (12 padded rows), 12 rows 153 / 122, 64 rows 535 / 374
ONE_ROW_COST = 1.5
# smaller tiles a kernel of padded rows gets variants for (each costs a kernel build: a
# BERT-base over symbolic (batch, seq) 6.1 s to compile without, 8.1 s with two)
VARIANT_COUNT = 3


def variant_tiles(rows: int, count: int = VARIANT_COUNT) -> list:
    """``count`` tiles below ``rows`` for variants: the largest power of two (token counts
    are most often multiples of 8: a batch of 16 tokens takes two 8-row tiles, not 24
    padded rows), then, one at a time, the tile that brings the set nearest on average to
    the best tile of every M from ``rows`` to ``8 * rows`` (``ceil(M / t) * t *
    tile_cost(t)``; fewer rows than one full tile are rarer in a padded kernel: a decoder's
    steps take the one-row kernels).  12-row tiles (AVX-512) get 8, 10 and 11; 6-row ones
    (AVX2, int8) 2, 4 and 5."""
    from passes.pack_matmul_weights import tile_cost

    def cost(m, t):
        return -(-m // t) * t * tile_cost(t, rows)

    ms = range(rows, 8 * rows + 1)
    best = {m: min(cost(m, t) for t in range(1, rows + 1)) for m in ms}
    chosen = [rows]
    power = 1 << (rows - 1).bit_length() - 1  # the largest power of two below rows
    if count and power >= 2:
        chosen.append(power)
    while len(chosen) < count + 1 and len(chosen) < rows - 1:
        left = [t for t in range(2, rows) if t not in chosen]
        chosen.append(min(left, key=lambda t: sum(
            min(cost(m, u) for u in chosen + [t]) / best[m] for m in ms)))
    return sorted(chosen[1:])


def add_row_variants(graph, rows: int, one_row: bool, dim_names) -> list:
    """Add the row-tile variants of ``graph``'s symbolic-row matmul kernels (a KernelGraph
    after ``annotate_dim_opt``) to ``graph.prim_funcs`` and list them on each call of the
    kernel; ``rows`` is the target's full register tile (pack_matmul_weights' ``rows``),
    ``one_row`` whether the pass left some kernels' rows unpadded (dims at opt 1).  Returns
    the kernels that got variants."""
    from passes.pack_matmul_weights import tile_cost

    if rows <= 1:
        return []
    made = {}
    for name, func in list(graph.prim_funcs.items()):
        if func.attrs is None or DIM_OPT_ATTR not in func.attrs:
            continue
        found = padded_tile(func)
        if found is None:
            continue
        padded, m_rows = found
        if padded == 1:  # one row at a time: a variant of full tiles for several rows
            variant = general_variant(func, rows) if one_row else None
            if variant is None:
                continue
            choices = [[name, 1, ONE_ROW_COST], [name + SUFFIX, rows, 1.0]]
            variants = [(name + SUFFIX, variant[0])]
        else:  # the full tile of its own family (6 rows for int8 on AVX-512, 12 for fp32)
            choices = [[name, padded, 1.0]] + [
                [f"{name}{SUFFIX}{t}", t, round(tile_cost(t, padded), 4)]
                for t in variant_tiles(padded)]
            variants = [(k, repadded(func, padded, t)) for k, t, _ in choices[1:]]
        try:
            text = expr_text(m_rows, set(dim_names), "row count")
        except Exception:  # rows the runtime could not evaluate: keep the one kernel
            continue
        graph.prim_funcs.update(variants)
        made[name] = {"rows": text, "choices": choices}
    for call in graph.calls:
        if call["kernel"] in made:
            call["row_variants"] = {"rows": made[call["kernel"]]["rows"],
                                    "choices": [list(c) for c in made[call["kernel"]]["choices"]]}
    return sorted(made)


def padded_tile(func):
    """(the row tile ``func``'s matmul pads its symbolic rows to, the row count M) -- tile 1:
    unpadded, one row at a time (``cpu.matmul_packed``) -- or None when it has none (no
    such matmul, static rows).  The fp32, bf16 and int8 packed matmuls
    (pack_matmul_weights, pack_bf16_matmul, pack_int_matmul) pad M alike: their extents
    read ``(M + t - 1) // t * t``."""
    from tvm import s_tir

    from schedules.cpu.matmul_packed import match_packed_matmul

    paddings = _paddings(func)
    if len(paddings) == 1:
        (tile, m_rows), = paddings.items()
        return tile, m_rows
    if paddings:  # several tiles in one kernel: leave it alone
        return None
    sch = s_tir.Schedule(func)
    found = match_packed_matmul(sch)
    if found is None or found[2]:
        return None
    extent = sch.get(sch.get_loops(found[0])[-3]).extent
    return None if isinstance(extent, tirx.IntImm) else (1, extent)


def _padded(e):
    """(t, M) when ``e`` is ``(M + t - 1) // t * t`` with a symbolic M, else None."""
    if not (isinstance(e, tirx.Mul) and isinstance(e.b, tirx.IntImm)
            and isinstance(e.a, tirx.FloorDiv) and isinstance(e.a.b, tirx.IntImm)
            and isinstance(e.a.a, tirx.Add) and isinstance(e.a.a.b, tirx.IntImm)):
        return None
    t = int(e.b)
    if t < 2 or int(e.a.b) != t or int(e.a.a.b) != t - 1 or \
            not tirx.analysis.undefined_vars(e.a.a.a):
        return None
    return t, e.a.a.a


def _paddings(func) -> dict:
    """{t: M} of the padded row extents in ``func`` (its matmul blocks' loops)."""
    from tvm.s_tir.stmt import SBlock

    found: dict = {}

    def visit(block):
        if not block.name_hint.startswith("matmul"):
            return
        for iv in block.iter_vars:
            hit = _padded(iv.dom.extent)
            if hit is not None:
                found.setdefault(hit[0], hit[1])

    tvm_ffi.structural_walk(func.body, [(SBlock, visit)], order="pre")
    return found


def repadded(func, rows: int, tile: int):
    """``func`` with its rows padded to a multiple of ``tile`` instead of ``rows``: every
    ``(M + rows - 1) // rows * rows`` (the matmul's loops, iteration domain, buffer) read
    as ``(M + tile - 1) // tile * tile``.  Rows past M read row M - 1 and are cut after the
    matmul whatever the padding, so the result is the same."""
    def on_mul(e, mutator):
        hit = _padded(e)
        if hit is not None and hit[0] == rows:
            return tirx.floordiv(hit[1] + (tile - 1), tile) * tile
        return mutator.default_mutate(e)

    return tvm_ffi.structural_mutate(func, [(tirx.Mul, on_mul)])


def general_variant(func, rows: int):
    """(``func`` with its one-row matmul computed over rows padded to a multiple of
    ``rows``, the matmul's row count M) when ``func``'s matmul is one ``cpu.matmul_packed``
    takes (``match_packed_matmul``) with symbolic, unpadded rows; else None (a padded
    kernel's variants are :func:`repadded`)."""
    from tvm import s_tir

    from schedules.cpu.matmul_packed import match_packed_matmul

    sch = s_tir.Schedule(func)  # the rule's own matcher says which block is the matmul
    found = match_packed_matmul(sch)
    if found is None or found[2]:  # none, or its rows already padded (clamped reads)
        return None
    mm = sch.get(found[0])
    func = sch.mod["main"]  # the function that block belongs to
    root = func.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    at = [n for n, s in enumerate(stmts) if any(b.same_as(mm) for b in _blocks(s))]
    if len(at) != 1 or len(_blocks(stmts[at[0]])) != 1:
        return None
    out = mm.writes[0].source
    # A read at [.., i, k], the packed W at [j // nr, k, j % nr]
    wp = next(r.source for r in mm.reads
              if isinstance(r.region[0].min, tirx.FloorDiv) and len(r.region) == 3)
    x = next(r.source for r in mm.reads
             if not r.source.same_as(out) and not r.source.same_as(wp))
    m_rows = x.shape[-2]
    if isinstance(m_rows, tirx.IntImm):
        return None
    # the column cut (W's last panel padded with zero columns), if any, is replaced too:
    # the padded matmul's own cut drops the extra rows and columns at once
    drop = {at[0]}
    final = out
    nxt = at[0] + 1
    cut = _blocks(stmts[nxt]) if nxt < len(stmts) else []
    if len(cut) == 1 and _is_copy_of(cut[0], out):
        final = cut[0].writes[0].source
        drop.add(nxt)
    xp = te.placeholder(list(x.shape), str(x.dtype), "x")
    wpp = te.placeholder(list(wp.shape), str(wp.dtype), "wp")
    padded = te.create_prim_func(
        [xp, wpp, matmul_packed(xp, wpp, rows, int(final.shape[-1]))],
        index_dtype_override="int64")  # Relax shapes are int64
    pairs = [(p, b) for p, b in zip(padded.params, (x, wp, final))]
    if any(len(p.shape) != len(b.shape) for p, b in pairs):
        return None

    def rebind(v, _):
        for p, b in pairs:
            if v.same_as(p):
                return b
        return v

    proot = tvm_ffi.structural_mutate(padded.body.block, [(tirx.Var, rebind)])
    new_stmts = []
    for n, s in enumerate(stmts):
        if n == at[0]:
            new_stmts += (list(proot.body.seq) if isinstance(proot.body, tirx.SeqStmt)
                          else [proot.body])
        elif n not in drop:
            new_stmts.append(s)
    used = [b for b in root.alloc_buffers if final.same_as(out) or not b.same_as(out)]
    from tvm.s_tir.stmt import SBlock, SBlockRealize

    block = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                   tirx.SeqStmt(new_stmts), root.init, used + list(proot.alloc_buffers),
                   root.match_buffers, root.annotations)
    body = SBlockRealize(func.body.iter_values, func.body.predicate, block)
    variant = tirx.PrimFunc(func.params, body, func.ret_type, func.attrs)
    return variant, m_rows


def _blocks(stmt) -> list:
    from tvm.s_tir.stmt import SBlock

    found = []
    tvm_ffi.structural_walk(stmt, [(SBlock, found.append)], order="pre")
    return found


def _is_copy_of(block, src) -> bool:
    """``block`` only copies elements of ``src`` (``dst[idx] = src[idx]``: the TE's column
    cut), nothing computed on them (a fused epilogue would be lost if replaced)."""
    body = block.body
    return (len(block.reads) == 1 and block.reads[0].source.same_as(src)
            and isinstance(body, tirx.BufferStore)
            and isinstance(body.value, tvm.ir.expr.TensorLoad)  # what tirx.BufferLoad builds
            and body.value.source.same_as(src)
            and len(block.writes[0].source.shape) == len(src.shape))
