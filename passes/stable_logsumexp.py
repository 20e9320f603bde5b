"""log(sum(exp(x))) => m + log(sum(exp(x - m))), m = max(x).

exp(x) overflows for x > 88 (fp32): the naive form gives inf where the answer is about
max(x).  TVM 0.27's ONNX ReduceLogSumExp converter already emits the max-subtracted form
(and is not touched: its exp argument is x - max(x)); this catches the decomposed
ReduceSum(Exp(x)) -> Log that exporters and hand-written models produce.
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, axes_of, is_float, rewrite_matches, shape_of


class StableLogSumExp(GraphPass):
    """log(sum(exp(x))) => m + log(sum(exp(x - m))), m = max(x)"""

    name = "stable_logsumexp"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan)


def _match(df: Dataflow, root):
    log = df.call(root, "log")
    red = df.call(log.args[0], "sum") if log is not None else None
    exp = df.call(red.args[0], "exp") if red is not None else None
    if exp is None or not is_float(root):
        return None
    x = exp.args[0]
    shape = shape_of(x)
    if shape is None:
        return None
    axes = axes_of(red, len(shape))
    sub = df.call(x, "subtract")
    mx = df.call(sub.args[1], "max") if sub is not None else None
    if mx is not None and df.source(mx.args[0]).same_as(df.source(sub.args[0])):
        return None  # already exp(x - max(x))
    inner = [df.source(log.args[0]), df.source(red.args[0])]
    if not df.private(inner, root):
        return None
    return Match("log(sum(exp(x))) => max + log(sum(exp(x - max)))", root, inner,
                 {"x": x, "axes": axes, "keepdims": bool(red.attrs.keepdims),
                  "exp": df.source(red.args[0]), "sum": df.source(log.args[0])})


def _plan(m: Match):
    x, axes, keepdims = m.info["x"], m.info["axes"], m.info["keepdims"]

    def build(em):
        # each new binding is named after the node it stands for (kernels name them)
        mx = em.emit(relax.op.max(x, axes, keepdims=True), like=m.info["exp"])
        d = em.emit(relax.op.subtract(x, mx), like=m.info["exp"])
        e = em.emit(relax.op.exp(d), like=m.info["exp"])
        s = em.emit(relax.op.sum(e, axes, keepdims=keepdims), like=m.info["sum"])
        lg = em.emit(relax.op.log(s))
        shift = mx if keepdims else em.emit(relax.op.squeeze(mx, axes))
        return relax.op.add(lg, shift)

    return build
