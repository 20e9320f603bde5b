"""onnxc's converters for small default-domain ops TVM 0.27 lacks or gets wrong: activations
(Celu, Elu with float16, Swish, SwiGLU), Clip, Max/Min and Hardmax (NaN as
onnxruntime), LpNormalization, CenterCropPad, ReverseSequence,
TensorScatter, Det and Col2Im.

Each follows the ONNX spec and its reference implementation (``onnx/reference/ops``) and
refuses, with an ``UnsupportedError`` naming the node, what it does not implement.  Inputs
that fix output shapes (CenterCropPad's ``shape``, Col2Im's ``image_shape``) must be
constants; a graph input there raises ``UnsupportedError``, and ``compiler.specialize``
then binds the fed value (small integer inputs) and compiles again.
"""

from __future__ import annotations

import itertools

import numpy as np
import tvm
from tvm import relax

from .common import (register, refuse, static_shape, scalar, dtype_of, constant_value,
                     constant_values, fold_result, float_only, is_float, normalize_axis, attr_text,
                     cpu_lanes, kernel_shape)
from ..registry import tvm_converter




# --------------------------------------------------------------------------- #
# Activations
# --------------------------------------------------------------------------- #


@register("Celu", since=12)
def celu(bb, inputs, attrs, ctx):
    """Celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)), in the input's type."""
    x = inputs[0]
    float_only(ctx, x)
    dtype = dtype_of(x)
    alpha = float(attrs.get("alpha", 1.0))
    if alpha == 0:
        refuse(ctx, "alpha=0")
    zero = scalar(0, dtype)
    neg = relax.op.multiply(
        scalar(alpha, dtype),
        relax.op.subtract(relax.op.exp(relax.op.divide(x, scalar(alpha, dtype))),
                          scalar(1, dtype)))
    return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(zero, neg))


@register("Elu", since=6, override=True)
def elu(bb, inputs, attrs, ctx):
    """Elu: x if x >= 0 else alpha * (exp(x) - 1), with constants of the input's type
    (TVM 0.27's converter builds float32 constants and fails on float16)."""
    x = inputs[0]
    float_only(ctx, x)
    dtype = dtype_of(x)
    alpha = float(attrs.get("alpha", 1.0))
    neg = relax.op.multiply(scalar(alpha, dtype),
                            relax.op.subtract(relax.op.exp(x), scalar(1, dtype)))
    return relax.op.where(relax.op.less(x, scalar(0, dtype)), neg, x)


