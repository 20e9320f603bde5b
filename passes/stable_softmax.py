"""exp(x) / sum(exp(x)) => softmax(x);  log(softmax(x)) => log_softmax(x).

TVM 0.27's softmax and log_softmax kernels (topi) already subtract the row max, so
R.nn.softmax / R.nn.log_softmax are left alone.  What overflows is the decomposed form
exporters emit (Exp, ReduceSum, Div: exp(1e4) = inf, inf/inf = NaN), and log of a softmax
(underflow: softmax gives 0 for logits 1e4 apart, log 0 = -inf where log_softmax is
exact).  A decomposed softmax that already subtracts max(x) is fused too (one kernel).
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, axes_of, is_float, rewrite_matches, shape_of


class StableSoftmax(GraphPass):
    """exp(x) / sum(exp(x)) => softmax(x); log(softmax(x)) => log_softmax(x)"""

    name = "stable_softmax"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan, exclusive=True)


def _softmax(df: Dataflow, expr, inner: list):
    """(x, axis, rule) if ``expr`` is a softmax, decomposed or not; else None."""
    sm = df.call(expr, "nn.softmax")
    if sm is not None:
        return sm.args[0], int(sm.attrs.axis), None
    div = df.call(expr, "divide")
    if div is None:
        return None
    e, s = div.args
    exp, red = df.call(e, "exp"), df.call(s, "sum")
    shape = shape_of(e)
    if exp is None or red is None or shape is None or not red.attrs.keepdims:
        return None
    axes = axes_of(red, len(shape))
    if len(axes) != 1 or not df.source(red.args[0]).same_as(df.source(e)):
        return None
    x, rule = exp.args[0], "exp(x)/sum(exp(x)) => softmax"
    # exp(x - max(x)) / sum(...): the stable form already; fuse it, reading x
    sub = df.call(x, "subtract")
    mx = df.call(sub.args[1], "max") if sub is not None else None
    if (mx is not None and df.source(mx.args[0]).same_as(df.source(sub.args[0]))
            and axes_of(mx, len(shape)) == axes and mx.attrs.keepdims):
        inner += [df.source(x), df.source(sub.args[1])]
        x, rule = sub.args[0], "exp(x-max)/sum(exp(x-max)) => softmax"
    inner += [df.source(e), df.source(s)]
    return x, axes[0], rule


def _match(df: Dataflow, root):
    if not is_float(root):
        return None
    log = df.call(root, "log")
    if log is not None:
        inner = [df.source(log.args[0])]
        sm = _softmax(df, log.args[0], inner)
        if sm is not None and df.private(inner, root):
            rule = "log(softmax(x)) => log_softmax" if sm[2] is None else \
                "log(exp(x)/sum(exp(x))) => log_softmax"
            return Match(rule, root, inner, {"x": sm[0], "axis": sm[1], "log": True})
        return None
    inner: list = []
    sm = _softmax(df, root, inner)
    if sm is None or sm[2] is None:
        return None
    if df.private(inner, root):
        return Match(sm[2], root, inner, {"x": sm[0], "axis": sm[1], "log": False})
    return None


def _plan(m: Match):
    op = relax.op.nn.log_softmax if m.info["log"] else relax.op.nn.softmax
    return lambda em: op(m.info["x"], axis=m.info["axis"])
