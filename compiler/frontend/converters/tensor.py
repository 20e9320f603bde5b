"""onnxc's own converters for default-domain ops, registered over TVM's.

Each one exists because TVM 0.27's converter is wrong or silent for part of the op's
contract (found by scripts/onnx_conformance.py): it either implements that part or
refuses it with a clear error, and delegates the rest to TVM's converter.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper
import tvm
from tvm import relax

from .common import (register, refuse, static_shape, scalar, dtype_of, attr_text,
                     tensor_const, FOLD_MAX_ELEMENTS, constant_value, constant_values,
                     fold_result, static_dims, normalize_axis, int_values, cpu_lanes,
                     kernel_shape)
from ...errors import UnsupportedError
from ..registry import tvm_converter




@register("Constant", override=True)
def constant(bb, inputs, attrs, ctx):
    """Constant from value / value_float(s) / value_int(s); strings and sparse refused."""
    node = ctx.node
    for a in node.attribute:
        if a.name == "value":
            if a.t.data_type == 8:  # STRING
                raise UnsupportedError(f"node {node.name!r} (Constant): string tensors are "
                                       "not supported")
            return tensor_const(numpy_helper.to_array(a.t))
        if a.name == "value_float":
            return tensor_const(np.array(a.f, np.float32))
        if a.name == "value_floats":
            return tensor_const(np.array(list(a.floats), np.float32))
        if a.name == "value_int":
            return tensor_const(np.array(a.i, np.int64))
        if a.name == "value_ints":
            return tensor_const(np.array(list(a.ints), np.int64))
    kinds = ", ".join(a.name for a in node.attribute) or "none"
    raise UnsupportedError(f"node {node.name!r} (Constant): value attribute {kinds} is not "
                           "supported (tensor, float(s) and int(s) are)")


@register("SpaceToDepth", since=1, override=True)
def space_to_depth(bb, inputs, attrs, ctx):
    """SpaceToDepth in DCR and CRD modes."""
    x = inputs[0]
    b = int(attrs["blocksize"])
    n, c, h, w = [int(d) for d in x.ty.shape.values]
    if h % b or w % b:
        raise UnsupportedError(f"node {ctx.node.name!r} (SpaceToDepth): {h}x{w} is not a "
                               f"multiple of blocksize {b}")
    mode = attrs.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    t = relax.op.reshape(x, [n, c, h // b, b, w // b, b])
    # DCR: channel = (row offset * b + column offset) * C + c; CRD: c * b*b + offsets
    t = relax.op.permute_dims(t, [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
    return relax.op.reshape(t, [n, c * b * b, h // b, w // b])


# The value of a reduction over no elements, as ONNX's reference gives it (per dtype kind).


@register("Split", since=1, override=True)
def split(bb, inputs, attrs, ctx):
    """Split with some parts of size 0 (TVM's ``split`` wants strictly increasing indices):
    each part is a slice, an empty one a constant of its (empty) shape.  Else TVM's."""
    x = inputs[0]
    sizes = attrs.get("split")
    if ctx.opset >= 13 and len(inputs) > 1 and inputs[1] is not None:
        sizes = constant_value(inputs[1])
    if sizes is None or 0 not in [int(s) for s in np.asarray(sizes).reshape(-1)]:
        return tvm_converter("Split")(bb, inputs, attrs, ctx)
    sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
    dims = static_dims(x, ctx)
    axis = int(attrs.get("axis", 0))
    axis = axis + len(dims) if axis < 0 else axis
    if sum(sizes) != dims[axis]:
        raise UnsupportedError(f"node {ctx.node.name!r} (Split): split sizes {sizes} do not "
                               f"add up to the length {dims[axis]} of axis {axis}")
    parts, start = [], 0
    for n in sizes:
        if n == 0:
            shape = dims[:axis] + [0] + dims[axis + 1:]
            parts.append(tensor_const(np.zeros(shape, dtype=str(x.ty.dtype))))
        else:
            parts.append(relax.op.strided_slice(x, axes=[axis], begin=[start], end=[start + n]))
        start += n
    return relax.Tuple(parts)


@register("Slice", since=1, until=9, override=True)
def slice_v1(bb, inputs, attrs, ctx):
    """Slice-1 (opsets 1-9, PyTorch's opset-9 exports): starts, ends and axes are
    attributes.  TVM has only Slice-13's converter, which reads them as inputs 1-3 and
    fails on their absence; they are handed to it as constant inputs (the clamping rules
    of the two versions are the same, and Slice-1 has no steps)."""
    if "starts" not in attrs or "ends" not in attrs:
        refuse(ctx, "Slice without its starts and ends attributes")
    bounds = [tensor_const(np.asarray(attrs[k], np.int64)) if k in attrs else None
              for k in ("starts", "ends", "axes")]
    return tvm_converter("Slice")(bb, [inputs[0], *bounds, None], {}, ctx)


# --- Real exports: shape arithmetic of PyTorch's TorchScript exporter (HuggingFace models) --
#
# Exported attention masks and position ids are computed from Shape/Gather/Unsqueeze/Concat/
# Equal/Where/Range/ConstantOfShape/Expand.  Once input shapes are fixed all of it is known
# at compile time, but TVM 0.27's converters take wrong or dynamic paths on it: the
# converters below evaluate these ops with numpy when every input is known (a constant, a
# static shape value, or a constant scalar) and otherwise delegate to TVM's converter.

# Results up to this many elements are computed at import; larger ones stay Relax ops.


@register("Where", since=9, override=True)
def where(bb, inputs, attrs, ctx):
    """Where computed at import when all inputs are known; else TVM's.  TVM 0.27 folds only
    all-constant or all-1-D-shape inputs, and hands a constant scalar from shape arithmetic
    (an ``IntImm``, e.g. ``Where(cond, seq_len, x)``) to ``relax.op.where``, which refuses
    it ("Operator relax.where ... x1: Tensor")."""
    values = constant_values(inputs)
    if values is not None:
        cond, x, y = values
        out = fold_result(np.where(cond.astype(bool), x, y).astype(np.result_type(x, y)))
        if out is not None:
            return out
    return tvm_converter("Where")(bb, inputs, attrs, ctx)


@register("Pad", since=2, override=True)
def pad(bb, inputs, attrs, ctx):
    """Zero padding of the spatial dims only (constant mode, value 0, pads >= 0, none on
    the first two dims) as ``relax.nn.pad``: the same kernel as TVM's converter emits, but
    an op that ``fold_pad_into_conv`` can see and move into the next conv's padding
    (exports with explicit "same" padding: HF MobileNetV2, TF-converted models).  On CPU
    targets reflect / edge / wrap padding of a static input is a copy kernel
    (``schedules/cpu/pad.py``); elsewhere reflect padding is concatenated mirrored slices.
    Any other Pad is TVM's."""
    x = inputs[0]
    if ctx.opset < 11:
        pads, value, axes = attrs.get("pads"), attrs.get("value", 0.0), None
    else:
        pads = constant_value(inputs[1]) if len(inputs) > 1 else None
        value = (constant_value(inputs[2]) if len(inputs) > 2 and inputs[2] is not None
                 else 0.0)
        if value is None:  # TVM's converter would fail on it with an AttributeError
            refuse(ctx, "a constant_value computed at run time (not a constant)")
        axes = inputs[3] if len(inputs) > 3 else None
    mode = attr_text(attrs.get("mode"), "constant")
    rank = len(x.ty.shape) if getattr(x.ty, "shape", None) is not None else None
    if (mode == "constant" and axes is None and pads is not None and value is not None
            and rank is not None and len(pads) == 2 * rank and rank >= 3):
        pads = [int(p) for p in np.asarray(pads).reshape(-1)]
        before, after = pads[:rank], pads[rank:]
        if (float(np.asarray(value).reshape(-1)[0]) == 0.0 and min(pads) >= 0
                and before[:2] == [0, 0] and after[:2] == [0, 0]):
            width = [w for b, a in zip(before, after) for w in (b, a)]
            return relax.op.nn.pad(x, width, "constant", 0.0)
    kernel = _pad_kernel(bb, x, mode, pads, axes, rank)
    if kernel is not None:
        return kernel
    if mode == "reflect" and axes is None and pads is not None and rank is not None \
            and len(pads) == 2 * rank:
        out = _reflect_by_concat(bb, x, [int(p) for p in np.asarray(pads).reshape(-1)])
        if out is not None:
            return out
    return tvm_converter("Pad")(bb, inputs, attrs, ctx)


def _pad_kernel(bb, x, mode, pads, axes, rank):
    """Reflect / edge / wrap padding on CPU targets: rows of copies
    (``schedules/cpu/pad.py``) for a static input, constant pads >= 0 (and constant
    axes); None otherwise."""
    from schedules.cpu import pad as pad_rule

    if mode not in pad_rule.MODES or cpu_lanes() is None or pads is None or not rank:
        return None
    dims = kernel_shape(x)
    if None in dims or constant_value(x) is not None:
        return None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    if axes is not None:
        axes = constant_value(axes)
        if axes is None:
            return None
        axes = [int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(axes).reshape(-1)]
        if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes) or \
                not all(0 <= a < rank for a in axes):
            return None
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[rank + a] = pads[k], pads[len(axes) + k]
        pads = full
    if len(pads) != 2 * rank or not any(pads):
        return None
    before, after = pads[:rank], pads[rank:]
    if not all(pad_rule.fits(mode, n, b, a) for n, b, a in zip(dims, before, after)):
        return None
    out = [n + b + a for n, b, a in zip(dims, before, after)]
    gv = bb.add_func(pad_rule.pad_kernel(mode, dims, before, after, dtype_of(x)), "pad")
    return relax.call_tir(gv, relax.Tuple([x]), relax.TensorType(out, dtype_of(x)))


