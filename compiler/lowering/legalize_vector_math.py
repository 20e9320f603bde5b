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
  ``r in [-ln2/2, ln2/2]``, a degree-6 polynomial and ``2^(n+24)`` built in the exponent bits
  times ``2^-24``;
  beyond 3.92, ``1 - erfc`` rounds to 1.0f anyway.

Both branches are computed and one selected, so the loop body has no branch.  Softmax's
exp only ever sees ``x - max(x) <= 0``, and softmax flushes to 0 every exp whose normalised
result would be subnormal (a microcode assist per vector on Intel): below that cut it is 0,
above it ``exp_normal_f32`` (the same range reduction and polynomial, ``2^n`` built
directly: every result is normal, so neither ``exp_nonpositive_f32``'s ``2^(n+24) * 2^-24``
scaling nor its -103.98 clamp; two vector ops fewer, the [8, 150, 1500] softmax 0.94x and
[8, 1500, 1500] 0.97x paired, emeraldrapids; NaN stays NaN).  ``exp_nonpositive_f32``
(subnormal results down to ``exp(-103.97)``; ``-inf`` and anything below giving 0) serves
the stable sigmoid.  The primitives live in ``passes/math_f32.py``.
Measured against float64 on [-12, 12]: erf within 1.2e-7, GELU within 5e-7 (as the float32 rounding of libm's),
exp within 2 ulp (tests/compiler/test_legalize_vector_math.py); coefficients fitted by
least squares in float64.  GELU, last-axis softmax and, since a bare float32 ``Exp`` ran 8.5x and ``Erf`` 27x
onnxruntime's time on libm (8 x 1500 x 1472, znver5, one thread), bare ``Exp`` (the
full-range ``exp_f32``: 0 below -103.98, inf above 88.72) and ``Erf`` use them
(``LEGALIZE_MAP``, applied by the lowering in compiler/pipeline.py); other dtypes keep
TVM's legalization.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import te, tirx

# (tests import the exp / erf / tanh builders from here)
from passes.math_f32 import (atan_f32, const, erf_f32, exp_f32, exp_nonpositive_f32,  # noqa: F401
                             exp_normal_f32, log_f32, tanh_f32)

from .legalize_nan import bind_once


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


def _legalize_gelu_tanh(bb, call):
    """gelu_tanh (GPT-2's ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``) with the
    vectorisable tanh: TVM's is a scalar ``tanhf`` per lane (GPT-2's 128 x 3072 GELU kernel
    took 3.9 ms, a tenth of the model)."""
    x = call.args[0]
    if str(x.ty.dtype) != "float32":
        from tvm.relax.transform.legalize_ops.nn import _nn_gelu_tanh

        return _nn_gelu_tanh(bb, call)

    def te_gelu_tanh(a):
        def body(*i):
            v, t = tirx.Var("v", "float32"), tirx.Var("t", "float32")
            inner = const(0.7978845608028654) * (v + const(0.044715) * v * v * v)
            return tirx.Let(v, a(*i), tirx.Let(t, inner, const(0.5) * v * (
                const(1.0) + tanh_f32(t))))

        return te.compute(a.shape, body, name="T_gelu_tanh")

    return bb.call_te(te_gelu_tanh, x, primfunc_name_hint="gelu_tanh")


ROW_CHUNK = 16
# a symbolic row's vector part: a multiple of two vectors of every CPU's fp32 lanes, so the
# row rule keeps two vector accumulators (AVX-512: 2 x 16); its tail is under 32 elements
SYMBOLIC_CHUNK = 32
"""Rows are reduced over a multiple of this many elements, then over the rest: a multiple
of every CPU's fp32 vector (4 / 8 / 16 lanes), so cpu.row_reduction can keep vector
partial sums over the first part of a row of any length (197 tokens, Whisper's 1500)."""


