"""Vectorisable float32 math as TIR expressions: erf, tanh, exp, log, and a cheaper exp of
a non-positive argument.

LLVM emits TVM's ``T.erf`` / ``T.exp`` as one scalar libm call per vector lane; these are
plain arithmetic that vectorises.  Used by the lowering's GELU and softmax legalizations
(``compiler/lowering/legalize_vector_math.py``, which documents the approximations and
their measured error) and by graph passes whose TE computes need exp of ``-|x|``
(``stable_sigmoid``).  Not a pass: expression builders shared by passes and lowering.

* ``|x| < 0.921875``: ``erf(x) = x * P(x^2)``, P of degree 5 (relative error 1.6e-8);
* above: ``erf(|x|) = 1 - exp(Q(|x|))`` with Q of degree 8 fitted to ``log(erfc(t))``
  on [0.921875, 3.92] (absolute error 9e-9), and exp by range reduction to
  ``r in [-ln2/2, ln2/2]``, a degree-6 polynomial and ``2^(n+24)`` built in the exponent
  bits, times ``2^-24`` (one rounding: subnormal results as libm's).

tanh: the rational approximation Eigen and onnxruntime's MLAS use, ``x P(x^2) / Q(x^2)``
(degrees 13 / 6) on x clamped to +-7.905 (tanh there is 1.0f), ``x`` itself for
``|x| < 0.0004``; within 3.5e-7 of float64 tanh on [-12, 12] (2.7e-7 relative below 1).
The clamp keeps a NaN (compares false), the small branch keeps -0.0.

log: Cephes' ``logf``: ``x = m 2^e`` from the bits (m in [sqrt(1/2), sqrt(2))), ``log(m)`` as
``f - f^2/2 + f^3 P(f)`` with ``f = m - 1`` (P of degree 8), ``e ln2`` in two parts;
subnormal inputs scaled by 2^23 first; 0 gives -inf, +inf itself, a negative or NaN NaN.

atan: Cephes' ``atanf``: |x| reduced to [0, tan(pi/8)] by ``pi/2 + atan(-1/x)`` or
``pi/4 + atan((x - 1) / (x + 1))``, then ``x + x z P(z)`` (z = x^2, P of degree 3); the
sign restored (-0 stays -0, +-inf give +-pi/2, NaN stays NaN); within 2.8 ulp of float64.
"""

from __future__ import annotations

import math

from tvm import tirx

_SPLIT, _TOP = 0.921875, 3.92
# erf(x) / x as a polynomial in s = x^2 on [0, _SPLIT^2]
_P = (1.1283791490985833, -0.37612491121573244, 0.11281792751712608,
      -0.026765861225326773, 0.00499218103791263, -0.0005986208511002677)
# log(erfc(t)) on [_SPLIT, _TOP]
_Q = (0.00031142616610973497, -1.1302023723434886, -0.6318717429774002,
      -0.11004408413400417, 0.026404684927086954, -0.00475521683786034,
      0.0005961714175972271, -4.6018272874204236e-05, 1.6369182196385168e-06)
# exp(r) on [-ln2/2, ln2/2]
_E = (1.0000000005920207, 1.0000000361258994, 0.49999991493036744, 0.16666420832119083,
      0.041668358033024336, 0.008374771520121985, 0.0013829420595871025)
# tanh: x * _TN(x^2) / _TD(x^2)
_TN = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
       5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
       -2.76076847742355e-16)
_TD = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
       1.19825839466702e-06)
_TCLAMP = 7.90531110763549805
_LN2_HI = 0.693145751953125  # ln2 with 16 significant bits: n * _LN2_HI is exact
_LN2_LO = math.log(2) - _LN2_HI


def const(v):
    return tirx.const(v, "float32")


class _Binding:
    """A value a formula reads several times, bound once by a TIR ``Let`` (``_lets``):
    written into every use (``Select(low, m + m - 1, m - 1)``, Horner steps) its
    expression grows the tree at each use, and a fused kernel that inlines the result into
    several reads multiplies it again (the Log kernel's TIR is about 5x smaller bound)."""

    def __init__(self, name, value):
        self.var, self.value = tirx.Var(name, str(value.ty)), value


def _lets(bindings, body):
    """``body`` under ``Let``s of ``bindings``, the first outermost."""
    for b in reversed(bindings):
        body = tirx.Let(b.var, b.value, body)
    return body


def _horner(coefs, x):
    acc = const(coefs[-1])
    for a in reversed(coefs[:-1]):
        acc = acc * x + const(a)
    return acc