def _reflect_by_concat(bb, x, pads: list):
    """Reflect padding as, per padded axis, the concatenation of the mirrored border
    slices and the tensor (``x[b:0:-1], x, x[n-2:n-2-a:-1]``): copies at the concat rule's
    speed.  TVM's ``mirror_pad`` computes every output element's source index with
    selects, one scalar gather each (8.4x onnxruntime's time over [1, 64, 56, 56]).  None
    (TVM's) for a symbolic padded axis or a pad reaching the far border."""
    rank = len(pads) // 2
    dims = list(x.ty.shape.values)
    y = x
    for ax in range(rank):
        b, a = pads[ax], pads[rank + ax]
        if not b and not a:
            continue
        n = dims[ax]
        if (b < 0 or a < 0 or not isinstance(n, tvm.tirx.IntImm) or b > int(n) - 1
                or a > int(n) - 2):
            return None
        n = int(n)
        parts = ([relax.op.strided_slice(y, axes=[ax], begin=[b], end=[0], strides=[-1])]
                 if b else []) + [y]
        if a:
            parts.append(relax.op.strided_slice(y, axes=[ax], begin=[n - 2],
                                                end=[n - 2 - a], strides=[-1]))
        y = bb.normalize(relax.op.concat(parts, axis=ax))
    return y


