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
exp only ever sees ``x - max(x) <= 0``: the same exp, subnormal results down to
``exp(-103.97)`` (``2^n`` applied in two normal halves), ``-inf`` and anything below giving
0, NaN staying NaN.  The primitives live in ``passes/math_f32.py`` (the stable sigmoid
pass uses the exp too).  Measured against float64 on
[-12, 12]: erf within 1.2e-7, GELU within 5e-7 (as the float32 rounding of libm's),
exp within 2 ulp (tests/compiler/test_legalize_vector_math.py); coefficients fitted by
least squares in float64.  Targeted: only GELU and last-axis softmax use them
(``LEGALIZE_MAP``, applied by the lowering in compiler/pipeline.py); a bare ONNX ``Erf``
or ``Exp`` keeps libm, other dtypes keep TVM's legalization.
"""

from __future__ import annotations

from tvm import te, tirx

from passes.math_f32 import const, erf_f32, exp_nonpositive_f32  # noqa: F401 (tests import them here)


def _gelu(bb, call):
    x = call.args[0]
    if str(x.ty.dtype) != "float32":
        return None

    def te_gelu(a):
        def gelu(*i):
            # x bound once (a Let): erf_f32 reads its argument several times, and a producer
            # inlined into each read (a matmul's accumulator + bias) multiplies the work
            v = tirx.Var("v", "float32")
            return tirx.Let(v, a(*i), v * (const(0.5) + erf_f32(v * const(0.5 ** 0.5))
                                           * const(0.5)))

        return te.compute(a.shape, gelu, name="T_gelu")

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
        # times the reciprocal (as onnxruntime): one division per row, hoisted out of the
        # row's loop, instead of one per element (vdivps: a quarter of vmulps' throughput)
        one = tirx.const(1.0, "float32")
        return te.compute(a.shape, lambda *i: e(*i) * (one / s(*i[:-1])),
                          name="T_softmax_norm")

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
