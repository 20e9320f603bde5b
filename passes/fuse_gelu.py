"""x * 0.5 * (1 + erf(x / sqrt(2))) => gelu(x);
0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) => gelu_tanh(x).

Any association and order of the products (Mul(x, .) then Mul 0.5, Mul(x, 0.5) first,
...), x / sqrt(2) or x * (1/sqrt(2)), x^3 as Pow(x, 3) or x*x*x.  The op chain becomes one
Relax op whose kernel is TVM's (fp16 erf evaluated in fp32).
"""

from __future__ import annotations

import math

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, rewrite_matches


class FuseGelu(GraphPass):
    """x * 0.5 * (1 + erf(x / sqrt2)) => gelu(x); tanh form => gelu_tanh(x)"""

    name = "fuse_gelu"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan, exclusive=True)


def _close(a, b) -> bool:
    return a is not None and abs(a - b) <= 1e-5 * abs(b)


def _product(df: Dataflow, expr, inner: list, top: bool = True):
    """(constant factor, [non-constant factors]) of a tree of multiplies (and divisions by
    constants) used only inside the tree; the bindings opened are appended to ``inner``."""
    c = df.scalar(expr)
    if c is not None:
        return c, []
    if not top and df.uses(expr) != 1:
        return 1.0, [expr]   # shared (e.g. another GELU's output): a factor, not opened
    mul, div = df.call(expr, "multiply"), df.call(expr, "divide")
    if mul is not None:
        inner.append(df.source(expr))
        ca, fa = _product(df, mul.args[0], inner, False)
        cb, fb = _product(df, mul.args[1], inner, False)
        return ca * cb, fa + fb
    if div is not None and (d := df.scalar(div.args[1])) not in (None, 0.0):
        inner.append(df.source(expr))
        ca, fa = _product(df, div.args[0], inner, False)
        return ca / d, fa
    return 1.0, [expr]


def _one_plus(df: Dataflow, expr, op: str, inner: list):
    """The argument u of ``1 + op(u)``, or None."""
    add = df.call(expr, "add")
    if add is None:
        return None
    for one, t in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        f = df.call(t, op)
        if df.scalar(one) == 1.0 and f is not None:
            inner += [df.source(expr), df.source(t)]
            return f.args[0]
    return None


def _is_x_times(df: Dataflow, expr, x, scale: float, inner: list) -> bool:
    c, fs = _product(df, expr, inner)
    return _close(c, scale) and len(fs) == 1 and df.source(fs[0]).same_as(df.source(x))


def _cube(df: Dataflow, factors, x, inner: list) -> bool:
    """Whether the factors multiply to x^3 (x, x*x*x, pow(x, 3), x * pow(x, 2))."""
    power = 0
    for f in factors:
        pw = df.call(f, "power")
        if df.source(f).same_as(df.source(x)):
            power += 1
        elif pw is not None and df.source(pw.args[0]).same_as(df.source(x)) and \
                df.scalar(pw.args[1]) in (2.0, 3.0):
            power += int(df.scalar(pw.args[1]))
            inner.append(df.source(f))
        else:
            return False
    return power == 3


def _tanh_arg_ok(df: Dataflow, u, x, inner: list) -> bool:
    """u == sqrt(2/pi) * (x + 0.044715 * x^3)."""
    c, fs = _product(df, u, inner)
    if not _close(c, math.sqrt(2 / math.pi)) or len(fs) != 1:
        return False
    add = df.call(fs[0], "add")
    if add is None:
        return False
    inner.append(df.source(fs[0]))
    for a, b in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        if not df.source(a).same_as(df.source(x)):
            continue
        cb, fb = _product(df, b, inner)
        if _close(cb, 0.044715) and _cube(df, fb, x, inner):
            return True
    return False


def _match(df: Dataflow, root):
    if df.call(root, "multiply") is None:
        return None
    inner: list = []
    c, factors = _product(df, root, inner)
    if not _close(c, 0.5) or len(factors) != 2:
        return None
    inner = [v for v in inner if not v.same_as(df.source(root))]
    for x, rest in ((factors[0], factors[1]), (factors[1], factors[0])):
        if df.const(x) is not None:
            continue
        tail = list(inner)
        u = _one_plus(df, rest, "erf", tail)
        if u is not None and _is_x_times(df, u, x, 1 / math.sqrt(2), tail):
            rule, op = "x*0.5*(1+erf(x/sqrt2)) => gelu", relax.op.nn.gelu
        else:
            tail = list(inner)
            u = _one_plus(df, rest, "tanh", tail)
            if u is None or not _tanh_arg_ok(df, u, x, tail):
                continue
            rule, op = "0.5*x*(1+tanh(...)) => gelu_tanh", relax.op.nn.gelu_tanh
        tail = [v for v in tail if not v.same_as(df.source(x))]
        if df.private(tail, root):
            return Match(rule, root, tail, {"x": x, "op": op})
    return None


def _plan(m: Match):
    return lambda em: m.info["op"](m.info["x"])
