"""softmax(Q @ K^T * scale [+ mask]) @ V => attention(Q, K, V, mask, scale).

Rank-4 heads layout [B, N, S, D] as exported (MatMul, Mul or Div by a scalar, optional
Add of a mask, Softmax on the last axis, MatMul).  R.nn.attention takes [B, S, N, D]: the
transposes it needs are composed with the ones that made the heads layout (usually they
cancel).  TVM 0.27 legalizes it to one kernel (batch matmul, softmax with the row max
subtracted, batch matmul).  Run after stable_softmax (decomposed softmax => softmax).
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, is_float, record, rewrite, shape_of


class FuseAttention(GraphPass):
    """softmax(Q @ K^T * scale + mask) @ V => attention(Q, K, V, mask, scale)"""

    name = "fuse_attention"
    # opt-in (required_passes=["fuse_attention"]): one kernel instead of three, but with no
    # attention schedule rule yet the fallback schedule makes BERT 2x slower
    opt_level = 4

    def rewrite(self, mod, report: PassReport, options: dict):
        df = Dataflow(mod)
        matches = [m for b in df.roots()
                   for m in [_match(df, b.var)] if m]
        record(report, df, matches)
        return rewrite(mod, matches, lambda m: _plan(df, m))


def _match(df: Dataflow, root):
    pv = df.call(root, "matmul")
    if pv is None or not is_float(root):
        return None
    p, v = pv.args
    sm = df.call(p, "nn.softmax")
    if sm is None or int(sm.attrs.axis) not in (-1, 3):
        return None
    inner, s, mask = [df.source(p)], sm.args[0], None
    add = df.call(s, "add")
    if add is not None:
        inner.append(df.source(s))
        s, mask = _scores_and_mask(df, add)
        if s is None:
            return None
    scaled = df.call(s, "multiply", "divide")
    if scaled is None:
        return None
    qk, scale = _scores_and_scale(df, scaled)
    mm = df.call(qk, "matmul") if qk is not None else None
    if mm is None:
        return None
    inner += [df.source(s), df.source(qk)]
    q, kt = mm.args
    shapes = [shape_of(e) for e in (q, kt, v)]
    if any(sh is None or len(sh) != 4 for sh in shapes):
        return None
    (b, n, sq, d), (b2, n2, d2, skv), (b3, n3, skv2, _) = shapes
    if (b, n) != (b2, n2) or (b, n) != (b3, n3) or d != d2 or skv != skv2:
        return None
    if mask is not None:
        ms = shape_of(mask)
        if ms is None or len(ms) > 4 or not all(
                x in (1, y) for x, y in zip([1] * (4 - len(ms)) + ms, (b, n, sq, skv))):
            return None
    if not df.private(inner, root):
        return None
    return Match("softmax(QK^T*s [+ mask])V => attention", root, inner,
                 {"q": q, "kt": kt, "v": v, "mask": mask, "scale": scale})


def _scores_and_mask(df: Dataflow, add):
    for s, m in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        if df.call(s, "multiply", "divide") is not None:
            return s, m
    return None, None


def _scores_and_scale(df: Dataflow, call):
    """(Q@K^T operand, multiplicative scale) of a multiply/divide by a scalar constant."""
    a, c = call.args
    if call.op.name == "relax.divide":
        d = df.scalar(c)
        return (a, 1.0 / d) if d not in (None, 0.0) else (None, None)
    for x, k in ((a, c), (c, a)):
        sc = df.scalar(k)
        if sc is not None:
            return x, sc
    return None, None


def _plan(df: Dataflow, m: Match):
    info = m.info

    def heads_last(em, x, perm):
        """permute_dims(x, perm), composed with a permute that produced x (which usually
        cancels: Transpose(0,2,1,3) of the exported heads layout)."""
        src = df.call(x, "permute_dims")
        if src is not None and src.attrs.axes is not None:
            axes = [int(a) for a in src.attrs.axes]
            perm = [axes[p] for p in perm]
            x = src.args[0]
        if perm == sorted(perm):
            return x
        return em.emit(relax.op.permute_dims(x, perm))

    def build(em):
        q = heads_last(em, info["q"], [0, 2, 1, 3])
        k = heads_last(em, info["kt"], [0, 3, 1, 2])
        v = heads_last(em, info["v"], [0, 2, 1, 3])
        mask = info["mask"]
        if mask is not None and len(shape_of(mask)) < 4:
            shape = [1] * (4 - len(shape_of(mask))) + shape_of(mask)
            const = df.const(mask)
            mask = relax.const(const.reshape(shape)) if const is not None else \
                em.emit(relax.op.reshape(mask, shape))
        o = em.emit(relax.op.nn.attention(q, k, v, mask, scale=info["scale"]))
        return relax.op.permute_dims(o, [0, 2, 1, 3])

    return build