_SUB = 24  # 2^(n + _SUB) stays normal for every n >= -150 (exp(-103.98) = 2^-150.01)


def _pow2(n, bias):
    """2^(n + bias - 127) for an integer-valued float32 n, built in the exponent bits
    (``bias`` an int32 PrimExpr; the caller keeps the exponent field normal)."""
    return tirx.reinterpret("float32", tirx.shift_left(tirx.Cast("int32", n) + bias,
                                                       tirx.const(23, "int32")))


def _reduce(g):
    """(n, r) with ``g = n ln2 + r``, n integer-valued, r in [-ln2/2, ln2/2] (ln2 in two
    parts: ``n * _LN2_HI`` is exact)."""
    n = tirx.floor(g * const(1 / math.log(2)) + const(0.5))
    return n, g - n * const(_LN2_HI) - n * const(_LN2_LO)


def _exp_negative(g):
    """exp(g) for finite g in [-104, 0]: ``p(r) * 2^(n + 24)`` is exact (a normal power of
    two), then ``* 2^-24`` rounds once, so results below the smallest normal (g < -87.3)
    come out subnormal as libm's.  (Was ``p * 2^h * 2^(n - h)``, h = floor(n / 2): the
    same values, five vector ops more; 12x128x128 softmax 0.17 -> 0.15 ms, znver3.)"""
    n, r = _reduce(g)  # 2^(n + 24) is normal for every n >= -150
    return _horner(_E, r) * _pow2(n, tirx.const(127 + _SUB, "int32")) * const(2.0 ** -_SUB)


def exp_normal_f32(g):
    """exp(g) for g in [ln(FLT_MIN), 0] = [-87.33, 0], whose results are normal (the
    caller clamps; softmax's exps below its flush cut): ``p(r) * 2^n`` with ``2^n`` built
    directly in the exponent bits (n >= -126), without ``_exp_negative``'s ``2^-24``
    scaling and -103.98 clamp: two vector ops fewer per vector."""
    n, r = _reduce(g)
    return _horner(_E, r) * _pow2(n, tirx.const(127, "int32"))


def erf_f32(x):
    """erf of a float32 PrimExpr, as vectorisable arithmetic (no libm call)."""
    t = tirx.min(tirx.abs(x), const(_TOP))
    small = x * _horner(_P, x * x)
    big = const(1.0) - _exp_negative(_horner(_Q, tirx.max(t, const(_SPLIT))))
    big = tirx.Select(x < const(0.0), -big, big)
    # |x| compared, not t: a NaN compares false and takes the small branch, NaN * P = NaN
    # (t = min(NaN, _TOP) may be _TOP on x86, and the big branch 1.0)
    return tirx.Select(const(_SPLIT) <= tirx.abs(x), big, small)


def exp_nonpositive_f32(x):
    """exp of a float32 PrimExpr known to be <= 0 (or -inf, NaN), vectorisable."""
    # exp(-103.98) = 0.496 * 2^-149 rounds to 0 in _exp_negative's one rounding: clamping
    # -inf and anything below to it gives exactly 0.  The clamp is a select that keeps a
    # NaN (NaN < lo is false): NaN then flows through the polynomial, NaN out, with no
    # isnan select (x86: one vmaxps with NaN-keeping operand order)
    lo = const(-103.98)
    return _exp_negative(tirx.Select(x < lo, lo, x))


def exp_f32(x):
    """exp of any float32 PrimExpr (read several times: bind it first), vectorisable: 0
    below -103.98 (subnormal results as libm's), +inf above 88.72, NaN stays NaN.  The
    power of two is built as ``2^(n + 24)`` for n < 0 (then ``* 2^-24``, one rounding,
    as ``exp_nonpositive_f32``) and as ``2^(n - 24)`` for n >= 0 (then ``* 2^24``: n up
    to 128 overflows to inf there, as it must), so the exponent bits stay normal."""
    lo, hi = const(-103.98), const(89.0)  # exp(89) > FLT_MAX: inf through the scaling
    g = tirx.Select(x < lo, lo, tirx.Select(hi < x, hi, x))  # compares keep a NaN
    n, r = _reduce(g)
    neg = n < const(0.0)
    bias = tirx.Select(neg, tirx.const(127 + _SUB, "int32"), tirx.const(127 - _SUB, "int32"))
    scale = tirx.Select(neg, const(2.0 ** -_SUB), const(2.0 ** _SUB))
    return _horner(_E, r) * _pow2(n, bias) * scale