@register("Selu", since=6, override=True)
def selu(bb, inputs, attrs, ctx):
    """Selu as onnxruntime computes it: gamma * x if x > 0 else gamma * (alpha * exp(x) -
    alpha), so Selu(-0.0) is +0.0 (TVM's relu sum gives -0.0)."""
    x = inputs[0]
    float_only(ctx, x)
    dtype = dtype_of(x)
    alpha = float(attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(attrs.get("gamma", 1.05070102214813232421875))
    neg = relax.op.multiply(scalar(gamma, dtype), relax.op.subtract(
        relax.op.multiply(scalar(alpha, dtype), relax.op.exp(x)), scalar(alpha, dtype)))
    return relax.op.where(relax.op.greater(x, scalar(0, dtype)),
                          relax.op.multiply(scalar(gamma, dtype), x), neg)


@register("ThresholdedRelu", since=10, override=True)
def thresholded_relu(bb, inputs, attrs, ctx):
    """ThresholdedRelu: x if x > alpha else 0 (a select: TVM's ``(x > alpha) * x`` gives
    0 * NaN = NaN and 0 * -inf = NaN where onnxruntime gives 0)."""
    x = inputs[0]
    float_only(ctx, x)
    dtype = dtype_of(x)
    alpha = float(attrs.get("alpha", 1.0))
    return relax.op.where(relax.op.greater(x, scalar(alpha, dtype)), x, scalar(0, dtype))


@register("Sign", since=9, override=True)
def sign(bb, inputs, attrs, ctx):
    """Sign; NaN stays NaN on floats, as onnxruntime (TVM's sign gives 0)."""
    x = inputs[0]
    if not is_float(dtype_of(x)):
        return relax.op.sign(x)
    return relax.op.where(relax.op.isnan(x), x, relax.op.sign(x))


def _swish(x, alpha: float):
    """x * sigmoid(alpha * x) in x's type."""
    dtype = dtype_of(x)
    scaled = x if alpha == 1.0 else relax.op.multiply(scalar(alpha, dtype), x)
    return relax.op.multiply(x, relax.op.sigmoid(scaled))


@register("Swish", since=24)
def swish(bb, inputs, attrs, ctx):
    """Swish: x * sigmoid(alpha * x)."""
    float_only(ctx, inputs[0])
    return _swish(inputs[0], float(attrs.get("alpha", 1.0)))


@register("SwiGLU", since=28)
def swiglu(bb, inputs, attrs, ctx):
    """SwiGLU: Swish_alpha(A) * B, A and B of the same shape and type (no broadcasting)."""
    a, b = inputs[0], inputs[1]
    float_only(ctx, a, "A")
    if dtype_of(a) != dtype_of(b) or static_shape(a) != static_shape(b):
        refuse(ctx, f"A {static_shape(a)} {dtype_of(a)} with B {static_shape(b)} {dtype_of(b)} (same shape "
                "and type required)")
    return relax.op.multiply(_swish(a, float(attrs.get("alpha", 1.0))), b)


# --------------------------------------------------------------------------- #
# LpNormalization
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# CenterCropPad
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# ReverseSequence
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# TensorScatter
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# Det
# --------------------------------------------------------------------------- #

_DET_MAX = 6  # Laplace expansion over column subsets: n * 2^n small products


@register("Det", since=11)
def det(bb, inputs, attrs, ctx):
    """Det of (..., n, n) matrices by Laplace expansion along rows, memoised over column
    subsets (exact arithmetic order, no pivoting); n up to 6."""
    x = inputs[0]
    float_only(ctx, x)
    dims = static_shape(x)
    if len(dims) < 2 or dims[-1] != dims[-2]:
        refuse(ctx, f"input of shape {dims} (square matrices (..., n, n) expected)")
    n = dims[-1]
    if n > _DET_MAX:
        refuse(ctx, f"matrices of size {n} (at most {_DET_MAX})")
    batch = dims[:-2]
    rank = len(dims)
    if n == 0:
        return relax.op.ones(batch, dtype_of(x))
    entry = {}
    for r in range(n):
        for c in range(n):
            e = relax.op.strided_slice(x, axes=[rank - 2, rank - 1], begin=[r, c],
                                       end=[r + 1, c + 1])
            entry[r, c] = bb.emit(relax.op.reshape(e, batch))
    # minor[cols] = det of rows n-len(cols).. over the sorted column subset cols
    minor = {(c,): entry[n - 1, c] for c in range(n)}
    for size in range(2, n + 1):
        row = n - size
        for cols in itertools.combinations(range(n), size):
            acc = None
            for k, c in enumerate(cols):
                rest = cols[:k] + cols[k + 1:]
                term = relax.op.multiply(entry[row, c], minor[rest])
                if acc is None:
                    acc = term
                elif k % 2:
                    acc = relax.op.subtract(acc, term)
                else:
                    acc = relax.op.add(acc, term)
            minor[cols] = bb.emit(acc)
    return minor[tuple(range(n))]


# --------------------------------------------------------------------------- #
# Col2Im
# --------------------------------------------------------------------------- #


@register("Clip", override=True)
def clip(bb, inputs, attrs, ctx):
    """Clip as maximum/minimum ops (TVM's converter emits opaque kernels, which the layout
    pass cannot see through: MobileNet's Relu6 then cost two layout transforms each).
    Bounds from attributes (opset < 11) or inputs (constant or not).

    onnxruntime's semantics, which the lowering of maximum/minimum (NaN-propagating,
    ``compiler/lowering/legalize_nan.py``) then gives: a NaN ``x`` stays NaN; a NaN bound
    means no bound on that side (a constant one is dropped here, a fed one becomes -+inf at
    run time); an absent float bound is the type's lowest / highest finite value (the
    spec's default, and ORT's: Clip(inf) with no max is 3.4028235e38)."""
    x = inputs[0]
    dtype = str(x.ty.dtype)
    if ctx.opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
        lo = None if lo is None else relax.const(float(lo), dtype)
        hi = None if hi is None else relax.const(float(hi), dtype)
    else:
        lo = inputs[1] if len(inputs) > 1 else None
        hi = inputs[2] if len(inputs) > 2 else None
    is_float = dtype.startswith("float") or dtype.startswith("bfloat")
    if is_float:
        lo = _clip_bound(bb, lo, dtype, -1)
        hi = _clip_bound(bb, hi, dtype, +1)
    if lo is not None:
        x = bb.normalize(relax.op.maximum(x, lo))
    if hi is not None:
        x = relax.op.minimum(x, hi)
    return x


def _clip_bound(bb, bound, dtype: str, side: int):
    """A float Clip bound as onnxruntime reads it: absent -> the finite extreme, a constant
    NaN -> None (no bound), a fed one -> where(isnan(b), -+inf, b)."""
    if bound is None:
        if dtype not in ("float16", "float32", "float64"):
            return None
        return relax.const(side * float(np.finfo(dtype).max), dtype)
    value = constant_value(bound)
    if value is not None:
        return None if np.isnan(np.asarray(value, dtype="float64")).all() else bound
    return bb.normalize(relax.op.where(relax.op.isnan(bound),
                                       relax.const(side * float("inf"), dtype), bound))


@register("Max", override=True)
def max_(bb, inputs, attrs, ctx):
    """Max as pairwise ``maximum`` ops (TVM stacks the inputs and reduces: a copy and a
    reduction kernel, and a NaN dropped or kept by its position); the lowering of
    ``maximum`` propagates NaN from either operand as onnxruntime does."""
    return _pairwise(bb, inputs, relax.op.maximum)


@register("Min", override=True)
def min_(bb, inputs, attrs, ctx):
    """Min as pairwise ``minimum`` ops (see Max)."""
    return _pairwise(bb, inputs, relax.op.minimum)


@register("MatMul", since=1, override=True)
def matmul(bb, inputs, attrs, ctx):
    """MatMul, a 1-D operand as a one-row (or one-column) matrix around a 2-D matmul, then
    squeezed, as numpy defines it: the 2-D form reaches the matmul rules (a vector times a
    [768, 3072] weight ran as a generic reduction, 2.1x onnxruntime's time).  Otherwise
    TVM's."""
    a, b = inputs[0], inputs[1]
    ra, rb = getattr(a.ty, "ndim", -1), getattr(b.ty, "ndim", -1)
    if ra >= 1 and rb >= 1 and (ra == 1 or rb == 1) and \
            constant_value(a) is None:
        a2 = bb.normalize(relax.op.expand_dims(a, [0])) if ra == 1 else a
        b2 = bb.normalize(relax.op.expand_dims(b, [1])) if rb == 1 else b
        out = bb.normalize(tvm_converter("MatMul")(bb, [a2, b2], attrs, ctx))
        rank = out.ty.ndim
        drop = ([rank - 2] if ra == 1 else []) + ([rank - 1] if rb == 1 else [])
        return relax.op.squeeze(out, drop)
    return tvm_converter("MatMul")(bb, inputs, attrs, ctx)


@register("Sum", override=True)
def sum_(bb, inputs, attrs, ctx):
    """Sum as pairwise adds in input order, as onnxruntime accumulates (TVM stacks the
    inputs and reduces over the new axis: a copy kernel and a reduction, 2.4x
    onnxruntime's time for three [1, 64, 56, 56] inputs)."""
    return _pairwise(bb, inputs, relax.op.add)


@register("Mean", override=True)
def mean_(bb, inputs, attrs, ctx):
    """Mean as pairwise adds then one division by the count (see Sum)."""
    total = _pairwise(bb, inputs, relax.op.add)
    if len(inputs) == 1:
        return total
    return relax.op.divide(total, relax.const(float(len(inputs)), dtype_of(inputs[0])))


def _pairwise(bb, inputs, op):
    out = inputs[0]
    for x in inputs[1:]:
        out = bb.normalize(op(out, x))
    return out


@register("Hardmax", override=True)
def hardmax(bb, inputs, attrs, ctx):
    """Hardmax: TVM's one-hot of argmax (the argmax legalization keeps onnxruntime's NaN
    fold), and a row whose leading element is NaN all zeros, as onnxruntime gives (its
    row maximum is NaN, which no element equals)."""
    x = inputs[0]
    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if not is_float(dtype_of(x)) or values is None:
        return tvm_converter("Hardmax")(bb, inputs, attrs, ctx)
    rank = len(values)
    axis = normalize_axis(ctx, int(attrs.get("axis", 1 if ctx.opset < 13 else -1)), rank)
    axes = list(range(axis, rank)) if ctx.opset < 13 else [axis]  # < 13: a flattened row
    n = values[axis]
    if len(axes) == 1 and isinstance(n, tvm.tirx.IntImm) and all(
            getattr(v, "value", 1) != 0 for v in values):
        # one-hot of onnxc's argmax (TVM's argmax: the fallback's one fold per row, 6.7x
        # onnxruntime's time over [256, 1000]; ours folds 16 rows as vector lanes)
        from .reduction import float_arg_index

        index = bb.normalize(float_arg_index(bb, x, axis, True, "max"))
        iota = np.arange(int(n), dtype=np.int64).reshape(
            [1] * axis + [int(n)] + [1] * (rank - axis - 1))
        out = bb.normalize(relax.op.astype(relax.op.equal(index, relax.const(iota, "int64")),
                                           dtype_of(x)))
    else:
        out = bb.normalize(tvm_converter("Hardmax")(bb, inputs, attrs, ctx))
    lead = bb.normalize(relax.op.strided_slice(x, axes, [0] * len(axes), [1] * len(axes)))
    return relax.op.where(relax.op.isnan(lead), relax.op.zeros_like(out), out)


@register("IsInf", override=True)
def is_inf(bb, inputs, attrs, ctx):
    """IsInf honouring detect_positive / detect_negative."""
    x = inputs[0]
    pos, neg = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    inf = relax.op.isinf(x)
    zero = relax.const(0, x.ty.dtype)
    if pos and neg:
        return inf
    if pos:
        return relax.op.logical_and(inf, relax.op.greater(x, zero))
    if neg:
        return relax.op.logical_and(inf, relax.op.less(x, zero))
    return relax.op.zeros_like(x, dtype="bool")


@register("BitShift", since=11, override=True)
def bit_shift(bb, inputs, attrs, ctx):
    """BitShift with ONNX's edge cases: a shift < 0 or >= the bit width gives 0 (LEFT) or
    the sign fill (RIGHT), where C (and TVM) leave it undefined."""
    x, s = inputs
    dtype = x.ty.dtype
    bits = np.dtype(str(dtype)).itemsize * 8
    direction = attrs.get("direction", b"LEFT")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    zero, limit = relax.const(0, dtype), relax.const(bits - 1, dtype)
    safe = relax.op.minimum(relax.op.maximum(s, zero), limit)
    if direction == "LEFT":
        shifted, fill = relax.op.left_shift(x, safe), relax.op.zeros_like(x)
    else:
        shifted = relax.op.right_shift(x, safe)
        signed = np.issubdtype(np.dtype(str(dtype)), np.signedinteger)
        fill = relax.op.right_shift(x, limit) if signed else relax.op.zeros_like(x)
    out_of_range = relax.op.logical_or(relax.op.greater(s, limit), relax.op.less(s, zero))
    return relax.op.where(out_of_range, fill, shifted)


@register("Mod", since=10, override=True)
def mod(bb, inputs, attrs, ctx):
    """Mod; floats with fmod=0 as numpy's ``np.mod`` (the reference) computes it from C's
    fmod: r = fmod(a, b); r += b where r is non-zero and of the other sign than b; a zero
    r takes b's sign.  TVM's ``a - floor(a / b) * b`` gives NaN for a finite ``a`` and an
    infinite ``b`` (numpy: ``mod(-3, inf) = inf``, ``mod(3, inf) = 3``).  Else TVM's."""
    a, b = inputs
    dtype = str(a.ty.dtype)
    if attrs.get("fmod", 0) or not dtype.startswith("float") or str(b.ty.dtype) != dtype:
        return tvm_converter("Mod")(bb, inputs, attrs, ctx)
    zero = relax.const(np.array(0, dtype), dtype)
    r = bb.normalize(relax.op.mod(a, b))  # C fmod for floats
    other_sign = relax.op.logical_xor(relax.op.less(b, zero), relax.op.less(r, zero))
    fix = relax.op.logical_and(relax.op.not_equal(r, zero), other_sign)
    r = bb.normalize(relax.op.where(fix, relax.op.add(r, b), r))
    neg_zero = relax.const(np.array(-0.0, dtype), dtype)
    signed_zero = relax.op.where(relax.op.less(b, zero), neg_zero, zero)
    return relax.op.where(relax.op.equal(r, zero), signed_zero, r)


@register("Pow", since=7, override=True)
def pow_(bb, inputs, attrs, ctx):
    """Pow with a base and an exponent of different types (opset 12+ allows it), or of
    integer types: the result has the base's type.  Both are widened to float64, raised,
    and cast back (truncating toward zero for an integer base), as onnxruntime computes
    integer Pow (``std::pow`` on doubles); exact while the result is below 2^53.  (TVM's
    ``power`` takes floats only: an integer Pow failed to build.)  A float base to a
    constant exponent of 2 or 3 is ``x * x`` / ``x * x * x``, as onnxruntime special-cases
    them (TVM's ``power`` is a scalar libm ``powf`` per element: Pow(x, 3) over [1, 64, 56,
    56] took 20x onnxruntime's time).  Other same float types: TVM's."""
    a, b = inputs
    at, bt = str(a.ty.dtype), str(b.ty.dtype)
    if at.startswith("float"):
        e = constant_value(b)
        # one exponent, of no more dims than the base: the result has the base's shape
        if (e is not None and e.size == 1 and e.ndim <= a.ty.ndim
                and float(e.reshape(-1)[0]) in (2.0, 3.0)):
            sq = bb.normalize(relax.op.multiply(a, a))
            return sq if float(e.reshape(-1)[0]) == 2.0 else relax.op.multiply(sq, a)
    if at == bt and at.startswith("float"):
        return tvm_converter("Pow")(bb, inputs, attrs, ctx)
    wide = "float64"
    out = relax.op.power(relax.op.astype(a, wide), relax.op.astype(b, wide))
    return relax.op.astype(bb.normalize(out), at)


@register("Equal", since=7, override=True)
def equal(bb, inputs, attrs, ctx):
    """Equal computed at import when both inputs are known.  TVM 0.27 compares a shape
    value with a constant by ``structural_equal`` of an int64 ``IntImm`` against a Python
    int, which is never equal: ``Equal(Shape-derived [1, -1, 5, 5], -1)`` gave all False, so
    the exporter's ``Where(Equal(shape, -1), 1, shape)`` kept the -1 and the following
    Expand failed ("Cannot use and / or / not operator to Expr").  It also did not
    broadcast."""
    values = constant_values(inputs)
    if values is not None:
        out = fold_result(np.equal(values[0], values[1]))
        if out is not None:
            return out
    return tvm_converter("Equal")(bb, inputs, attrs, ctx)


def _cumulative(kind: str):
    def convert(bb, inputs, attrs, ctx):
        """Cumulative sum/product along a constant axis; exclusive and reverse honoured.
        On CPU targets a scan kernel (``schedules/cpu/scan.py``); elsewhere, and for a
        constant, a TE reduction over the prefix (or suffix): out[i] = op(x[k] for k <= i)."""
        from tvm import te, tirx

        x, axis_in = inputs[0], inputs[1]
        axis = constant_value(axis_in) if axis_in is not None else None
        if axis is None:
            refuse(ctx, "a non-constant axis input")
        ndim = x.ty.ndim
        axis = int(np.asarray(axis).reshape(-1)[0])
        axis = axis + ndim if axis < 0 else axis
        if not 0 <= axis < ndim:
            refuse(ctx, f"axis {axis} for an input of rank {ndim}")
        exclusive = bool(attrs.get("exclusive", 0))
        reverse = bool(attrs.get("reverse", 0))
        dims = getattr(getattr(x.ty, "shape", None), "values", None)
        if dims is None:
            static_shape(x)  # refuses: an unknown shape
        if isinstance(dims[axis], tirx.IntImm) and int(dims[axis]) == 0:
            return x
        if cpu_lanes() is not None and constant_value(x) is None:
            # CPU targets: one pass along the axis (schedules/cpu/scan.py)
            from schedules.cpu.scan import scan_kernel

            gv = bb.add_func(scan_kernel(kind, dtype_of(x), exclusive, reverse,
                                         kernel_shape(x), axis), f"cum{kind}")
            return relax.call_tir(gv, relax.Tuple([x]), x.ty)

        def compute(t):
            # the placeholder's own extent: a symbolic one (BLOOM's position ids,
            # cumsum(attention_mask) over seq) as well as a static one
            k = te.reduce_axis((0, t.shape[axis]), name="k")
            ident = 0 if kind == "sum" else 1

            def body(*idx):
                i = idx[axis]
                if reverse:
                    cond = (k > i) if exclusive else (k >= i)
                else:
                    cond = (k < i) if exclusive else (k <= i)
                src = list(idx)
                src[axis] = k
                val = tirx.Select(cond, t[tuple(src)], tirx.const(ident, t.dtype))
                if kind == "sum":
                    return te.sum(val, axis=k)
                prod = te.comm_reducer(lambda a, b: a * b, lambda dt: tirx.const(1, dt),
                                       name="prod")
                return prod(val, axis=k)

            return te.compute(t.shape, body, name=f"cum{kind}")

        return bb.emit_te(compute, x, primfunc_name_hint=f"cum{kind}")

    return convert


register("CumSum", since=11, override=True)(_cumulative("sum"))


register("CumProd", since=26)(_cumulative("prod"))


# --------------------------------------------------------------------------- #
# Einsum
# --------------------------------------------------------------------------- #


def _einsum_terms(equation: str, ranks: list) -> tuple | None:
    """(operand labels, output labels) of an einsum equation, an ellipsis spelled out as
    upper-case labels (the same dims in every operand; None when ranks differ under it),
    the implicit output (no ``->``) as ONNX defines it: the labels used once, sorted."""
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        return None
    ell = {r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t}
    if len(ell) > 1:
        return None
    k = ell.pop() if ell else 0
    dots = "".join(chr(ord("A") + i) for i in range(k))
    terms = [t.replace("...", dots) for t in terms]
    if "->" in eq:
        out = rhs.replace("...", dots)
    else:
        counts = {c: "".join(terms).count(c) for c in "".join(terms)}
        out = dots + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in dots))
    if any(len(t) != r for t, r in zip(terms, ranks)):
        return None
    return terms, out


