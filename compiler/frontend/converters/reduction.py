"""Reductions with ONNX's identity on empty inputs: ReduceSum of nothing is 0, ReduceMax
of nothing is -inf (TVM's converters fail on zero-size axes).  Float max/min with a
+-inf identity is the legalization ``compiler/lowering/legalize_reductions.py``.
ArgMax / ArgMin on floats: onnxruntime's NaN fold, ``select_last_index`` included, as one
TE reduction (TVM's converter flips the axis for ``select_last_index``, which would move
the leading element the NaN rule looks at).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .common import (register, tensor_const, constant_value, dtype_of, is_float,
                     normalize_axis, cpu_lanes, kernel_shape)
from ...lowering.legalize_reductions import (ARG_SPLIT_MIN, arg_compute, arg_merge_compute,
                                             arg_partial_compute)
from ...errors import UnsupportedError
from ..registry import tvm_converter


def _empty_identity(op: str, dtype: np.dtype):
    kind = "bool" if dtype == np.bool_ else "int" if np.issubdtype(dtype, np.integer) else "float"
    if op in ("ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare"):
        return 0
    if op == "ReduceProd":
        return 1
    if op == "ReduceMax":
        return {"bool": False, "int": np.iinfo(dtype).min if kind == "int" else 0,
                "float": -np.inf}[kind]
    if op == "ReduceMin":
        return {"bool": True, "int": np.iinfo(dtype).max if kind == "int" else 0,
                "float": np.inf}[kind]
    if kind != "float":
        return None  # log / mean of no integers: no value in the type
    return np.nan if op == "ReduceMean" else -np.inf  # mean of nothing; log(0)


def _reduce_axes(inputs, attrs, ctx, ndim):
    """The reduced axes (a sorted list; [] means none, the noop), as the reference reads
    them: the attribute (older opsets) or the constant second input; none given reduces all
    unless noop_with_empty_axes."""
    axes = attrs.get("axes")
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        axes = constant_value(inputs[1])
        if axes is None:
            raise UnsupportedError(f"node {ctx.node.name!r} ({ctx.node.op_type}): axes must "
                                   "be a constant (an initializer) for onnxc")
    axes = [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    if not axes:
        return [] if attrs.get("noop_with_empty_axes", 0) else list(range(ndim))
    return sorted({a + ndim if a < 0 else a for a in axes})


# What a reduction over no axes (noop_with_empty_axes=1, axes empty or omitted) leaves of
# the composite ops: ONNX defines them as functions (ReduceSumSquare = ReduceSum(Mul(x, x)),
# ReduceL1 = ReduceSum(Abs(x)), ...) whose inner ReduceSum is the noop, so the elementwise
# part still applies, as onnxruntime and onnx.reference compute it.  TVM's converters
# return x.  ReduceLogSumExp of nothing is log(exp(x)) = x, which TVM's identity gives.
_NOOP_ELEMENTWISE = {
    "ReduceSumSquare": lambda x: relax.op.multiply(x, x),
    "ReduceL1": relax.op.abs,
    "ReduceL2": lambda x: relax.op.sqrt(relax.op.multiply(x, x)),
    "ReduceLogSum": relax.op.log,
}


def _reduces_nothing(inputs, attrs) -> bool:
    """noop_with_empty_axes=1 with no axes: none given, or a constant empty list."""
    if not attrs.get("noop_with_empty_axes", 0) or attrs.get("axes") is not None:
        return False
    if len(inputs) < 2 or inputs[1] is None:
        return True
    axes = constant_value(inputs[1])
    return axes is not None and np.asarray(axes).size == 0


def _reduce_with_identity(op):
    @register(op, override=True)
    def convert(bb, inputs, attrs, ctx):
        x = inputs[0]
        dtype = str(x.ty.dtype)
        shape = getattr(x.ty, "shape", None)
        values = getattr(shape, "values", None) or []
        if any(getattr(v, "value", 1) == 0 for v in values):
            dims = [int(v) for v in values]
            axes = _reduce_axes(inputs, attrs, ctx, len(dims))
            if not axes:
                return x  # noop_with_empty_axes (of an empty tensor: nothing to compute)
            keep = bool(attrs.get("keepdims", 1))
            out = [1 if i in axes else d for i, d in enumerate(dims) if keep or i not in axes]
            ident = _empty_identity(op, np.dtype(dtype))
            if ident is None:
                raise UnsupportedError(f"node {ctx.node.name!r} ({op}): reducing an empty "
                                       f"{dtype} tensor (shape {dims}) has no value")
            return tensor_const(np.full(out, ident, dtype=dtype))
        if op in _NOOP_ELEMENTWISE and _reduces_nothing(inputs, attrs):
            if op == "ReduceL2" and not is_float(dtype):
                return relax.op.abs(x)  # sqrt(x * x) of integers, without the float trip
            return _NOOP_ELEMENTWISE[op](x)
        if dtype == "bool" and op in ("ReduceMax", "ReduceMin"):
            # any / all: TVM has no min/max value for bool; uint8 0/1 reduces the same
            as_u8 = bb.normalize(relax.op.astype(x, "uint8"))
            out = tvm_converter(op)(bb, [as_u8] + list(inputs[1:]), attrs, ctx)
            return relax.op.astype(bb.normalize(out), "bool")
        return tvm_converter(op)(bb, inputs, attrs, ctx)

    convert.__doc__ = (f"{op} (TVM's); over an empty input the constant ONNX's reference "
                       "gives (TVM returns the wrong identity)"
                       + ("; with noop_with_empty_axes and no axes, the elementwise part of "
                          "ONNX's function body (TVM returns x)" if op in _NOOP_ELEMENTWISE
                          else "")
                       + ("; bool inputs as uint8" if op in ("ReduceMax", "ReduceMin") else ""))
    return convert


for _op in ("ReduceMin", "ReduceMax", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1",
            "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"):
    _reduce_with_identity(_op)


def _static(dim) -> int:
    """A dim's static extent, -1 when symbolic."""
    return int(dim.value) if hasattr(dim, "value") else -1