def _row_reduce(reducer, combine, a, rows, n, name):
    """``reducer`` over the last axis of ``a``: for a constant row whose length is not a
    multiple of ``ROW_CHUNK``, over ``[0, n - n % ROW_CHUNK)`` (``name``) and over the
    ``n % ROW_CHUNK`` remaining elements (``name_tail``), the two joined per row by
    ``combine`` (``name_row``): the first part splits into whole vectors, the tail is a short
    scalar loop.  A symbolic row (softmax over ``seq``, an InstanceNorm over a dynamic
    length) the same way over ``[0, n - n % SYMBOLIC_CHUNK)`` and its tail: the
    row rule splits the first part into vectors without a guard (its length is a provable
    multiple).  (TE drops a reduction's ``init=``, so the tail cannot start from the
    head.)"""
    if isinstance(n, tirx.IntImm):
        tail = int(n) % ROW_CHUNK
        main = int(n) - tail if tail and int(n) > ROW_CHUNK else n  # short: one reduction
    else:  # (n - n % c, not n // c * c: TVM's region checks cannot bound the latter by n
        # when n is a product like h * w * 10, and rfactor then refuses the row)
        tail = tirx.floormod(n, SYMBOLIC_CHUNK)
        main = n - tail
    k = te.reduce_axis((0, main), name="k")
    head = te.compute(rows, lambda *r: reducer(a(*r, k), axis=k), name=name)
    if main is n:
        return head
    j = te.reduce_axis((0, tail), name="j")
    rest = te.compute(rows, lambda *r: reducer(a(*r, j + main), axis=j), name=name + "_tail")
    return te.compute(rows, lambda *r: combine(head(*r), rest(*r)), name=name + "_row")


def _softmax(bb, call):
    x = call.args[0]
    ndim = x.ty.ndim
    if str(x.ty.dtype) != "float32" or ndim < 1 or int(call.attrs.axis) not in (-1, ndim - 1):
        return None

    def te_softmax(a):
        *rows, n = a.shape
        mx = _row_reduce(te.max, tirx.max, a, rows, n, "T_softmax_maxelem")
        # exps whose normalised result would be subnormal are 0 (below FLT_MIN x n: the
        # row's sum is at most n), and the exp never sees them: a subnormal result costs
        # Intel CPUs a microcode assist per vector (logits of std 30: 187 ms against 23
        # at std 1 over [8, 1500, 1500], onnxruntime as slow; emeraldrapids)
        rows_max = int(n) if isinstance(n, tirx.IntImm) else 1 << 24
        cut = const(math.log(np.finfo(np.float32).tiny) + math.log(max(rows_max, 1)))

        def exp_row(*i):
            # x - max written out at each use, not bound by a Let (bind_once's way): bound,
            # the [8, 1500, 1500] softmax at logit std 30 took 89 ms, not 20 (emeraldrapids)
            d = a(*i) - mx(*i[:-1])
            # above the cut every exp is normal: exp_normal_f32 (no subnormal scaling)
            return tirx.Select(d < cut, const(0.0),
                               exp_normal_f32(tirx.Select(d < cut, cut, d)))

        # a symbolic row: each exp computed where read, in the sum and again in the
        # normalisation (vector code twice beats a stored row: computed at the row, its
        # bounds are the union of the split sum's reads, which TVM cannot simplify
        # without knowing seq >= 0, and the row loop came out guarded and scalar)
        e = te.compute(a.shape, exp_row, name="T_softmax_exp") \
            if isinstance(n, tirx.IntImm) else exp_row
        s = _row_reduce(te.sum, lambda u, v: u + v, e, rows, n, "T_softmax_expsum")
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


