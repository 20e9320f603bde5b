"""General variants of one-row kernels: a decoder's prompt runs padded register tiles.

A build whose ``seq`` is declared at opt 1 (``dims={"seq": (1, 512, 1)}``: a decoder tuned
for its one-token steps) leaves the rows of its constant-weight matmuls unpadded
(``passes/pack_matmul_weights.py``), so ``cpu.matmul_packed`` runs them a row at a time,
each weight panel streamed once per row: the fastest decode step, but a prompt of 64 tokens
then streams every panel 64 times (GPT-2 prefill 2x slower than the build with padded
tiles).  Here each such kernel gets a second PrimFunc with the same parameters: the same
kernel with the matmul's rows padded to whole register tiles, A read at ``min(i, M - 1)``
and the result cut back to M rows (what ``pack_matmul_weights.matmul_packed`` computes
with ``rows`` > 1), the rest of the kernel (column cut, fused epilogue) unchanged.

The graph call keeps the one-row kernel and names the variant with the matmul's row count
as an expression of the dims and the tile it is padded to (``call["rows_variant"] =
{"kernel", "rows", "tile"}``); the runtime (``runtime/dims.py`` :func:`use_variant`)
runs the variant when padding adds at most half the real rows.  Both are correct at
any binding: the choice is speed only.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import te, tirx

from passes.pack_matmul_weights import matmul_packed

from .symbolic import DIM_OPT_ATTR, expr_text

# Suffix of a variant's kernel symbol.
SUFFIX = "__rows"


def add_row_variants(graph, rows: int, dim_names) -> list:
    """Add a general variant of every one-row matmul kernel of ``graph`` (a KernelGraph
    after ``annotate_dim_opt``) to ``graph.prim_funcs`` and name it on each call of the
    kernel; ``rows`` is the register tile the padded rows are rounded to
    (pack_matmul_weights' ``rows``).  Returns the kernels that got one."""
    if rows <= 1:
        return []
    made = {}
    for name, func in list(graph.prim_funcs.items()):
        if func.attrs is None or DIM_OPT_ATTR not in func.attrs:
            continue
        found = general_variant(func, rows)
        if found is None:
            continue
        variant, m_rows = found
        try:
            text = expr_text(m_rows, set(dim_names), "row count")
        except Exception:  # rows the runtime could not evaluate: keep the one kernel
            continue
        graph.prim_funcs[name + SUFFIX] = variant
        made[name] = {"kernel": name + SUFFIX, "rows": text, "tile": int(rows)}
    for call in graph.calls:
        if call["kernel"] in made:
            call["rows_variant"] = dict(made[call["kernel"]])
    return sorted(made)


def general_variant(func, rows: int):
    """(``func`` with its one-row matmul computed over rows padded to a multiple of
    ``rows``, the matmul's row count M) when ``func``'s matmul is one ``cpu.matmul_packed``
    takes (``match_packed_matmul``) with symbolic, unpadded rows; else None."""
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