@register("Einsum", since=12, override=True)
def einsum(bb, inputs, attrs, ctx):
    """Two-operand float einsums as a batched matmul: each operand transposed to [batch,
    kept, contracted] (the constant one to the right, [batch, contracted, kept]) and
    reshaped to 3-D (2-D without batch labels), one ``matmul``, the result reshaped and
    transposed to the output's labels; labels in one operand only and not in the output
    summed first.  The matmul rules then take it (XLNet's ``ibnd,hnd->ibh`` projection
    against a constant [768, 12, 64] ran under dlight's reduction rule at 42x onnxruntime's
    time).  Other einsums (one or three operands, repeated labels in an operand,
    broadcast dims, integers) keep TVM's converter."""
    from tvm.ir.expr import GenericConst

    fallback = lambda: tvm_converter("Einsum")(bb, inputs, attrs, ctx)  # noqa: E731
    if (len(inputs) != 2 or any(x is None for x in inputs)
            or not all(is_float(dtype_of(x)) for x in inputs)
            or dtype_of(inputs[0]) != dtype_of(inputs[1])):
        return fallback()
    try:
        shapes = [static_shape(x) for x in inputs]
    except Exception:  # noqa: BLE001 - symbolic: TVM's
        return fallback()
    eq = attr_text(attrs.get("equation"), "")
    parsed = _einsum_terms(eq, [len(s) for s in shapes])
    if parsed is None:
        return fallback()
    (la, lb), lo = parsed
    size = {}
    for t, s in zip((la, lb), shapes):
        if len(set(t)) != len(t):
            return fallback()  # a diagonal
        for c, d in zip(t, s):
            if size.setdefault(c, d) != d:
                return fallback()  # broadcast over a label
    if len(set(lo)) != len(lo) or any(c not in size for c in lo):
        return fallback()
    a, b = inputs
    if isinstance(a, GenericConst) and not isinstance(b, GenericConst):
        a, b, la, lb = b, a, lb, la  # the constant operand on the right (packed weights)

    def summed(x, labels, other):  # labels of one operand only, not in the output
        gone = [i for i, c in enumerate(labels) if c not in other and c not in lo]
        if gone:
            x = relax.op.sum(x, axis=gone)
            labels = "".join(c for i, c in enumerate(labels) if i not in gone)
        return x, labels

    a, la = summed(a, la, lb)
    b, lb = summed(b, lb, la)
    batch = [c for c in lo if c in la and c in lb]
    contract = [c for c in la if c in lb and c not in lo]
    kept_a = [c for c in la if c not in lb]
    kept_b = [c for c in lb if c not in la]
    prod = lambda labels: int(np.prod([size[c] for c in labels], dtype=np.int64))  # noqa: E731
    lead = [prod(batch)] if batch else []

    def arranged(x, labels, order, shape):
        perm = [labels.index(c) for c in order]
        if perm != list(range(len(labels))):
            x = relax.op.permute_dims(x, perm)
        return relax.op.reshape(x, lead + shape)

    a2 = arranged(a, la, batch + kept_a + contract, [prod(kept_a), prod(contract)])
    b2 = arranged(b, lb, batch + contract + kept_b, [prod(contract), prod(kept_b)])
    y = relax.op.matmul(a2, b2)
    got = batch + kept_a + kept_b
    y = relax.op.reshape(y, [size[c] for c in got])
    perm = [got.index(c) for c in lo]
    return relax.op.permute_dims(y, perm) if perm != list(range(len(lo))) else y