@register("Range", since=11, override=True)
def range_(bb, inputs, attrs, ctx):
    """Range computed at import when start/limit/delta are known.  TVM 0.27 treats a
    constant scalar that comes from shape arithmetic (an ``IntImm``, e.g. the sequence length
    from Shape -> Gather) as dynamic and emits a symbolic-length ``arange`` with
    ``tensor_to_shape``, which the graph runtime cannot run."""
    values = constant_values(inputs)
    if values is not None:
        start, limit, delta = (np.asarray(v).reshape(()) for v in values)
        dtype = np.asarray(values[0]).dtype
        if delta == 0:
            raise UnsupportedError(f"node {ctx.node.name!r} (Range): delta is 0")
        # ONNX: max(ceil((limit - start) / delta), 0) elements start + i * delta
        with np.errstate(all="ignore"):
            span = np.ceil((np.float64(limit) - np.float64(start)) / np.float64(delta))
        if not np.isfinite(span):  # onnxruntime refuses it too (float32; float16 gives [])
            raise UnsupportedError(
                f"node {ctx.node.name!r} (Range): the number of elements, ceil((limit - "
                f"start) / delta) with start={start}, limit={limit}, delta={delta}, is not "
                "finite")
        count = max(int(span), 0)
        out = fold_result((start + np.arange(count, dtype=dtype) * delta).astype(dtype))
        if out is not None:
            return out
    return tvm_converter("Range")(bb, inputs, attrs, ctx)