def float_arg_index(bb, x, axis: int, keepdims: bool, kind: str, last: bool = False):
    """The int64 arg``kind`` ("max" / "min") of a float ``x`` (known rank, no empty dim)
    over ``axis`` with onnxruntime's fold: short last-axis rows on CPUs folded 16 rows at
    a time (``schedules/cpu/arg_rows.py``), a long last axis in lanes then merged, other
    axes one fold per output (``cpu.arg_reduction`` tiles them).  Off CPU targets, two
    plain reductions (``_arg_by_two_reductions``)."""
    values = x.ty.shape.values
    name = f"arg{kind}"
    if cpu_lanes() is None and constant_value(x) is None:
        return _arg_by_two_reductions(bb, x, axis, keepdims, kind, last)
    if axis == len(values) - 1 and 0 < _static(values[-1]) < ARG_SPLIT_MIN and \
            cpu_lanes() is not None and constant_value(x) is None:
        from schedules.cpu.arg_rows import arg_rows_kernel

        func = arg_rows_kernel(kind, last, dtype_of(x), kernel_shape(x), keepdims)
        out = list(values[:-1]) + ([1] if keepdims else [])
        return relax.call_tir(bb.add_func(func, name), relax.Tuple([x]),
                              relax.TensorType(out, "int64"))
    if axis == len(values) - 1 and _static(values[-1]) >= ARG_SPLIT_MIN:
        # a long row (a vocabulary): lanes of independent folds, then one merge
        parts = bb.emit_te(arg_partial_compute, x, kind, last,
                           primfunc_name_hint=f"{name}_lanes")
        return bb.emit_te(arg_merge_compute, bb.normalize(relax.TupleGetItem(parts, 0)),
                          bb.normalize(relax.TupleGetItem(parts, 1)), keepdims, kind,
                          last, primfunc_name_hint=name)
    return bb.emit_te(arg_compute, x, axis, keepdims, kind, last, primfunc_name_hint=name)


def _arg_by_two_reductions(bb, x, axis: int, keepdims: bool, kind: str, last: bool):
    """onnxruntime's fold as two single-output reductions, for GPU targets: the fold's
    value ``m = max(x)`` (``relax.max``: a leading NaN wins, later NaN skipped,
    ``legalize_reductions``), then the first (``last``: the last) index holding ``m``, or 0
    when ``m`` is NaN (the leading element).  The one-fold kernel's tuple reduction kept
    its value half in a global buffer, which a CUDA build refuses ("Cannot allocate global
    memory")."""
    op = relax.op
    n = int(x.ty.shape.values[axis])
    extreme = bb.normalize((op.max if kind == "max" else op.min)(x, axis=[axis], keepdims=True))
    shape = [1] * len(x.ty.shape.values)
    shape[axis] = n
    iota = relax.const(np.arange(n, dtype=np.int64).reshape(shape), "int64")
    hit = bb.normalize(op.equal(x, extreme))
    if last:
        index = op.max(op.where(hit, iota, relax.const(-1, "int64")), axis=[axis],
                       keepdims=keepdims)
    else:
        index = op.min(op.where(hit, iota, relax.const(n, "int64")), axis=[axis],
                       keepdims=keepdims)
    index = bb.normalize(index)
    lead_nan = bb.normalize(op.isnan(extreme if keepdims else op.squeeze(extreme, [axis])))
    return op.where(lead_nan, relax.const(0, "int64"), index)


def _arg_extreme(op: str, kind: str):
    @register(op, override=True)
    def convert(bb, inputs, attrs, ctx):
        x = inputs[0]
        values = getattr(getattr(x.ty, "shape", None), "values", None)
        if not is_float(dtype_of(x)) or values is None:
            return tvm_converter(op)(bb, inputs, attrs, ctx)
        axis = normalize_axis(ctx, int(attrs.get("axis", 0)), len(values))
        if any(getattr(v, "value", 1) == 0 for v in values):
            return tvm_converter(op)(bb, inputs, attrs, ctx)
        return float_arg_index(bb, x, axis, bool(attrs.get("keepdims", 1)), kind,
                               bool(attrs.get("select_last_index", 0)))

    convert.__doc__ = (f"{op} on floats: onnxruntime's fold (a leading NaN wins, later NaN "
                       "are skipped), select_last_index included; other dtypes TVM's")
    return convert


for _op, _kind in (("ArgMax", "max"), ("ArgMin", "min")):
    _arg_extreme(_op, _kind)
