"""GELU and softmax legalized with erf / exp that LLVM vectorises (float32).

TVM's legalizations call ``T.erf`` / ``T.exp``, which the LLVM backend emits as one scalar
``erff`` / ``expf`` libm call per vector lane: in BERT's FFN kernel (matmul + bias + GELU)
the epilogue cost as much as the 768x3072 matmul itself (88 vs 230 GFLOP/s measured), and
softmax over 12x128x128 took 0.5 ms, nearly all in ``expf``.
TVM's own ``topi.fast_erf`` vectorises but is off by up to 3.7e-7 near |x| = 4 (about
1e-6 in the GELU output at x = -5.6).  So here erf is written out in plain arithmetic:

* ``|x| < 0.921875``: ``erf(x) = x * P(x^2)``, P of degree 5 (relative error 1.6e-8);
* above: ``erf(|x|) = 1 - exp(Q(|x|))`` with Q of degree 8 fitted to ``log(erfc(t))``
  on [0.921875, 3.92] (absolute error 9e-9), and exp by range reduction to
  ``r in [-ln2/2, ln2/2]``, a degree-6 polynomial and ``2^n`` built in the exponent bits;
  beyond 3.92, ``1 - erfc`` rounds to 1.0f anyway.

Both branches are computed and one selected, so the loop body has no branch.  Softmax's
exp only ever sees ``x - max(x) <= 0``: the same exp, with ``-inf`` (and anything below
the smallest normal's log) giving 0 and NaN staying NaN.  Measured against float64 on
[-12, 12]: erf within 1.2e-7, GELU within 5e-7 (as the float32 rounding of libm's),
exp within 2 ulp (tests/compiler/test_legalize_vector_math.py); coefficients fitted by
least squares in float64.  Targeted: only GELU and last-axis softmax use them
(``LEGALIZE_MAP``, applied by the lowering in compiler/pipeline.py); a bare ONNX ``Erf``
or ``Exp`` keeps libm, other dtypes keep TVM's legalization.
"""

from __future__ import annotations

import math

from tvm import te, tirx

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
_LN2_HI = 0.693145751953125  # ln2 with 16 significant bits: n * _LN2_HI is exact
_LN2_LO = math.log(2) - _LN2_HI


def _c(v):
    return tirx.const(v, "float32")


def _horner(coefs, x):
    acc = _c(coefs[-1])
    for a in reversed(coefs[:-1]):
        acc = acc * x + _c(a)
    return acc


def _exp_negative(g):
    """exp(g) for finite g in [-87.3, 0]: no overflow or subnormal handling."""
    n = tirx.floor(g * _c(1 / math.log(2)) + _c(0.5))
    r = g - n * _c(_LN2_HI) - n * _c(_LN2_LO)
    two_n = tirx.reinterpret(
        "float32", tirx.shift_left(tirx.Cast("int32", n) + tirx.const(127, "int32"),
                                   tirx.const(23, "int32")))
    return _horner(_E, r) * two_n


def erf_f32(x):
    """erf of a float32 PrimExpr, as vectorisable arithmetic (no libm call)."""
    t = tirx.min(tirx.abs(x), _c(_TOP))
    small = x * _horner(_P, x * x)
    big = _c(1.0) - _exp_negative(_horner(_Q, tirx.max(t, _c(_SPLIT))))
    big = tirx.Select(x < _c(0.0), -big, big)
    return tirx.Select(t < _c(_SPLIT), small, big)


def exp_nonpositive_f32(x):
    """exp of a float32 PrimExpr known to be <= 0 (or -inf, NaN), vectorisable."""
    lo = _c(-87.33)  # exp(lo) ~ 1.3e-38, still normal: 2^n fits the exponent bits
    val = _exp_negative(tirx.max(x, lo))
    val = tirx.Select(x < lo, _c(0.0), val)
    return tirx.Select(tirx.isnan(x), x, val)  # NaN in, NaN out


def _gelu(bb, call):
    x = call.args[0]
    if str(x.ty.dtype) != "float32":
        return None

    def te_gelu(a):
        return te.compute(a.shape, lambda *i: a(*i) * (
            _c(0.5) + erf_f32(a(*i) * _c(0.5 ** 0.5)) * _c(0.5)), name="T_gelu")

    return bb.call_te(te_gelu, x, primfunc_name_hint="gelu")


def _legalize_gelu(bb, call):
    out = _gelu(bb, call)
    if out is None:  # not float32: TVM's legalization
        from tvm.relax.transform.legalize_ops.nn import _nn_gelu

        return _nn_gelu(bb, call)
    return out


def _softmax(bb, call):
    x = call.args[0]
    ndim = x.ty.ndim
    if str(x.ty.dtype) != "float32" or ndim < 1 or int(call.attrs.axis) not in (-1, ndim - 1):
        return None

    def te_softmax(a):
        *rows, n = a.shape
        k = te.reduce_axis((0, n), name="k")
        mx = te.compute(rows, lambda *r: te.max(a(*r, k), axis=k), name="T_softmax_maxelem")
        e = te.compute(a.shape, lambda *i: exp_nonpositive_f32(a(*i) - mx(*i[:-1])),
                       name="T_softmax_exp")
        k2 = te.reduce_axis((0, n), name="k")
        s = te.compute(rows, lambda *r: te.sum(e(*r, k2), axis=k2), name="T_softmax_expsum")
        return te.compute(a.shape, lambda *i: e(*i) / s(*i[:-1]), name="T_softmax_norm")

    return bb.call_te(te_softmax, x, primfunc_name_hint="softmax")


def _legalize_softmax(bb, call):
    out = _softmax(bb, call)
    if out is None:  # not float32 on the last axis: TVM's legalization
        from tvm.relax.transform.legalize_ops.nn import _nn_softmax

        return _nn_softmax(bb, call)
    return out


LEGALIZE_MAP = {"relax.nn.gelu": _legalize_gelu, "relax.nn.softmax": _legalize_softmax}
"""For ``relax.transform.LegalizeOps(customize_legalize_map=...)`` (``compiler.lowering.install``
returns it)."""