def _legalize_layer_norm(bb, call):
    """Layer norm over the last axis of a float32 row whose length is no multiple of
    ``ROW_CHUNK`` (wav2vec2's InstanceNorm over 3199 frames, fused to a layer norm), or is
    symbolic (an InstanceNorm / GroupNorm over a dynamic length or image: 3.5x
    onnxruntime's time on a [1, 32, h * w * 10] GroupNorm): two passes over the row
    shifted by its first element, each sum over whole chunks then the tail
    (``_row_reduce``), so the row rule vectorises both; TOPI's sums over such a row stayed
    a scalar chain of dependent adds (3.7x onnxruntime's time).  Without ``scale`` /
    ``center`` (fuse_layer_norm's ones and zeros over a symbolic axis) gamma / beta are
    not read.  Other layer norms keep TVM's legalization."""
    from tvm.relax.transform.legalize_ops.nn import _nn_layer_norm

    x = call.args[0]
    axes = [int(a) % x.ty.ndim for a in call.attrs.axes] if x.ty.ndim else []
    n = x.ty.shape[-1] if x.ty.ndim else None
    static = isinstance(n, tirx.IntImm)
    if (str(x.ty.dtype) != "float32" or axes != [x.ty.ndim - 1] or n is None
            or (static and (int(n) % ROW_CHUNK == 0 or int(n) <= ROW_CHUNK))):
        return _nn_layer_norm(bb, call)
    eps = float(call.attrs.epsilon)
    scale, center = bool(call.attrs.scale), bool(call.attrs.center)

    def te_layer_norm(a, *affine):
        *rows, n = a.shape
        # shifted by the row's first element: x - x0 is of the order of the spread, so
        # its sum, the mean of it and d = (x - x0) - that mean keep the bits a mean of
        # |mean| >> std loses (float32 sums of x itself: 3x onnxruntime's error against
        # float64 at mean 100, std 1; shifted: below it)
        fn = tirx.const(int(n), "float32") if isinstance(n, tirx.IntImm) \
            else tirx.Cast("float32", n)
        add = lambda u, v: u + v  # noqa: E731
        shifted = te.compute(a.shape, lambda *i: a(*i) - a(*i[:-1], 0),
                             name="T_layer_norm_shifted")
        s = _row_reduce(te.sum, add, shifted, rows, n, "T_layer_norm_sum")
        d = te.compute(a.shape, lambda *i: shifted(*i) - s(*i[:-1]) / fn,
                       name="T_layer_norm_diff")
        sq = te.compute(a.shape, lambda *i: d(*i) * d(*i), name="T_layer_norm_sq")
        v = _row_reduce(te.sum, add, sq, rows, n, "T_layer_norm_var")
        one = tirx.const(1.0, "float32")

        def norm(*i):
            y = d(*i) * (one / tirx.sqrt(v(*i[:-1]) / fn + tirx.const(eps, "float32")))
            y = y * affine[0](i[-1]) if scale else y
            return y + affine[-1](i[-1]) if center else y
        return te.compute(a.shape, norm, name="T_layer_norm")

    # only the operands read: the ones / zeros kernels of an unscaled one are then dead
    affine = [call.args[1]] * scale + [call.args[2]] * center
    return bb.call_te(te_layer_norm, x, *affine,
                      primfunc_name_hint="layer_norm")


def _elementwise(name, fn):
    """``relax.{name}`` on float32 as ``fn`` (vectorisable arithmetic, the argument bound
    once); other dtypes keep the op's registered legalization."""
    def legalize(bb, call):
        x = call.args[0]
        if str(x.ty.dtype) != "float32":
            return tvm.ir.Op.get(f"relax.{name}").get_attr("FLegalize")(bb, call)

        return bb.call_te(lambda a: te.compute(a.shape, lambda *i: bind_once(a, i, fn),
                                               name=f"T_{name}"),
                          x, primfunc_name_hint=name)
    return legalize


LEGALIZE_MAP = {"relax.nn.gelu": _legalize_gelu, "relax.nn.gelu_tanh": _legalize_gelu_tanh,
                "relax.nn.softmax": _legalize_softmax,
                "relax.nn.layer_norm": _legalize_layer_norm,
                "relax.exp": _elementwise("exp", exp_f32),
                "relax.erf": _elementwise("erf", erf_f32),
                "relax.log": _elementwise("log", log_f32),
                "relax.atan": _elementwise("atan", atan_f32)}
"""For ``relax.transform.LegalizeOps(customize_legalize_map=...)`` (``compiler.lowering.install``
returns it)."""