@register("ConstantOfShape", since=9, override=True)
def constant_of_shape(bb, inputs, attrs, ctx):
    """ConstantOfShape for every output rank.  TVM 0.27 broadcasts the 1-element ``value``
    tensor (rank 1) to the target shape, which fails for a rank-0 target (``shape`` = [],
    written by PyTorch's exporter for scalar fills in mask code): "broadcast_to expects the
    input shape to have the number of ndim at least as the input tensor's"."""
    value = attrs.get("value")
    arr = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    scalar = np.asarray(arr).reshape(-1)[0]
    dims = constant_value(inputs[0])
    if dims is not None:
        dims = [int(d) for d in np.asarray(dims).reshape(-1)]
        if any(d < 0 for d in dims):
            raise UnsupportedError(f"node {ctx.node.name!r} (ConstantOfShape): negative "
                                   f"dimension in shape {dims}")
        if int(np.prod(dims)) <= FOLD_MAX_ELEMENTS:
            return tensor_const(np.full(dims, scalar, dtype=arr.dtype))
        return relax.op.broadcast_to(tensor_const(np.array(scalar, dtype=arr.dtype)), dims)
    shape = inputs[0]
    if not isinstance(shape, relax.ShapeExpr):
        shape = relax.op.tensor_to_shape(shape)
    return relax.op.broadcast_to(tensor_const(np.array(scalar, dtype=arr.dtype)), shape)


@register("Expand", since=8, override=True)
def expand(bb, inputs, attrs, ctx):
    """Expand with ONNX's bidirectional broadcasting when the target shape is known: the
    output shape is numpy's broadcast of the input's shape and ``shape`` (computed at import
    when the input is known too).  TVM 0.27 gives -1 a meaning ONNX does not and keeps an
    input dim where ``shape`` says 1 only on some paths; a shape it cannot read as constant
    takes a dynamic path (``vm.builtin.tensor_to_shape``) the graph runtime cannot run."""
    data, shape = inputs[0], inputs[1]
    target = constant_value(shape)
    if target is None:
        return tvm_converter("Expand")(bb, inputs, attrs, ctx)
    target = [int(d) for d in np.asarray(target).reshape(-1)]
    value = constant_value(data)
    data_shape = list(value.shape) if value is not None else [
        int(d) for d in static_dims(data, ctx)]
    try:
        out_shape = list(np.broadcast_shapes(tuple(data_shape), tuple(target)))
    except ValueError:
        raise UnsupportedError(f"node {ctx.node.name!r} (Expand): cannot broadcast input shape "
                               f"{data_shape} to {target}") from None
    if value is not None:
        out = fold_result(np.broadcast_to(value, out_shape).copy())
        if out is not None:
            return out
    # A same-shape broadcast_to too (as TVM's converter does), not ``data`` itself: the
    # importer would bind the alias ``n_k = n_j``, across which FuseOps does not fuse.
    return relax.op.broadcast_to(data, out_shape)


