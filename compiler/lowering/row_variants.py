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
    ``rows``, the matmul's row count M) when ``func`` holds a ``matmul_packed`` block whose
    rows are symbolic and unpadded; else None."""
    root = func.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    where = [_block_names(s) for s in stmts]
    at = [n for n, names in enumerate(where) if "matmul_packed" in names]
    if len(at) != 1 or len(where[at[0]]) != 1:
        return None
    mm = _blocks(stmts[at[0]])[0]
    found = _operands(mm)
    if found is None:
        return None
    x, wp, out = found
    m_rows = x.shape[-2]
    if isinstance(m_rows, tirx.IntImm):
        return None
    # the column cut (W's last panel padded with zero columns), if any, is replaced too:
    # the padded matmul's own cut drops the extra rows and columns at once
    drop = {at[0]}
    final = out
    nxt = at[0] + 1
    if nxt < len(stmts) and where[nxt] == ["matmul_rows"]:
        cut = _blocks(stmts[nxt])[0]
        if len(cut.reads) == 1 and cut.reads[0].source.same_as(out):
            final = cut.writes[0].source
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


def _block_names(stmt) -> list:
    return [b.name_hint for b in _blocks(stmt)]


def _operands(mm):
    """(A, packed W, C) buffers of a ``matmul_packed`` block reading ``A[.., i, k]``
    unclamped (its row index the block's own row variable) and ``Wp[j // nr, k, j % nr]``;
    else None."""
    if len(mm.writes) != 1 or len(mm.reads) < 2:
        return None
    out = mm.writes[0].source
    ivs = [iv.var for iv in mm.iter_vars]
    if len(ivs) < 3:
        return None
    i = ivs[-3]
    x = wp = None
    for r in mm.reads:
        b = r.source
        if b.same_as(out):
            continue
        mins = [rg.min for rg in r.region]
        if len(mins) == 3 and len(b.shape) == 3 and isinstance(mins[0], tirx.FloorDiv):
            wp = b
        elif len(mins) >= 2 and mins[-2].same_as(i):
            x = b
        else:
            return None
    if x is None or wp is None:
        return None
    return x, wp, out

