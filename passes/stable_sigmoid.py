"""sigmoid(x) => x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)), with exp(-|x|) only.

TVM 0.27 lowers sigmoid (and a decomposed 1 / (1 + exp(-x))) to 1 / (1 + exp(-x)), whose
exp(-x) overflows for x below about -88 (fp32) or -11 (fp16): the result flushes to 0
where the true value is representable (fp16 sigmoid(-12) = 6.1e-6, not 0).  The rewrite
only ever evaluates exp of a non-positive number, and evaluates fp16 in fp32.
"""

from __future__ import annotations

from tvm import te, tirx

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, is_float, rewrite_matches
from .math_f32 import exp_nonpositive_f32


class StableSigmoid(GraphPass):
    """sigmoid(x) => where(x >= 0, 1/(1+exp(-|x|)), exp(-|x|)/(1+exp(-|x|)))"""

    name = "stable_sigmoid"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan, exclusive=True)


def _match(df: Dataflow, root):
    if not is_float(root):
        return None
    sig = df.call(root, "sigmoid")
    if sig is not None:
        return Match("sigmoid(x) => stable sigmoid", root, [], {"x": sig.args[0]})
    # 1 / (1 + exp(-x))
    div = df.call(root, "divide")
    if div is None or df.scalar(div.args[0]) != 1.0:
        return None
    add = df.call(div.args[1], "add")
    if add is None:
        return None
    for one, e in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        exp = df.call(e, "exp")
        neg = df.call(exp.args[0], "negative") if exp is not None else None
        if df.scalar(one) == 1.0 and neg is not None:
            inner = [df.source(v) for v in (div.args[1], e, exp.args[0])]
            if df.private(inner, root):
                return Match("1/(1+exp(-x)) => stable sigmoid", root, inner, {"x": neg.args[0]})
    return None


def stable_sigmoid_te(x: te.Tensor) -> te.Tensor:
    """TE compute of the overflow-free sigmoid (fp16 evaluated in fp32).

    ``(x >= 0 ? 1 : e) / (1 + e)`` with ``e = exp(-|x|)``: one exp and one division.  In
    float32 the exp is ``math_f32.exp_nonpositive_f32`` (vectorisable arithmetic; TVM's
    ``T.exp`` is one scalar libm call per lane: a swish over EfficientNet-B0's activations
    ran at 0.13 GFLOP/s).  NaN stays NaN, +-inf give 1 and 0, -0.0 gives 0.5."""
    wide = "float32" if x.dtype == "float16" else x.dtype

    def f(*i):
        v = tirx.Var("v", wide)
        e = tirx.Var("e", wide)
        neg = -tirx.abs(v)
        one = tirx.const(1, wide)
        body = tirx.Select(v >= tirx.const(0, wide), one, e) / (one + e)
        exp = exp_nonpositive_f32(neg) if wide == "float32" else tirx.exp(neg)
        return tirx.Let(v, x(*i).astype(wide), tirx.Let(e, exp, body)).astype(x.dtype)

    return te.compute(x.shape, f, name="sigmoid_stable")


def _plan(m: Match):
    return lambda em: em.call_te(stable_sigmoid_te, m.info["x"], name="sigmoid_stable")
