"""matmul(a, permute_dims(b, [.., -1, -2])) => matmul_nt(a, b): no transposed copy of b.

Exporters write attention scores as ``Q @ K.transpose(-1, -2)``; imported as is, the
transpose is a kernel of its own (a strided copy, scheduled by the fallback) before an NN
matmul.  ``matmul_nt`` reads ``b[.., j, k]`` in place: the CPU matmul rule packs its
``K x jt`` panel transposed once per column tile, as it packs an NN panel (ViT's
[12, 197, 64] x [12, 64, 197] scores: 3.4x onnxruntime with the transpose kernel, 2.2x
without, single-thread on Zen 3 under load).  Fires on float32 operands of equal rank >= 2
whose batch dims are equal or 1 (broadcast), when the permutation only swaps the last two
axes; symbolic dims are compared as expressions (GPT-2 decoding with a cache: Q [1, 12,
seq, 64] @ K^T with K [1, 12, past + seq, 64], where the transpose copied the whole cache
per layer and step).

Two forms torch's exporter writes for scaled dot-product attention also fold:

* ``matmul(a, permute_dims(b, p) * c)`` with ``c`` a float32 scalar constant (``sqrt(scale)``
  on each side: T5, Whisper, LLaMA) => ``matmul_nt(a, ..) * c``: the scale moves into the
  matmul's epilogue;
* a ``p`` that also moves the heads, ``[0, 2, 3, 1]`` of K ``[B, S, H, D]`` (T5, Whisper):
  ``p`` is ``q`` then a swap of the last two axes, so it becomes ``matmul_nt(a,
  permute_dims(b, q))``, when ``q`` keeps ``b``'s last axis last (``[0, 2, 1, 3]``, the copy
  that Q and V get: rows of D contiguous, where ``p``'s copy was a 2-D transpose:
  Whisper's K, 3.5 -> 1.4 ms a layer single-thread on Zen 3).

Runs after the fusions that match the decomposed attention (fuse_attention).
"""

from __future__ import annotations

from tvm_ffi import structural_equal
from tvm import relax, te, tirx

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, dtype_of, rewrite_matches

RULE = "matmul(a, permute_dims(b, [.., -1, -2])) => matmul_nt(a, b)"
RULE_SCALED = "matmul(a, permute_dims(b, [.., -1, -2]) * c) => matmul_nt(a, b) * c"
RULE_HEADS = "matmul(a, permute_dims(b, q + [-1, -2])) => matmul_nt(a, permute_dims(b, q))"
RULE_HEADS_SCALED = ("matmul(a, permute_dims(b, q + [-1, -2]) * c) => "
                     "matmul_nt(a, permute_dims(b, q)) * c")


class FoldTransposeMatmul(GraphPass):
    """matmul(a, transpose(b)) => matmul_nt(a, b) when the transpose swaps the last axes
    (after a permutation that keeps b's last axis last; a scalar multiply between them
    moves after the matmul)."""

    name = "fold_transpose_matmul"
    opt_level = 2

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan)


def _match(df: Dataflow, root):
    mm = df.call(root, "matmul")
    if mm is None:
        return None
    a, bt = mm.args
    scale, scaled = _scalar_multiply(df, bt)
    pd = df.call(scaled if scale is not None else bt, "permute_dims")
    if pd is None or any(dtype_of(e) != "float32" for e in (a, bt, root)):
        return None
    b = pd.args[0]
    sa, sb = _dims(a), _dims(b)
    if sa is None or sb is None or len(sa) != len(sb) or len(sa) < 2:
        return None
    nd = len(sb)
    axes = [int(x) for x in pd.attrs.axes] if pd.attrs.axes is not None else None
    if axes is None or sorted(axes) != list(range(nd)):
        return None
    q = [*axes[:-2], axes[-1], axes[-2]]  # p = q, then the last two axes swapped
    if q[-1] != nd - 1:  # the inner copy would still be a 2-D transpose
        return None
    sq = [sb[x] for x in q]
    if not _same(sa[-1], sq[-1]) or not all(_same(x, y) or _one(x) or _one(y)
                                            for x, y in zip(sa[:-2], sq[:-2])):
        return None
    heads = q != list(range(nd))
    chain = [scaled, bt] if scale is not None else [bt]
    private = df.private(chain, root)
    if heads and not private:  # the p copy stays for its other users: q's would be extra
        return None
    inner = [df.source(v) for v in chain] if private else []
    rule = {(False, False): RULE, (False, True): RULE_SCALED, (True, False): RULE_HEADS,
            (True, True): RULE_HEADS_SCALED}[heads, scale is not None]
    return Match(rule, root, inner, {"a": a, "b": b, "q": q if heads else None,
                                     "pd": df.source(scaled if scale is not None else bt),
                                     "scale": scale})


def _scalar_multiply(df: Dataflow, expr):
    """(the scalar constant c, x) when ``expr`` is ``x * c`` or ``c * x`` with c a float32
    constant of one element and no more dims than x (the product keeps x's shape), else
    (None, None)."""
    mul = df.call(expr, "multiply")
    if mul is None:
        return None, None
    for x, c in (mul.args, mul.args[::-1]):
        v = df.const(c)
        dx = _dims(x)
        if v is not None and v.size == 1 and str(v.dtype) == "float32" and dx is not None \
                and v.ndim <= len(dx):
            return c, x
    return None, None


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
    info = m.info

    def build(em):
        b = info["b"]
        if info["q"] is not None:  # the heads' permutation alone: rows of b stay contiguous
            b = em.emit(relax.op.permute_dims(b, info["q"]), like=info["pd"])
        y = em.call_te(matmul_nt, info["a"], b, name="matmul")
        if info["scale"] is None:
            return y
        return relax.op.multiply(em.emit(y), info["scale"])

    return build
