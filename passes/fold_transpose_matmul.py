"""matmul(a, permute_dims(b, swap last two)) => matmul_nt(a, b): no transposed copy of b.

Exporters write attention scores as ``Q @ K.transpose(-1, -2)``; imported as is, the
transpose is a kernel of its own (a strided copy, scheduled by the fallback) before an NN
matmul.  ``matmul_nt`` reads ``b[.., j, k]`` in place: the CPU matmul rule packs its
``K x jt`` panel transposed once per column tile, as it packs an NN panel (ViT's
[12, 197, 64] x [12, 64, 197] scores: 3.4x onnxruntime with the transpose kernel, 2.2x
without, single-thread on Zen 3 under load).  Fires on float32 operands of equal rank >= 2
whose batch dims are equal or 1 (broadcast), when the permutation only swaps the last two
axes; symbolic dims are compared as expressions (GPT-2 decoding with a cache: Q [1, 12,
seq, 64] @ K^T with K [1, 12, past + seq, 64], where the transpose copied the whole cache
per layer and step).  Runs after the fusions that match the decomposed attention
(fuse_attention).
"""

from __future__ import annotations

from tvm_ffi import structural_equal
from tvm import relax, te, tirx

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, dtype_of, rewrite_matches

RULE = "matmul(a, permute_dims(b, [.., -1, -2])) => matmul_nt(a, b)"


class FoldTransposeMatmul(GraphPass):
    """matmul(a, transpose(b)) => matmul_nt(a, b) when the transpose swaps the last axes."""

    name = "fold_transpose_matmul"
    opt_level = 2

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan)


def _match(df: Dataflow, root):
    mm = df.call(root, "matmul")
    if mm is None:
        return None
    a, bt = mm.args
    pd = df.call(bt, "permute_dims")
    if pd is None or any(dtype_of(e) != "float32" for e in (a, bt, root)):
        return None
    b = pd.args[0]
    sa, sb = _dims(a), _dims(b)
    if sa is None or sb is None or len(sa) != len(sb) or len(sa) < 2:
        return None
    nd = len(sb)
    axes = [int(x) for x in pd.attrs.axes] if pd.attrs.axes is not None else None
    if axes != [*range(nd - 2), nd - 1, nd - 2]:
        return None
    if not _same(sa[-1], sb[-1]) or not all(_same(x, y) or _one(x) or _one(y)
                                            for x, y in zip(sa[:-2], sb[:-2])):
        return None
    inner = [df.source(bt)] if df.private([bt], root) else []
    return Match(RULE, root, inner, {"a": a, "b": b})


def matmul_nt(a, b):
    """TE compute: ``out[.., i, j] = sum_k a[.., i, k] * b[.., j, k]`` (batch dims of size 1
    broadcast)."""
    *ba, m, kk = a.shape
    *bb, n, _ = b.shape
    bat = [y if _one(x) else x for x, y in zip(ba, bb)]
    k = te.reduce_axis((0, kk), "k")

    def body(*idx):
        *bi, i, j = idx
        ai = [0 if _one(d) else v for d, v in zip(ba, bi)]
        bj = [0 if _one(d) else v for d, v in zip(bb, bi)]
        return te.sum(a[(*ai, i, k)] * b[(*bj, j, k)], axis=k)

    return te.compute((*bat, m, n), body, name="matmul_nt")


def _dims(expr) -> list | None:
    """A tensor's shape as PrimExprs (static or symbolic), or None when unknown."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _one(d) -> bool:
    return isinstance(d, tirx.IntImm) and d.value == 1


def _same(x, y) -> bool:
    """Equal extents: equal ints, or the same expression of the same dims."""
    if isinstance(x, tirx.IntImm) and isinstance(y, tirx.IntImm):
        return x.value == y.value
    return bool(structural_equal(x, y))


def _plan(m: Match):
    return lambda em: em.call_te(matmul_nt, m.info["a"], m.info["b"], name="matmul")
