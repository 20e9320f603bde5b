"""(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta => layer_norm(x, gamma, beta).

The decomposed LayerNorm that exporters emit below opset 17 (ReduceMean, Sub, Pow 2,
ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta; also d*rsqrt(v+eps) and d*d), with
constant gamma/beta varying along the normalized axes only (either may be absent).
Nine kernels' worth of ops become one; TVM's layer_norm kernel is two-pass and accumulates
fp16 in fp32.  Run stable_variance first: it turns the E[x^2]-E[x]^2 variant into this form.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import (Dataflow, Match, axes_of, dims_of, per_feature, rewrite_matches,
                       square_base)


class FuseLayerNorm(GraphPass):
    """(x - mean) / sqrt(var + eps) * gamma + beta => layer_norm(x, gamma, beta)"""

    name = "fuse_layer_norm"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan, exclusive=True)


def _match(df: Dataflow, root):
    """Peel ``+ beta`` and ``* gamma`` off ``root``, then match the normalisation."""
    consts, y, chain = {}, root, []
    for op, key in (("add", "beta"), ("multiply", "gamma")):
        call = df.call(y, op)
        a, c = _split_const(df, call) if call is not None else (None, None)
        if a is None:
            continue
        scaled = df.call(a, "multiply")
        inside = _split_const(df, scaled)[0] if scaled is not None else None
        if _core(df, a) is not None or (key == "beta" and inside is not None
                                        and _core(df, inside) is not None):
            consts[key] = c
            chain.append(y)
            y = a
    core = _core(df, y)
    if core is None:
        return None
    x, axes, eps, inner = core
    inner += [df.source(v) for v in chain[1:] + [y] if not v.same_as(root)]
    shape = dims_of(x)  # symbolic dims None (a batch or sequence: a transformer's rows)
    if any(shape[a] is None for a in axes):
        # a symbolic normalised axis (InstanceNormalization over a dynamic length: wav2vec2's
        # group norm over the samples): no gamma / beta along it, they are ones and zeros of
        # its symbolic size (TVM's decomposition ran under dlight's reduction at 16x the
        # fused kernel's time)
        if consts:
            return None
        params = {"gamma": None, "beta": None}
    else:
        params = {key: per_feature(consts.get(key), shape, axes, default)
                  for key, default in (("gamma", 1.0), ("beta", 0.0))}
        if any(p is None for p in params.values()):
            return None
    if not df.private(inner, root):
        return None
    return Match("decomposed LayerNorm => layer_norm", root, inner,
                 {"x": x, "axes": axes, "eps": eps, **params})


def _split_const(df: Dataflow, call):
    """(other operand, constant operand) of a binary call with one constant operand."""
    for a, c in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
        k = df.const(c)
        if k is not None and df.const(a) is None:
            return a, k
    return None, None


def _core(df: Dataflow, n):
    """(x - m) / sqrt(mean((x - m)^2) + eps), m = mean(x), or with variance(x) for the
    mean of squares: (x, axes, eps, bindings) or None."""
    d = ve = None
    inner = []
    div = df.call(n, "divide")
    if div is not None and (s := df.call(div.args[1], "sqrt")) is not None:
        d, ve = div.args[0], s.args[0]
        inner = [df.source(div.args[1])]
    mul = df.call(n, "multiply")
    if mul is not None:
        for a, r in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
            rs = df.call(r, "rsqrt")
            if rs is not None:
                d, ve, inner = a, rs.args[0], [df.source(r)]
                break
    if d is None:
        return None
    add = df.call(ve, "add")
    if add is None:
        return None
    eps = df.scalar(add.args[1])
    v = add.args[0]
    if eps is None:
        eps, v = df.scalar(add.args[0]), add.args[1]
    mean_sq = df.call(v, "mean")
    var = df.call(v, "variance")
    sub = df.call(d, "subtract")
    if eps is None or eps < 0 or (mean_sq is None and var is None) or sub is None:
        return None
    x, m = sub.args
    shape = dims_of(x)  # symbolic entries None: the axes are read off the rank
    if shape is None:
        return None
    if var is not None:
        # variance(x) itself (TVM's import of InstanceNormalization; its kernel is two-pass
        # like layer_norm's): the same x as the numerator's, population variance
        if not df.source(var.args[0]).same_as(df.source(x)) or not var.attrs.keepdims:
            return None
        mean_sq, sq, base = var, None, None
    else:
        sq = mean_sq.args[0]
        base = square_base(df, sq, _same)
        if base is None or not _same(df, base, d):
            return None
    mean_x = df.call(m, "mean")
    if mean_x is None or not df.source(mean_x.args[0]).same_as(df.source(x)):
        return None
    axes = axes_of(mean_x, len(shape))
    if (axes != axes_of(mean_sq, len(shape)) or not mean_x.attrs.keepdims
            or not mean_sq.attrs.keepdims):
        return None
    inner += [df.source(e) for e in (ve, v, d, m) + ((sq,) if sq is not None else ())]
    if base is not None and not df.source(base).same_as(df.source(d)):
        inner.append(df.source(base))
    return x, axes, eps, inner


def _same(df: Dataflow, a, b) -> bool:
    """Same value: one binding, or two subtracts of the same operands (stable_variance
    emits its own x - mean next to the numerator's)."""
    if df.source(a).same_as(df.source(b)):
        return True
    sa, sb = df.call(a, "subtract"), df.call(b, "subtract")
    return sa is not None and sb is not None and all(
        df.source(p).same_as(df.source(q)) for p, q in zip(sa.args, sb.args))


def _plan(m: Match):
    def build(em):
        x = m.info["x"]
        dtype = str(x.ty.dtype)
        if m.info["gamma"] is None:
            # a symbolic normalised axis: ones and zeros of it, for the op's signature;
            # without scale / center onnxc's legalization reads neither (legalize_vector_
            # math), and the kernels computing them are then dead
            feat = relax.ShapeExpr([x.ty.shape.values[a] for a in m.info["axes"]])
            return relax.op.nn.layer_norm(x, relax.op.ones(feat, dtype),
                                          relax.op.zeros(feat, dtype), axes=m.info["axes"],
                                          epsilon=m.info["eps"], center=False, scale=False)
        gamma = relax.const(m.info["gamma"].astype(dtype))
        beta = relax.const(m.info["beta"].astype(dtype))
        return relax.op.nn.layer_norm(x, gamma, beta, axes=m.info["axes"],
                                      epsilon=m.info["eps"])

    return build
