"""Relu, PRelu, clip, tanh, atanh and float maximum/minimum with onnxruntime's NaN semantics.

TVM 0.27 lowers ``relax.nn.relu`` to ``max(x, 0)``, ``relax.clip`` to
``max(min(x, hi), lo)`` and ``relax.maximum`` / ``relax.minimum`` to TIR ``Max`` / ``Min``,
which LLVM emits as ``a > b ? a : b``: a NaN is dropped or kept depending on the operand
it sits in (``relu(NaN) = 0``, ``clip(NaN, 0, 6) = 0``, ``Max(1, NaN) = NaN`` but
``Max(NaN, 1) = 1``).  onnxruntime 1.32 (measured, ``tests/compiler/lowering/
test_nan_semantics.py``) keeps NaN in all of them:

* ``relu(x) => x < 0 ? 0 : x``                 (NaN -> NaN, -0.0 -> -0.0)
* ``prelu(x, s) => x < 0 ? x * s : x``          (+-0.0 kept; TVM's ``x > 0 ? x : x * s``
  turns 0.0 times a negative slope into -0.0)
* ``clip(x, lo, hi) => x < lo ? lo : (hi < x ? hi : x)``   (NaN -> NaN)
* ``maximum(a, b) => (a < b or isnan(b)) ? b : a``  (NaN in either operand -> NaN)
* ``minimum(a, b) => (b < a or isnan(b)) ? b : a``

* ``tanh(x), atanh(x) => x == 0 ? x : f(x)``  (-0.0 -> -0.0; TVM's tanh and
  ``atanh = log((1 + x) / (1 - x)) / 2`` give +0.0)

``maximum(x, lo)`` is also ORT's ``Clip`` lower side exactly, zero signs included (our
Clip converter emits maximum/minimum so the layout pass sees through it; it removes NaN
*bounds* itself, which ORT treats as "no bound").  Each is one select per element, no libm
call: it vectorises.  Integer dtypes keep TVM's legalization.  Registered on the ops
(``FLegalize``) like ``legalize_reductions``, so constant folding agrees;
``compiler.lowering.install`` installs it.
"""

from __future__ import annotations

from tvm import te, tirx, topi
from tvm.relax.transform.legalize_ops.common import (_is_relax_expr,
                                                      _try_convert_to_scalar_const)

from .override import install_legalization

_MARK = "__onnxc_nan_semantics__"


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def bind_once(x: te.Tensor, i, body):
    """``body(v)`` with ``v = x(*i)`` bound once by a TIR Let: the producer a fused kernel
    inlines into ``x`` (a conv's accumulator, DenseNet's 30-input concat select chain) is
    then copied once, not into every use (relu's Select used it twice, clip's three
    times: twice or three times the code to lower and compile, and to run unless LLVM
    finds the copies equal)."""
    v = tirx.Var("v", x.dtype)
    return tirx.Let(v, x(*i), body(v))


def _relu(x: te.Tensor) -> te.Tensor:
    zero = tirx.const(0, x.dtype)
    return te.compute(x.shape,
                      lambda *i: bind_once(x, i, lambda v: tirx.Select(v < zero, zero, v)),
                      name="relu", tag="elemwise")


def _prelu(x: te.Tensor, slope: te.Tensor, axis: int) -> te.Tensor:
    zero = tirx.const(0, x.dtype)
    per_channel = not (isinstance(slope.shape[0], tirx.IntImm) and int(slope.shape[0]) == 1)

    def body(*i):
        s = slope[i[axis]] if per_channel else slope[0]
        return bind_once(x, i, lambda v: tirx.Select(v < zero, v * s, v))

    return te.compute(x.shape, body, name="prelu", tag="elemwise")


def _clip(x: te.Tensor, lo, hi) -> te.Tensor:
    lo, hi = tirx.Cast(x.dtype, lo), tirx.Cast(x.dtype, hi)

    def body(*i):
        return bind_once(x, i, lambda v: tirx.Select(v < lo, lo, tirx.Select(hi < v, hi, v)))

    return te.compute(x.shape, body, name="clip", tag="elemwise")


def _signed_zero(f):
    """``x == 0 ? x : f(x)`` around TVM's compute ``f`` of an odd function."""
    def compute(x: te.Tensor) -> te.Tensor:
        y = f(x)
        zero = tirx.const(0, x.dtype)
        return te.compute(x.shape, lambda *i: tirx.Select(x(*i) == zero, x(*i), y(*i)),
                          name=f"{y.op.name}_signed_zero", tag="elemwise")
    return compute


def _broadcast_shape(sa, sb):
    out = []
    for k in range(max(len(sa), len(sb))):
        da = sa[len(sa) - 1 - k] if k < len(sa) else 1
        db = sb[len(sb) - 1 - k] if k < len(sb) else 1
        if isinstance(da, (int, tirx.IntImm)) and int(da) == 1:
            out.append(db)
        else:
            out.append(da)
    return out[::-1]


