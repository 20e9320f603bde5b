"""Converters for ops whose output shape depends on the values of an input.

Compress (its condition), OneHot (depth), TopK (K), Reshape with ``allowzero`` (the
shape), Unsqueeze (rank-0 axes), and NonZero / Unique / NonMaxSuppression (their data).
onnxc runs static graphs, so these values must be compile-time constants: initializers,
values folded at import, or graph inputs bound by the specialising session
(``compiler/specialize.py`` lists these inputs as shape-determining and binds small
ones).  When a value is not known, the converter raises an ``UnsupportedError`` naming
the node and the input; being a ``CompileError``, it is what makes ``compiler.compile``
hand back a specialising session for a model whose inputs fix the value.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .common import (register, static_shape, dtype_of, constant_value, cpu_lanes,
                     kernel_shape)
from ...errors import UnsupportedError
from ..registry import tvm_converter

# Off CPU targets TopK is legalized as a rank count, O(n^2) per row of the reduced axis:
# longer axes are refused there rather than compiled into a kernel that would take seconds.
# CPU targets run the selection kernel (schedules/cpu/topk.py), for any length.
TOPK_MAX_AXIS = 4096






def _where(ctx) -> str:
    where = getattr(ctx.importer, "where", None)
    label = ctx.label or f"node {ctx.node.name!r} ({ctx.node.op_type})"
    return f"{where}: {label}" if where else label


def _need_constant(ctx, index: int, why: str):
    """Raise the error that says input ``index`` must be a compile-time constant."""
    node = ctx.node
    raise UnsupportedError(
        f"{_where(ctx)}: {why} depends on the values of input "
        f"{node.input[index]!r}, which are not known at compile time; onnxc compiles static "
        "shapes: compile with input_values={...} for it, or run the model through the "
        "session compiler.compile returns, which binds small shape-determining inputs")


def _const(arr: np.ndarray):
    arr = np.asarray(arr)
    return relax.const(arr, str(arr.dtype))


@register("Compress", since=9, override=True)
def compress(bb, inputs, attrs, ctx):
    """Compress with a constant condition: a take of the selected indices."""
    x, cond = inputs[0], constant_value(inputs[1])
    if cond is None:
        _need_constant(ctx, 1, "the output shape")
    axis = attrs.get("axis")
    if axis is None:
        x = bb.normalize(relax.op.reshape(x, [-1]))
        axis = 0
    shape = static_shape(x)
    axis = int(axis) + len(shape) if int(axis) < 0 else int(axis)
    try:
        idx = np.compress(cond.reshape(-1).astype(bool), np.arange(shape[axis]))
    except (IndexError, ValueError) as e:
        raise UnsupportedError(f"{_where(ctx)}: condition of {cond.size} elements does not fit "
                               f"axis {axis} of length {shape[axis]}: {e}") from None
    return relax.op.take(x, _const(idx.astype(np.int64)), axis=axis)


@register("OneHot", since=9, override=True)
def one_hot(bb, inputs, attrs, ctx):
    """OneHot with a constant depth: where(indices == range(depth), on, off)."""
    indices, depth, values = inputs
    d = constant_value(depth)
    if d is None:
        _need_constant(ctx, 1, "the output shape (depth)")
    depth_n = int(d.reshape(-1)[0])
    rank = len(static_shape(indices))
    axis = int(attrs.get("axis", -1))
    axis = axis + rank + 1 if axis < 0 else axis
    itype = dtype_of(indices)
    if itype.startswith("uint"):
        wrapped = indices
    else:  # negative in-range indices count from the end (as the reference)
        d_const = _const(np.array(depth_n, dtype=itype))
        zero = _const(np.array(0, dtype=itype))
        wrapped = relax.op.where(relax.op.less(indices, zero),
                                 relax.op.add(indices, d_const), indices)
    targets = np.arange(depth_n).astype(itype).reshape(
        (1,) * axis + (depth_n,) + (1,) * (rank - axis))
    mask = relax.op.equal(relax.op.expand_dims(wrapped, [axis]), _const(targets))
    off = relax.op.take(values, _const(np.array(0, np.int64)), axis=0)
    on = relax.op.take(values, _const(np.array(1, np.int64)), axis=0)
    return relax.op.where(mask, on, off)


@register("TopK", since=1, override=True)
def top_k(bb, inputs, attrs, ctx):
    """TopK with a constant K: on CPU targets the selection kernel
    (``schedules/cpu/topk.py``, any shape the axis of which is static), elsewhere
    ``relax.topk`` (legalized by ``compiler/lowering/legalize_topk.py``)."""
    x = inputs[0]
    if ctx.opset >= 10:
        k = constant_value(inputs[1])
        if k is None:
            _need_constant(ctx, 1, "the output shape (K)")
        k = int(k.reshape(-1)[0])
    else:
        k = int(attrs.get("k", 1))
    largest = bool(attrs.get("largest", 1))
    dims = getattr(getattr(x.ty, "shape", None), "values", None)
    rank = len(dims) if dims is not None else len(static_shape(x))  # (refuses unknown)
    axis = int(attrs.get("axis", -1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise UnsupportedError(f"{_where(ctx)}: axis {attrs.get('axis', -1)} for an input of "
                               f"rank {rank}")
    if not isinstance(dims[axis], tvm.tirx.IntImm):
        raise UnsupportedError(f"{_where(ctx)}: TopK over axis {axis} of symbolic length "
                               f"{dims[axis]} (K={k} must be checked against it at compile "
                               f"time)")
    n = int(dims[axis])
    if not 0 <= k <= n:
        raise UnsupportedError(f"{_where(ctx)}: K={k} is outside 0..{n} (the length "
                               f"of axis {axis})")
    # sorted=0 leaves the order unspecified: sorted output is a valid answer
    if cpu_lanes() is not None and k > 0 and constant_value(x) is None:
        return _topk_kernel(bb, x, dims, axis, k, largest)
    static_shape(x)
    if n > TOPK_MAX_AXIS:
        raise UnsupportedError(f"{_where(ctx)}: TopK over an axis of {n} elements is "
                               f"not supported off CPU targets (onnxc's TopK kernel there "
                               f"handles up to {TOPK_MAX_AXIS})")
    return relax.op.topk(x, k, axis, ret_type="both", largest=largest, dtype="int64")


def _topk_kernel(bb, x, dims, axis, k, largest):
    """(values, indices) of TopK from ``schedules/cpu/topk.py``."""
    from schedules.cpu.topk import topk_kernel

    dtype = dtype_of(x)
    gv = bb.add_func(topk_kernel(k, largest, dtype, kernel_shape(x), axis), "topk")
    shape = list(dims)
    shape[axis] = k
    res = bb.emit(relax.call_tir(gv, relax.Tuple([x]), [relax.TensorType(shape, dtype),
                                                        relax.TensorType(shape, "int64")]))
    return relax.Tuple([bb.emit(relax.TupleGetItem(res, i)) for i in range(2)])


@register("Reshape", since=14, override=True)
def reshape(bb, inputs, attrs, ctx):
    """Reshape with ``allowzero=1`` and a constant shape: zeros are literal dimensions
    (TVM's converter turns that shape into a run-time ``tensor_to_shape``)."""
    shape = constant_value(inputs[1])
    if not attrs.get("allowzero", 0) or shape is None or 0 not in shape:
        # TVM's converter with the inputs as the importer has them (it takes shape values,
        # which the importer turned into tensors for this onnxc entry)
        original = [ctx.tensors[n] if n else None for n in ctx.node.input]
        return tvm_converter("Reshape")(bb, original, attrs, ctx)
    dims = [int(v) for v in shape.reshape(-1)]
    if 0 in dims and -1 in dims:
        raise UnsupportedError(f"{_where(ctx)}: shape {dims} has both 0 and -1 with allowzero=1, "
                               "which ONNX leaves undefined")
    # a literal 0 makes the result empty (and Relax's reshape reads 0 as "keep the dim")
    return relax.op.zeros(relax.ShapeExpr(dims), dtype_of(inputs[0]))


@register("Unsqueeze", since=13, override=True)
def unsqueeze(bb, inputs, attrs, ctx):
    """Unsqueeze whose constant axes are a rank-0 tensor (TVM's converter wants a list)."""
    axes = constant_value(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    if axes is not None and axes.ndim == 0:
        inputs = [inputs[0], _const(axes.reshape(1))]
    return tvm_converter("Unsqueeze")(bb, inputs, attrs, ctx)


def _evaluated_or_refused(op: str):
    """A data-dependent op: its value when all its inputs are constants, else refused."""

    def convert(bb, inputs, attrs, ctx):
        from ..fold_onnx import evaluate, opset_ids

        values = [None if x is None else constant_value(x) for x in inputs]
        for k, (x, v) in enumerate(zip(inputs, values)):
            if x is not None and v is None:
                _need_constant(ctx, k, "the output shape")
        result = evaluate(ctx.node, values, opset_ids(ctx.importer.domain_opsets))
        if result is None:
            raise UnsupportedError(f"{_where(ctx)}: could not evaluate {op} on its constant inputs")
        outs = [_const(r) for r in result]
        return outs[0] if len(outs) == 1 else relax.Tuple(outs)

    convert.__doc__ = f"{op} on constant inputs, evaluated at import (its output shape " \
                      "depends on its data)."
    return convert


def unique(x: np.ndarray, axis: int | None = None, sort: bool = True) -> list[np.ndarray]:
    """ONNX Unique-11's four outputs (y, indices, inverse_indices, counts) of ``x``.

    Written here rather than taken from onnx.reference, whose ``sorted=0`` is wrong
    (onnx 1.20: it gathers the first occurrences from ``x`` along axis 0 whatever the
    axis, and without an axis indexes the unflattened ``x``; onnxruntime is right).
    ``sort=False`` orders the unique values (slices along ``axis``) by first occurrence.
    """
    if axis is None:
        x, axis = x.reshape(-1), 0
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not sort:
        order = np.argsort(first, kind="stable")     # sorted position -> by first occurrence
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y, first, counts, inverse = np.take(y, order, axis=axis), first[order], \
            counts[order], rank[inverse]
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


@register("Unique", since=11, override=True)
def unique_op(bb, inputs, attrs, ctx):
    """Unique of a constant input (its output shape depends on its data), computed at
    import by :func:`unique`; a graph input is bound as a value by the session."""
    x = constant_value(inputs[0])
    if x is None:
        _need_constant(ctx, 0, "the output shape")
    axis = attrs.get("axis")
    if axis is not None:
        axis = int(axis)
        if not -x.ndim <= axis < max(x.ndim, 1):
            raise UnsupportedError(f"{_where(ctx)}: axis {axis} is out of range for input "
                                   f"{ctx.node.input[0]!r} of rank {x.ndim}")
        axis %= max(x.ndim, 1)
    if x.dtype.kind == "f" and np.isnan(x).any():
        raise UnsupportedError(f"{_where(ctx)}: input {ctx.node.input[0]!r} holds NaN, which "
                               "ONNX Unique leaves undefined (is NaN equal to NaN?)")
    outs = [_const(r) for r in unique(x, axis, bool(attrs.get("sorted", 1)))]
    return relax.Tuple(outs[:max(1, len(ctx.node.output))])


register("NonZero", since=9, override=True)(_evaluated_or_refused("NonZero"))
_nms_evaluated = _evaluated_or_refused("NonMaxSuppression")


@register("NonMaxSuppression", since=10, override=True)
def non_max_suppression(bb, inputs, attrs, ctx):
    """NonMaxSuppression on constant inputs, evaluated at import by onnx's reference, which
    fails on the defaults ONNX gives its optional inputs: max_output_boxes_per_class omitted
    (or empty) is 0, so no box is selected whatever the data (a [0, 3] output, as
    onnxruntime's, also for a count <= 0); iou_threshold omitted is 0."""
    count = inputs[2] if len(inputs) > 2 else None
    value = None if count is None else constant_value(count)
    if count is None or (value is not None and (value.size == 0
                                                or int(value.reshape(-1)[0]) <= 0)):
        return _const(np.zeros((0, 3), np.int64))
    if len(inputs) < 4 or inputs[3] is None:
        inputs = list(inputs[:3]) + [_const(np.zeros((1,), np.float32))] + list(inputs[4:])
    return _nms_evaluated(bb, inputs, attrs, ctx)