def tanh_f32(x):
    """tanh of a float32 PrimExpr (read several times: bind it first), vectorisable."""
    c = const(_TCLAMP)
    xc = tirx.Select(c < x, c, tirx.Select(x < -c, -c, x))
    s = xc * xc
    r = xc * _horner(_TN, s) / _horner(_TD, s)
    return tirx.Select(tirx.abs(x) < const(0.0004), x, r)


# log(1 + f) = f - f^2 / 2 + f^3 _LOG(f) on [sqrt(1/2) - 1, sqrt(2) - 1] (Cephes' logf)
_LOG = (3.3333331174e-1, -2.4999993993e-1, 2.0000714765e-1, -1.6668057665e-1,
        1.4249322787e-1, -1.2420140846e-1, 1.1676998740e-1, -1.1514610310e-1,
        7.0376836292e-2)
_FLT_MIN = 1.1754943508222875e-38


def log_f32(x):
    """log of a float32 PrimExpr (read several times: bind it first), vectorisable."""
    i32 = "int32"
    tiny = x < const(_FLT_MIN)  # subnormals scaled to normal (zero, negatives, NaN: below)
    bits = _Binding("bits", tirx.reinterpret(i32, tirx.Select(tiny, x * const(2.0 ** 23), x)))
    e = tirx.Cast("float32", tirx.bitwise_and(tirx.shift_right(bits.var, tirx.const(23, i32)),
                                              tirx.const(0xFF, i32)) - tirx.const(126, i32))
    e = e - tirx.Select(tiny, const(23.0), const(0.0))
    m = _Binding("m", tirx.reinterpret("float32", tirx.bitwise_or(
        tirx.bitwise_and(bits.var, tirx.const(0x007FFFFF, i32)), tirx.const(0x3F000000, i32))))
    low = m.var < const(0.7071067811865476)  # m in [1/2, 1): to [sqrt(1/2), sqrt(2))
    e = _Binding("e", tirx.Select(low, e - const(1.0), e))
    f = _Binding("f", tirx.Select(low, m.var + m.var - const(1.0), m.var - const(1.0)))
    z = _Binding("z", f.var * f.var)
    y = f.var * z.var * _horner(_LOG, f.var) + e.var * const(-2.12194440e-4) \
        - const(0.5) * z.var
    r = f.var + y + e.var * const(0.693359375)
    inf = const(float("inf"))
    return _lets([bits, m, e, f, z], tirx.Select(
        tirx.all(const(0.0) < x, x < inf), r,
        tirx.Select(x == const(0.0), -inf, tirx.Select(x == inf, inf, const(float("nan"))))))


# log1p(t) = 2 atanh(s), s = t / (2 + t): for t in [0, 1], s <= 1/3 and
# 2 (s + s^3/3 + ... + s^15/15) is within float32 rounding (the next term < 1e-8 of it)
_ATANH2 = tuple(2.0 / (2 * k + 1) for k in range(8))


def log1p_unit_f32(t):
    """log(1 + t) of a float32 PrimExpr ``t`` in [0, 1] (read once), vectorisable: ``2
    atanh(t / (2 + t))`` as an odd polynomial (the stable softplus's ``log1p(exp(-|x|))``;
    within 3 ulp of float64 there)."""
    s = _Binding("s", t / (const(2.0) + t))
    return _lets([s], s.var * _horner(_ATANH2, s.var * s.var))


# atan(x) = x + x^3 _ATAN(x^2) on [0, tan(pi/8)] (Cephes' atanf)
_ATAN = (-3.33329491539e-1, 1.99777106478e-1, -1.38776856032e-1, 8.05374449538e-2)


def atan_f32(x):
    """atan of a float32 PrimExpr (read several times: bind it first), vectorisable."""
    a = _Binding("a", tirx.abs(x))
    big = const(2.414213562373095) < a.var      # tan(3 pi / 8)
    mid = const(0.4142135623730950) < a.var     # tan(pi / 8)
    t = _Binding("t", tirx.Select(big, const(-1.0) / a.var, tirx.Select(
        mid, (a.var - const(1.0)) / (a.var + const(1.0)), a.var)))
    base = tirx.Select(big, const(math.pi / 2), tirx.Select(mid, const(math.pi / 4),
                                                            const(0.0)))
    z = _Binding("z", t.var * t.var)
    r = base + (t.var + t.var * z.var * _horner(_ATAN, z.var))
    return _lets([a, t, z], tirx.Select(x < const(0.0), -r,
                                        tirx.Select(x == const(0.0), x, r)))