@register("Tile", since=6, override=True)
def tile(bb, inputs, attrs, ctx):
    """Tile, refusing a ``repeats`` that is not a 1-D tensor of the input's rank (Mamba's
    TorchScript export writes a [1, 1] one; onnxruntime refuses that model too, "'Repeats'
    input must be 1D tensor"), which reached TVM's converter as a nested list: "Cannot
    convert from type Array[...] to Array<int>"."""
    repeats = constant_value(inputs[1]) if inputs[1] is not None else None
    if repeats is not None:
        # the rank, not the dims: a symbolic input (GPT-J's rotary sin/cos over seq, tiled
        # by constant [1, 1, 1, 1, 2]) goes to topi.tile, which takes symbolic dims
        rank = inputs[0].ty.ndim
        if rank < 0:
            static_dims(inputs[0], ctx)  # refuses, naming the node
        shape = list(np.shape(repeats))
        if len(shape) != 1 or shape[0] != rank:
            refuse(ctx, f"repeats of shape {shape} (ONNX's Tile takes 1-D repeats, one entry "
                        f"per input axis: {rank}; onnxruntime refuses it too)")
        dims = kernel_shape(inputs[0])
        if cpu_lanes() is not None and dims and None not in dims and \
                constant_value(inputs[0]) is None and int(np.prod(repeats)) > 1 and \
                min(dims) > 0 and min(int(r) for r in repeats) > 0:
            # CPU targets: rows of contiguous copies (schedules/cpu/tile.py)
            from schedules.cpu.tile import tile_kernel

            reps = [int(r) for r in repeats]
            gv = bb.add_func(tile_kernel(dims, reps, dtype_of(inputs[0])), "tile")
            return relax.call_tir(gv, relax.Tuple([inputs[0]]), relax.TensorType(
                [d * r for d, r in zip(dims, reps)], dtype_of(inputs[0])))
    return tvm_converter("Tile")(bb, inputs, attrs, ctx)


@register("CenterCropPad", since=18)
def center_crop_pad(bb, inputs, attrs, ctx):
    """CenterCropPad: crop (the extra element on the right when odd) or zero-pad (the extra
    element on the right when odd) each of ``axes`` to the constant ``shape``."""
    x, shape_in = inputs[0], inputs[1]
    dims = static_shape(x)
    rank = len(dims)
    target = int_values(ctx, shape_in, "shape")
    axes = attrs.get("axes")
    axes = list(range(rank)) if axes is None else [normalize_axis(ctx, int(a), rank, "axes")
                                                   for a in axes]
    if len(set(axes)) != len(axes) or len(target) != len(axes):
        refuse(ctx, f"shape of {len(target)} values for axes {axes}")
    pads = [[0, 0] for _ in range(rank)]
    for a, want in zip(axes, target):
        have = dims[a]
        if want < 0:
            refuse(ctx, f"negative target size {want}")
        if want < have:
            start = (have - want) // 2
            x = bb.emit(relax.op.strided_slice(x, axes=[a], begin=[start], end=[start + want]))
        elif want > have:
            before = (want - have) // 2
            pads[a] = [before, want - have - before]
    if any(p != [0, 0] for p in pads):
        width = [v for p in pads for v in p]  # (before, after) per axis
        x = relax.op.nn.pad(x, width, pad_value=0.0)
    return x


@register("ReverseSequence", since=10)
def reverse_sequence(bb, inputs, attrs, ctx):
    """ReverseSequence: reverse the first sequence_lens[b] steps along ``time_axis`` of each
    batch entry, as one GatherElements (lengths past the time size reverse all of it)."""
    x, lens = inputs[0], inputs[1]
    dims = static_shape(x)
    rank = len(dims)
    if rank < 2:
        refuse(ctx, f"input of rank {rank} (2 or more expected)")
    batch_axis = int(attrs.get("batch_axis", 1))
    time_axis = int(attrs.get("time_axis", 0))
    if sorted((batch_axis, time_axis)) != [0, 1]:
        refuse(ctx, f"batch_axis={batch_axis}, time_axis={time_axis} (0 and 1)")
    steps = dims[time_axis]
    shape_t = [1] * rank
    shape_t[time_axis] = steps
    shape_b = [1] * rank
    shape_b[batch_axis] = dims[batch_axis]
    t = relax.const(np.arange(steps, dtype=np.int64).reshape(shape_t), "int64")
    n = relax.op.astype(lens, "int64") if dtype_of(lens) != "int64" else lens
    n = relax.op.minimum(relax.op.reshape(n, shape_b), scalar(steps, "int64"))
    n = bb.emit(n)
    rev = relax.op.subtract(relax.op.subtract(n, scalar(1, "int64")), t)
    idx = bb.emit(relax.op.where(relax.op.less(t, n), rev, t))
    idx = bb.emit(relax.op.broadcast_to(idx, dims))
    return relax.op.gather_elements(x, idx, axis=time_axis)


