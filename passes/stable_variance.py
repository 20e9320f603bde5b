"""mean(x*x) - mean(x)^2 => mean((x - mean(x))^2).

The one-pass variance cancels catastrophically when |mean| >> std (fp32 activations with
mean 1e4 and std 1 give a variance off by ~10, often negative, then NaN from sqrt); the
two-pass form is exact to rounding.  TVM 0.27's own variance/std and layer_norm kernels
are two-pass already and are not touched.  Runs before fuse_layer_norm, which then sees a
LayerNorm written with the one-pass variance as the ordinary decomposed form.
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, axes_of, is_float, rewrite_matches, shape_of


class StableVariance(GraphPass):
    """mean(x^2) - mean(x)^2 => mean((x - mean(x))^2)"""

    name = "stable_variance"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan)


def _square_of(df: Dataflow, expr):
    """y if ``expr`` is y*y or y^2, else None."""
    pw = df.call(expr, "power")
    if pw is not None and df.scalar(pw.args[1]) == 2.0:
        return pw.args[0]
    mul = df.call(expr, "multiply")
    if mul is not None and df.source(mul.args[0]).same_as(df.source(mul.args[1])):
        return mul.args[0]
    return None


def _match(df: Dataflow, root):
    sub = df.call(root, "subtract")
    if sub is None or not is_float(root):
        return None
    mean_sq = df.call(sub.args[0], "mean")
    m = _square_of(df, sub.args[1])
    mean_x = df.call(m, "mean") if m is not None else None
    if mean_sq is None or mean_x is None:
        return None
    x = _square_of(df, mean_sq.args[0])
    shape = shape_of(x) if x is not None else None
    if shape is None or not df.source(x).same_as(df.source(mean_x.args[0])):
        return None
    axes = axes_of(mean_x, len(shape))
    keep = bool(mean_x.attrs.keepdims)
    if axes != axes_of(mean_sq, len(shape)) or keep != bool(mean_sq.attrs.keepdims):
        return None
    inner = [df.source(e) for e in (sub.args[0], mean_sq.args[0], sub.args[1])]
    if not df.private(inner, root):
        return None
    return Match("mean(x^2) - mean(x)^2 => mean((x - mean)^2)", root, inner,
                 {"x": x, "mean": m, "axes": axes, "keepdims": keep,
                  "square": df.source(mean_sq.args[0])})


def _plan(m: Match):
    x, axes, keep = m.info["x"], m.info["axes"], m.info["keepdims"]

    def build(em):
        # named after the x*x node they replace (kernels name it)
        sq = m.info["square"]
        mk = m.info["mean"] if keep else em.emit(relax.op.mean(x, axes, keepdims=True), like=sq)
        d = em.emit(relax.op.subtract(x, mk), like=sq)
        d2 = em.emit(relax.op.multiply(d, d), like=sq)
        return relax.op.mean(d2, axes, keepdims=keep)

    return build
