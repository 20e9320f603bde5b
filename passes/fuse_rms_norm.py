"""gamma * (x / sqrt(mean(x^2) + eps)) => rms_norm(x, gamma).

The decomposed RMSNorm that T5 and LLaMA exports carry (Pow 2, ReduceMean over the last
axes, Add eps, Sqrt, then Div(x, sqrt) or Mul(x, Div(1, sqrt)) or Mul(x, rsqrt), Mul
gamma; float32 -> float32 Casts in between, as torch writes them, are looked through),
with a constant gamma varying along the normalised axes only (or absent).  Imported as
is it is two kernels (the square on its own, then the reduction with the rest) that read
x twice; ``rms_norm`` is one row kernel (T5-small's 128 x 512 rows: 0.041 -> 0.032 ms,
single-thread on Zen 3).  Float32 only.  Runs with fuse_layer_norm (whose mean-centred
form has a subtract this one refuses).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import (Dataflow, Match, axes_of, dims_of, dtype_of, per_feature,
                       rewrite_matches, square_base)

RULE = "gamma * (x / sqrt(mean(x^2) + eps)) => rms_norm(x, gamma)"


class FuseRmsNorm(GraphPass):
    """gamma * x / sqrt(mean(x^2) + eps) => rms_norm(x, gamma) over the last axes"""

    name = "fuse_rms_norm"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan, exclusive=True)


def _match(df: Dataflow, root):
    """Peel ``* gamma`` (and a same-type cast) off ``root``, then match the normalisation."""
    if dtype_of(root) != "float32":
        return None
    gamma, y, inner = None, root, []
    mul = df.call(root, "multiply")
    if mul is not None:
        for a, c in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
            k = df.const(c)
            if k is not None and df.const(a) is None and _core(df, _uncast(df, a)) is not None:
                gamma, y = k, a
                break
    if gamma is not None:
        stripped = _uncast(df, y)
        inner += [df.source(v) for v in (y, stripped) if not df.source(v).same_as(root)]
        y = stripped
    core = _core(df, y)
    if core is None:
        return None
    x, axes, eps, found = core
    inner = [v for v in dict.fromkeys(inner + found) if not v.same_as(root)]
    shape = dims_of(x)  # symbolic rows (a decoder's batch / seq) as None: the axes are static
    weight = None if gamma is not None and gamma.dtype != np.float32 else \
        per_feature(gamma, shape, axes)
    if weight is None or not df.private(inner, root):
        return None
    return Match(RULE, root, inner, {"x": x, "axes": axes, "eps": eps, "gamma": weight})


def _uncast(df: Dataflow, e):
    """``e`` without casts to its own dtype (torch's float32 -> float32 Casts)."""
    while (c := df.call(e, "astype")) is not None and dtype_of(c.args[0]) == dtype_of(e):
        e = c.args[0]
    return e


def _core(df: Dataflow, n):
    """x / sqrt(mean(x^2) + eps), x * (1 / sqrt(..)) or x * rsqrt(..) over the last axes:
    (x, axes, eps, bindings) or None."""
    n = _uncast(df, n)
    d = ve = None
    inner = [df.source(n)]
    div = df.call(n, "divide")
    if div is not None and (s := df.call(div.args[1], "sqrt")) is not None:
        d, ve = div.args[0], s.args[0]
        inner.append(df.source(div.args[1]))
    mul = df.call(n, "multiply")
    for a, r in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])) if mul is not None else ():
        rs = df.call(r, "rsqrt")
        inv = df.call(r, "divide")
        if rs is not None:
            d, ve, inner = a, rs.args[0], inner + [df.source(r)]
            break
        if inv is not None and df.scalar(inv.args[0]) == 1.0 and \
                (s := df.call(inv.args[1], "sqrt")) is not None:
            d, ve, inner = a, s.args[0], inner + [df.source(r), df.source(inv.args[1])]
            break
    if d is None:
        return None
    add = df.call(ve, "add")
    if add is None:
        return None
    eps, v = df.scalar(add.args[1]), add.args[0]
    if eps is None:
        eps, v = df.scalar(add.args[0]), add.args[1]
    mean_sq = df.call(v, "mean")
    if eps is None or eps < 0 or mean_sq is None or not mean_sq.attrs.keepdims:
        return None
    x = _uncast(df, d)
    base = square_base(df, mean_sq.args[0])
    shape = dims_of(x)
    if base is None or shape is None or not df.source(_uncast(df, base)).same_as(df.source(x)):
        return None
    axes = axes_of(mean_sq, len(shape))
    # rms_norm normalises trailing axes, and at least one leading axis stays (over all of
    # them TVM's legalization reads the 0-d mean with an index: "Tensor dimension mismatch")
    if not axes or axes != list(range(len(shape) - len(axes), len(shape))) or \
            len(axes) >= len(shape):
        return None
    inner += [df.source(e) for e in (ve, v, mean_sq.args[0])]
    return x, axes, eps, inner


def _plan(m: Match):
    def build(em):
        return relax.op.nn.rms_norm(m.info["x"], relax.const(m.info["gamma"]),
                                    axes=m.info["axes"], epsilon=m.info["eps"])

    return build