def _operand(t, out_shape):
    """``idx -> value`` reading ``t`` (a tensor broadcast numpy-style, or a scalar)."""
    if not isinstance(t, te.Tensor):
        return lambda idx: t
    shape, off = t.shape, len(out_shape) - len(t.shape)

    def one(d):
        return isinstance(d, (int, tirx.IntImm)) and int(d) == 1

    def read(idx):
        # a unit dim of the output too is read at its index, not at 0: ``x[0, c, ..]`` for a
        # [1, C, ..] operand would make the kernel broadcast / injective rather than
        # elementwise, and FuseOps would not fuse it into a conv's epilogue (the
        # requantisation's saturation after an int8 conv)
        sub = [0 if one(d) and not one(out_shape[off + j]) else idx[off + j]
               for j, d in enumerate(shape)]
        return t(*sub)

    return read


def _nan_binary(kind: str):
    def compute(a, b):
        tensors = [t for t in (a, b) if isinstance(t, te.Tensor)]
        dtype = tensors[0].dtype
        a = a if isinstance(a, te.Tensor) else tirx.const(a, dtype) \
            if isinstance(a, (int, float)) else tirx.Cast(dtype, a)
        b = b if isinstance(b, te.Tensor) else tirx.const(b, dtype) \
            if isinstance(b, (int, float)) else tirx.Cast(dtype, b)
        shape = (_broadcast_shape(a.shape, b.shape) if isinstance(a, te.Tensor)
                 and isinstance(b, te.Tensor) else tensors[0].shape)
        ra, rb = _operand(a, shape), _operand(b, shape)

        def body(*idx):
            va, vb = ra(idx), rb(idx)
            better = (va < vb) if kind == "maximum" else (vb < va)
            # isnan, not vb != vb (TVM's simplifier folds that to false); one select with
            # ``or`` vectorises (AVX2: vcmpunordps, vcmpltps, vblendvps), nested selects
            # came out scalar
            return tirx.Select(tirx.Or(better, tirx.isnan(vb)), vb, va)

        return te.compute(shape, body, name=kind, tag="broadcast")

    return compute


def _install(op_name: str, make):
    install_legalization(op_name, make, _MARK)


def _relu_legalize(default):
    def legalize(bb, call):
        if not _is_float(str(call.args[0].ty.dtype)):
            return default(bb, call)
        return bb.call_te(_relu, call.args[0], primfunc_name_hint="relu")
    return legalize


def _prelu_legalize(default):
    def legalize(bb, call):
        if not _is_float(str(call.args[0].ty.dtype)):
            return default(bb, call)
        axis = int(call.attrs.axis)
        axis = axis + len(call.args[0].ty.shape) if axis < 0 else axis
        return bb.call_te(_prelu, call.args[0], call.args[1], axis, primfunc_name_hint="prelu")
    return legalize


def _odd_legalize(name: str, f):
    compute = _signed_zero(f)

    def make(default):
        def legalize(bb, call):
            if not _is_float(str(call.args[0].ty.dtype)):
                return default(bb, call)
            return bb.call_te(compute, call.args[0], primfunc_name_hint=name)
        return legalize

    return make


def _tanh_f32(x: te.Tensor) -> te.Tensor:
    """float32 tanh as vectorisable arithmetic (passes/math_f32.tanh_f32: keeps NaN and
    -0.0); TVM's is one scalar ``tanhf`` per vector lane."""
    from passes.math_f32 import tanh_f32

    return te.compute(x.shape, lambda *i: bind_once(x, i, tanh_f32), name="tanh", tag="elemwise")


def _tanh_legalize(default):
    odd = _odd_legalize("tir_tanh", topi.tanh)(default)

    def legalize(bb, call):
        if str(call.args[0].ty.dtype) != "float32":
            return odd(bb, call)
        return bb.call_te(_tanh_f32, call.args[0], primfunc_name_hint="tir_tanh")
    return legalize


def _clip_legalize(default):
    def legalize(bb, call):
        if not _is_float(str(call.args[0].ty.dtype)):
            return default(bb, call)
        return bb.call_te(_clip, call.args[0], call.args[1], call.args[2],
                          primfunc_name_hint="tir_clip")
    return legalize


def _binary_legalize(kind: str):
    compute = _nan_binary(kind)

    def make(default):
        def legalize(bb, call):
            if not _is_float(str(call.ty.dtype)):
                return default(bb, call)
            # scalar constants become immediates, as TVM's binary legalization does
            a, b = call.args[0], _try_convert_to_scalar_const(call.args[1])
            if _is_relax_expr(b):
                a = _try_convert_to_scalar_const(a)
            return bb.call_te(compute, a, b, primfunc_name_hint=kind)
        return legalize

    return make


def install() -> None:
    """Register the NaN / signed-zero keeping legalizations of relu, prelu, tanh, atanh,
    clip, maximum and minimum (once)."""
    _install("relax.nn.relu", _relu_legalize)
    _install("relax.nn.prelu", _prelu_legalize)
    _install("relax.tanh", _tanh_legalize)
    _install("relax.atanh", _odd_legalize("tir_atanh", topi.atanh))
    _install("relax.clip", _clip_legalize)
    _install("relax.maximum", _binary_legalize("maximum"))
    _install("relax.minimum", _binary_legalize("minimum"))
