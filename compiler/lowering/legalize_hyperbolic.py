"""Sinh and Cosh written with exp, which every TVM backend can build.

TVM 0.27 legalizes ``relax.sinh`` / ``relax.cosh`` with ``topi.sinh`` / ``topi.cosh``:
the TIR intrinsics ``tirx.sinh`` / ``tirx.cosh``, which the LLVM backend has no lowering
for ("unknown intrinsic tirx.sinh" when the kernel is built).  Here, with
``a = |x|`` and ``e = exp(a / 2)`` (so that ``e * e`` overflows only where the result does):

* ``cosh(x) => (0.5 * e) * e + 0.5 / (e * e)``
* ``sinh(x) => sign(x) * ((0.5 * e) * e - 0.5 / (e * e))`` for ``|x| >= 1``; below, its
  Taylor series to ``x^21`` (``e^a - e^-a`` would cancel: sinh(1e-8) = 1e-8, not 0),
  which keeps ``-0.0``.

Large ``|x|`` overflows to ``+-inf`` as onnxruntime's does, never NaN (``inf - 0``), and
float32's sinh stays finite up to 89.4 (``exp(x)`` alone overflows past 88.7); NaN stays
NaN.  float16 is computed in float32; float32 and float64 in their own type.  Registered
on the ops (``FLegalize``) like ``legalize_nan``, so that constant folding agrees;
``compiler.lowering.install`` installs it.
"""

from __future__ import annotations

import math

from tvm import te, tirx

from .override import install_legalization

_MARK = "__onnxc_hyperbolic__"
# sinh(x) = sum x^(2k+1) / (2k+1)!, k = 0..10: below 1, the first term left out is
# x^23 / 23! < 4e-23 of the sum, under float64's rounding
_SINH_TAYLOR = tuple(1.0 / math.factorial(2 * k + 1) for k in range(11))


def _compute_dtype(dtype: str) -> str:
    return "float32" if dtype == "float16" else dtype


def _halves(x, dt):
    """(a = |x|, 0.5 * e * e, 0.5 / (e * e)) with e = exp(a / 2), in ``dt``."""
    a = tirx.abs(x)
    e = tirx.exp(a * tirx.const(0.5, dt))
    return a, (tirx.const(0.5, dt) * e) * e, tirx.const(0.5, dt) / (e * e)


def _cosh_expr(x, dt):
    _, big, small = _halves(x, dt)
    return big + small


def _sinh_expr(x, dt):
    a, big, small = _halves(x, dt)
    far = big - small
    s = x * x
    acc = tirx.const(_SINH_TAYLOR[-1], dt)
    for c in reversed(_SINH_TAYLOR[:-1]):
        acc = acc * s + tirx.const(c, dt)
    near = x * acc
    return tirx.Select(a < tirx.const(1.0, dt), near,
                       tirx.Select(x < tirx.const(0.0, dt), -far, far))


def _te(expr, name: str):
    def compute(x: te.Tensor) -> te.Tensor:
        dt = _compute_dtype(str(x.dtype))

        def body(*i):
            v = x(*i) if dt == x.dtype else x(*i).astype(dt)
            out = expr(v, dt)
            return out if dt == x.dtype else out.astype(x.dtype)

        return te.compute(x.shape, body, name=f"T_{name}")
    return compute


def _make(name: str, expr):
    compute = _te(expr, name)

    def make(default):
        def legalize(bb, call):
            if str(call.args[0].ty.dtype) not in ("float16", "float32", "float64"):
                return default(bb, call)
            return bb.call_te(compute, call.args[0], primfunc_name_hint=f"tir_{name}")
        return legalize
    return make


def _install(op_name: str, make):
    install_legalization(op_name, make, _MARK)


def install() -> None:
    """Register the exp-based legalizations of sinh and cosh (once)."""
    _install("relax.sinh", _make("sinh", _sinh_expr))
    _install("relax.cosh", _make("cosh", _cosh_expr))