@register("TensorScatter", since=24)
def tensor_scatter(bb, inputs, attrs, ctx):
    """TensorScatter: write ``update`` into ``past_cache`` along ``axis`` at each batch
    entry's write index (0 without ``write_indices``); ``circular`` wraps around.  Written
    as out[j] = update[j - w] where 0 <= j - w (mod max length) < update length, else
    past[j]."""
    past, update = inputs[0], inputs[1]
    widx = inputs[2] if len(inputs) > 2 else None
    mode = attr_text(attrs.get("mode"), "linear")
    if mode not in ("linear", "circular"):
        refuse(ctx, f"mode={mode!r}")
    dims, udims = static_shape(past), static_shape(update)
    rank = len(dims)
    axis = normalize_axis(ctx, int(attrs.get("axis", -2)), rank)
    if axis == 0 or len(udims) != rank or any(
            d != u for i, (d, u) in enumerate(zip(dims, udims)) if i != axis) \
            or udims[axis] > dims[axis]:
        refuse(ctx, f"past_cache {dims} with update {udims} on axis {axis}")
    length, seq = dims[axis], udims[axis]
    shape_j = [1] * rank
    shape_j[axis] = length
    j = relax.const(np.arange(length, dtype=np.int64).reshape(shape_j), "int64")
    shape_b = [1] * rank
    shape_b[0] = dims[0]
    if widx is None:
        w = relax.const(np.zeros(shape_b, np.int64), "int64")
    else:
        w = relax.op.reshape(relax.op.astype(widx, "int64"), shape_b)
    s = relax.op.subtract(j, w)
    if mode == "circular":
        s = relax.op.floor_mod(s, scalar(length, "int64"))
    s = bb.emit(s)
    valid = bb.emit(relax.op.logical_and(relax.op.greater_equal(s, scalar(0, "int64")),
                                         relax.op.less(s, scalar(seq, "int64"))))
    src = relax.op.clip(s, 0, seq - 1) if seq > 0 else s
    gshape = list(dims)
    idx = bb.emit(relax.op.broadcast_to(src, gshape))
    gathered = bb.emit(relax.op.gather_elements(update, idx, axis=axis))
    return relax.op.where(relax.op.broadcast_to(valid, gshape), gathered, past)


def _has_zero_dim(x) -> bool:
    """Whether ``x``'s shape is known to hold a 0 (an empty tensor)."""
    from tvm import tirx

    values = getattr(getattr(x.ty, "shape", None), "values", None) or []
    return any(isinstance(v, tirx.IntImm) and int(v.value) == 0 for v in values)


@register("ScatterND", since=11, override=True)
def scatter_nd(bb, inputs, attrs, ctx):
    """ScatterND with no updates (an empty ``indices``: Longformer's scatter of the local
    positions that have no global attention, when every row has as many global tokens)
    is ``data`` unchanged, as onnxruntime returns it; TVM's TOPI kernel divides by the
    zero extent while lowering ("Divide by zero").  Otherwise TVM's converter."""
    if _has_zero_dim(inputs[1]):
        return inputs[0]
    return tvm_converter("ScatterND")(bb, inputs, attrs, ctx)


@register("ScatterElements", since=11, override=True)
def scatter_elements(bb, inputs, attrs, ctx):
    """ScatterElements with an empty ``indices`` is ``data`` unchanged (as ScatterND)."""
    if _has_zero_dim(inputs[1]):
        return inputs[0]
    return tvm_converter("ScatterElements")(bb, inputs, attrs, ctx)


@register("EyeLike", since=9, override=True)
def eye_like(bb, inputs, attrs, ctx):
    """EyeLike with the ``dtype`` attribute (TVM's converter refuses any dtype but the
    input's): ones on diagonal ``k`` of a tensor shaped like the input, in ``dtype``."""
    from onnx import helper

    x = inputs[0]
    dtype = str(x.ty.dtype) if "dtype" not in attrs else \
        np.dtype(helper.tensor_dtype_to_np_dtype(int(attrs["dtype"]))).name
    # eye_like in the input's dtype, then cast: TVM's legalization of eye_like writes the
    # input's dtype whatever dtype the call says
    eye = bb.normalize(relax.op.eye_like(x, int(attrs.get("k", 0))))
    return eye if dtype == str(x.ty.dtype) else relax.op.astype(eye, dtype)
