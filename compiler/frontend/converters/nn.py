"""onnxc's converters for neural-network ops TVM 0.27 lacks or gets wrong.

Attention (opset 23+), NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, ...  Each
follows the ONNX spec and its reference implementation (``onnx/reference/ops``) and refuses,
with an ``UnsupportedError`` naming the node and attribute, what it does not implement.
"""

from __future__ import annotations

import itertools

import numpy as np
from onnx import helper
import tvm
from tvm import relax

from .common import (register, refuse, static_shape, np_dtype, scalar, dtype_of, is_float,
                     attr_text, const_input, static_dims, float_only, normalize_axis,
                     int_values, constant_value)
from ...errors import UnsupportedError
from ..registry import tvm_converter


def _const(arr: np.ndarray):
    return relax.const(arr, str(arr.dtype))


def _is_neginf(bb, x):
    """x == -inf as a bool tensor (isinf and negative: no -inf comparison constant)."""
    return relax.op.logical_and(relax.op.isinf(x),
                                relax.op.less(x, scalar(0, dtype_of(x))))


def _safe_softmax(bb, x, axis=-1):
    """Softmax over ``axis`` as ONNX's reference computes it: a row whose maximum is -inf
    (fully masked) gives zeros, not NaN."""
    dtype = dtype_of(x)
    zero, one = scalar(0, dtype), scalar(1, dtype)
    mx = bb.emit(relax.op.max(x, axis=[axis], keepdims=True))
    safe = relax.op.where(_is_neginf(bb, mx), zero, mx)
    tmp = bb.emit(relax.op.exp(relax.op.subtract(x, safe)))
    s = bb.emit(relax.op.sum(tmp, axis=[axis], keepdims=True))
    s = relax.op.where(relax.op.equal(s, zero), one, s)
    return bb.emit(relax.op.divide(tmp, s))


# --------------------------------------------------------------------------- #
# Attention (opset 23, 24, 25)
# --------------------------------------------------------------------------- #


@register("Attention", since=23, override=True)
def attention(bb, inputs, attrs, ctx):
    """Scaled dot-product attention as in ONNX's reference: 3-D inputs with q_num_heads /
    kv_num_heads or 4-D, GQA/MQA (kv heads repeated), scale, is_causal (offset-aware),
    attn_mask (bool or additive; padded on the kv axis), past/present key and value,
    softcap, qk_matmul_output_mode 0-3, softmax_precision, nonpad_kv_seqlen and the
    sliding window (left/right_window_size); fully masked rows give 0."""
    node = ctx.node
    inputs = list(inputs) + [None] * (7 - len(inputs))
    q, k, v, mask, past_k, past_v, nonpad = inputs[:7]
    dtype = dtype_of(q)
    if not is_float(dtype):
        refuse(ctx, f"input type {dtype}")
    rank = q.ty.ndim
    if rank not in (3, 4) or k.ty.ndim != rank or v.ty.ndim != rank:
        refuse(ctx, f"Q/K/V of ranks {q.ty.ndim}/{k.ty.ndim}/{v.ty.ndim}")
    if (past_k is None) != (past_v is None):
        refuse(ctx, "past_key without past_value (or the reverse)")
    if nonpad is not None and past_k is not None:
        refuse(ctx, "nonpad_kv_seqlen together with past_key/past_value")
    q_heads = attrs.get("q_num_heads")
    kv_heads = attrs.get("kv_num_heads")
    left = int(attrs.get("left_window_size", -1))
    right = int(attrs.get("right_window_size", -1))
    if left < -1 or right < -1:
        refuse(ctx, f"left_window_size={left} / right_window_size={right} (must be >= -1)")
    is_causal = bool(attrs.get("is_causal", 0))
    softcap = float(attrs.get("softcap", 0.0))
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        refuse(ctx, f"attribute qk_matmul_output_mode={mode}")
    sm_precision = attrs.get("softmax_precision")
    if softcap > 0 and mode == 0 and len(node.output) > 3 and node.output[3]:
        # the spec says the raw QK product, ONNX's reference returns it after the softcap
        refuse(ctx, "the qk_matmul_output output with qk_matmul_output_mode=0 and softcap "
                "(the spec and the reference implementation disagree)")
    if ctx.opset >= 25 and rank == 4 and (q_heads is not None or kv_heads is not None):
        refuse(ctx, "q_num_heads/kv_num_heads with 4-D inputs")

    def to_4d(x, heads, what):
        b, s, hidden = static_shape(x)
        if heads is None or heads <= 0 or hidden % heads:
            refuse(ctx, f"3-D {what} of hidden size {hidden} with num_heads={heads}")
        x = relax.op.reshape(x, [b, s, heads, hidden // heads])
        return bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))

    if rank == 3:
        if q_heads is None or kv_heads is None:
            refuse(ctx, "3-D inputs without q_num_heads and kv_num_heads")
        q = to_4d(q, int(q_heads), "Q")
        k = to_4d(k, int(kv_heads), "K")
        v = to_4d(v, int(kv_heads), "V")
    batch, hq, sq, dh = static_shape(q)

    scale = attrs.get("scale")
    scale = 1.0 / np.sqrt(dh) if scale is None else float(scale)
    sqrt_scale = scalar(np.sqrt(scale), dtype)

    if past_k is not None:
        k = bb.emit(relax.op.concat([past_k, k], axis=2))
        v = bb.emit(relax.op.concat([past_v, v], axis=2))
    present_k, present_v = k, v
    skv = static_shape(k)[2]
    past_len = static_shape(past_k)[2] if past_k is not None else 0

    # --- additive bias (None: no masking at all) ---------------------------------------
    neg_inf, zero = scalar(-np.inf, dtype), scalar(0, dtype)
    bias = None
    if mask is not None:
        mshape = static_shape(mask)
        mdtype = dtype_of(mask)
        pad = skv - mshape[-1]
        if pad < 0:
            refuse(ctx, f"attn_mask of kv length {mshape[-1]} > {skv}")
        if pad > 0:
            fill = np.zeros(mshape[:-1] + [pad], dtype=bool) if mdtype == "bool" else \
                np.full(mshape[:-1] + [pad], -np.inf, dtype=np_dtype(mdtype))
            mask = bb.emit(relax.op.concat([mask, relax.const(fill, mdtype)], axis=-1))
        if mdtype == "bool":
            mask = relax.op.where(mask, zero, neg_inf)
        elif mdtype != dtype:
            mask = relax.op.astype(mask, dtype)
        bias = bb.emit(mask)

    # offset of the query block: scalar, or per batch (B,) with nonpad_kv_seqlen
    i_idx = np.arange(sq, dtype=np.int64).reshape(sq, 1)
    j_idx = np.arange(skv, dtype=np.int64).reshape(1, skv)

    def frontier(allowed_np_fn, allowed_relax_fn):
        """A (q, kv) or (B, 1, q, kv) 0/-inf bias for the rule ``allowed(diff)`` with
        diff = (i + offset) - j."""
        if nonpad is None:
            diff = (i_idx + past_len) - j_idx
            return _const(np.where(allowed_np_fn(diff), 0, -np.inf).astype(np_dtype(dtype)))
        offs = relax.op.subtract(relax.op.reshape(relax.op.astype(nonpad, "int64"),
                                                  [batch, 1, 1]),
                                 scalar(sq, "int64"))
        diff = relax.op.subtract(relax.op.add(_const(i_idx), offs), _const(j_idx))
        allowed = allowed_relax_fn(bb.emit(diff))
        out = relax.op.where(allowed, zero, neg_inf)
        return bb.emit(relax.op.reshape(out, [batch, 1, sq, skv]))

    def add_bias(b, extra):
        return extra if b is None else bb.emit(relax.op.add(b, extra))

    if is_causal:
        bias = add_bias(bias, frontier(lambda d: d >= 0,
                                       lambda d: relax.op.greater_equal(d, scalar(0, "int64"))))
    if left >= 0 or right >= 0:
        def np_rule(d):
            ok = np.ones_like(d, dtype=bool)
            if left >= 0:
                ok &= d <= left
            if right >= 0:
                ok &= -d <= right
            return ok

        def relax_rule(d):
            ok = None
            if left >= 0:
                ok = relax.op.less_equal(d, scalar(left, "int64"))
            if right >= 0:
                r = relax.op.greater_equal(d, scalar(-right, "int64"))
                ok = r if ok is None else relax.op.logical_and(ok, r)
            return ok

        bias = add_bias(bias, frontier(np_rule, relax_rule))
    if nonpad is not None:
        valid = relax.op.less(_const(np.arange(skv, dtype=np.int64).reshape(1, skv)),
                              relax.op.reshape(relax.op.astype(nonpad, "int64"), [batch, 1]))
        pad_bias = relax.op.reshape(relax.op.where(valid, zero, neg_inf), [batch, 1, 1, skv])
        bias = add_bias(bias, bb.emit(pad_bias))

    # --- GQA / MQA ------------------------------------------------------------------
    hk, hv = static_shape(k)[1], static_shape(v)[1]
    if hk != hv:
        refuse(ctx, f"K with {hk} heads and V with {hv} heads")
    if hq != hk:
        if hq % hk:
            refuse(ctx, f"{hq} query heads over {hk} key/value heads (not a multiple)")
        k = bb.emit(relax.op.repeat(k, hq // hk, axis=1))
        v = bb.emit(relax.op.repeat(v, hq // hk, axis=1))

    # --- scores ---------------------------------------------------------------------
    qs = relax.op.multiply(q, sqrt_scale)
    kt = relax.op.multiply(relax.op.permute_dims(k, [0, 1, 3, 2]), sqrt_scale)
    qk = bb.emit(relax.op.matmul(bb.emit(qs), bb.emit(kt)))
    qk_out = qk
    if softcap > 0:
        cap = scalar(softcap, dtype)
        qk = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(qk, cap)), cap))
        if mode == 1:
            qk_out = qk
    scores = qk if bias is None else bb.emit(relax.op.add(qk, bias))
    if mode == 2:
        qk_out = scores
    if sm_precision is not None:
        sm_dtype = helper.tensor_dtype_to_np_dtype(int(sm_precision))
        sm_dtype = "bfloat16" if "bfloat16" in str(sm_dtype) else np.dtype(sm_dtype).name
        if not is_float(sm_dtype):
            refuse(ctx, f"attribute softmax_precision={sm_precision}")
        if sm_dtype != dtype:
            scores = bb.emit(relax.op.astype(scores, sm_dtype))
    probs = _safe_softmax(bb, scores)
    if bias is not None:
        # fully masked rows (decided on the bias, as the reference does) give 0
        row_max = bb.emit(relax.op.max(bias, axis=[-1], keepdims=True))
        probs = bb.emit(relax.op.where(_is_neginf(bb, row_max),
                                       scalar(0, dtype_of(probs)), probs))
    if mode == 3:
        qk_out = probs
    if dtype_of(probs) != dtype:
        probs = bb.emit(relax.op.astype(probs, dtype))
    if dtype_of(qk_out) != dtype:
        qk_out = bb.emit(relax.op.astype(qk_out, dtype))
    y = bb.emit(relax.op.matmul(probs, v))
    if rank == 3:
        b_, h_, s_, d_ = static_shape(y)
        y = bb.emit(relax.op.reshape(relax.op.permute_dims(y, [0, 2, 1, 3]), [b_, s_, h_ * d_]))
    outs = [y, present_k, present_v, qk_out]
    n = len(node.output)
    if n == 1:
        return y
    return relax.Tuple(outs[:n])


# --------------------------------------------------------------------------- #
# NegativeLogLikelihoodLoss (12+), SoftmaxCrossEntropyLoss (12+)
# --------------------------------------------------------------------------- #


def _reduction(ctx, attrs) -> str:
    r = attrs.get("reduction", b"mean")
    r = r.decode() if isinstance(r, bytes) else str(r)
    if r not in ("none", "sum", "mean"):
        refuse(ctx, f"attribute reduction={r!r}")
    return r


def _nll(bb, ctx, logp, target, weight, attrs):
    """ONNX's NLL of log-probabilities ``logp`` (N, C, d...) at ``target`` (N, d...)."""
    reduction = _reduction(ctx, attrs)
    dtype = dtype_of(logp)
    if not is_float(dtype):
        refuse(ctx, f"input type {dtype}")
    shape = static_shape(logp)
    if len(shape) < 2:
        refuse(ctx, f"input of rank {len(shape)} (must be >= 2)")
    tshape = static_shape(target)
    if tshape != [shape[0]] + shape[2:]:
        refuse(ctx, f"target of shape {tshape} for input of shape {shape}")
    n_classes = shape[1]
    tdtype = dtype_of(target)
    ii = attrs.get("ignore_index")
    # indices clipped into [0, C): an ignored (or out-of-range ignore_index) target reads
    # some class, and its loss is then replaced by 0
    safe = relax.op.minimum(relax.op.maximum(target, scalar(0, tdtype)),
                            scalar(n_classes - 1, tdtype))
    safe = bb.emit(relax.op.astype(safe, "int64") if tdtype != "int64" else safe)
    picked = relax.op.gather_elements(logp, relax.op.expand_dims(safe, 1), axis=1)
    loss = bb.emit(relax.op.negative(relax.op.squeeze(picked, [1])))
    zero = scalar(0, dtype)
    keep = None
    if ii is not None:
        keep = bb.emit(relax.op.not_equal(target, scalar(int(ii), tdtype)))
        loss = bb.emit(relax.op.where(keep, loss, zero))
    w = None
    if weight is not None:
        w = relax.op.take(weight, safe, axis=0)
        if dtype_of(weight) != dtype:
            w = relax.op.astype(w, dtype)
        if keep is not None:
            w = relax.op.where(keep, w, zero)
        w = bb.emit(w)
        loss = bb.emit(relax.op.multiply(loss, w))
    elif keep is not None:
        w = bb.emit(relax.op.astype(keep, dtype))
    if reduction == "none":
        return loss
    total = bb.emit(relax.op.sum(loss))
    if reduction == "sum":
        return total
    if w is None:
        return relax.op.divide(total, scalar(int(np.prod(tshape)), dtype))
    # mean: divided by the sum of the weights applied (ignored targets weigh 0)
    return relax.op.divide(total, relax.op.sum(w))


@register("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(bb, inputs, attrs, ctx):
    """NegativeLogLikelihoodLoss: reduction none/sum/mean, optional weight, ignore_index,
    inputs (N, C) or (N, C, d1, ..., dk)."""
    inputs = list(inputs) + [None] * (3 - len(inputs))
    return _nll(bb, ctx, inputs[0], inputs[1], inputs[2], attrs)


@register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(bb, inputs, attrs, ctx):
    """SoftmaxCrossEntropyLoss: NLL of log_softmax over axis 1; reduction none/sum/mean,
    weight, ignore_index, N-d inputs, and the optional log_prob output."""
    inputs = list(inputs) + [None] * (3 - len(inputs))
    x = inputs[0]
    if not is_float(dtype_of(x)) or x.ty.ndim < 2:
        refuse(ctx, f"input of type {dtype_of(x)} and rank {x.ty.ndim}")
    logp = bb.emit(relax.op.nn.log_softmax(x, axis=1))
    loss = _nll(bb, ctx, logp, inputs[1], inputs[2], attrs)
    outs = [o for o in ctx.node.output]
    if len(outs) > 1:
        return relax.Tuple([loss, logp])
    return loss


# --------------------------------------------------------------------------- #
# RMSNormalization (23+) over every axis
# --------------------------------------------------------------------------- #


@register("RMSNormalization", since=23, override=True)
def rms_normalization(bb, inputs, attrs, ctx):
    """RMSNormalization; over all axes (axis 0 or -rank) decomposed as the reference
    computes it, x / sqrt(mean(x^2) + epsilon) * scale in the stash type, because TVM
    0.27's rms_norm kernel fails to build there ("Tensor dimension mismatch in read").
    Other axes: TVM's."""

    x, scale = inputs[0], inputs[1]
    ndim = x.ty.ndim
    axis = int(attrs.get("axis", -1))
    if (axis + ndim if axis < 0 else axis) != 0:
        return tvm_converter("RMSNormalization")(bb, inputs, attrs, ctx)
    if int(attrs.get("stash_type", 1)) != 1:
        refuse(ctx, f"attribute stash_type={attrs.get('stash_type')}")
    dtype = dtype_of(x)
    xs = relax.op.astype(x, "float32") if dtype != "float32" else x
    ws = relax.op.astype(scale, "float32") if dtype_of(scale) != "float32" else scale
    xs = bb.emit(xs)
    ms = relax.op.mean(relax.op.multiply(xs, xs), axis=list(range(ndim)), keepdims=True)
    eps = scalar(float(attrs.get("epsilon", 1e-5)), "float32")
    inv = bb.emit(relax.op.divide(scalar(1, "float32"), relax.op.sqrt(relax.op.add(ms, eps))))
    y = relax.op.multiply(relax.op.multiply(xs, inv), ws)
    return relax.op.astype(y, dtype) if dtype != "float32" else y


# --------------------------------------------------------------------------- #
# MaxPool with its Indices output (8+), MaxUnpool with output_shape (11+)
# --------------------------------------------------------------------------- #


def _pool_geometry(ctx, attrs, in_spatial):
    """(kernel, strides, dilations, begin pads, output spatial shape) of a pool, as the
    spec gives them (ceil_mode, auto_pad)."""
    k = len(in_spatial)
    kernel = [int(v) for v in attrs["kernel_shape"]]
    strides = [int(v) for v in attrs.get("strides", [1] * k)]
    dil = [int(v) for v in attrs.get("dilations", [1] * k)]
    pads = [int(v) for v in attrs.get("pads", [0] * 2 * k)]
    auto_pad = attr_text(attrs.get("auto_pad"), "NOTSET")
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    begin, out = pads[:k], []
    for i, n in enumerate(in_spatial):
        span = (kernel[i] - 1) * dil[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # the spec (and onnxruntime): ceil(n / stride) outputs, the odd padding pixel at
            # the end (UPPER) or the start (LOWER); the reference floors for SAME_LOWER
            o = -(-n // strides[i])
            total = max((o - 1) * strides[i] + span - n, 0)
            begin[i] = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        elif auto_pad == "VALID":
            o, begin[i] = -(-(n - span + 1) // strides[i]), 0
        elif auto_pad == "NOTSET":
            size = n + pads[i] + pads[i + k] - span
            o = (-(-size // strides[i]) if ceil_mode else size // strides[i]) + 1
            if ceil_mode and (o - 1) * strides[i] >= n + pads[i]:
                o -= 1
        else:
            refuse(ctx, f"attribute auto_pad={auto_pad!r}")
        out.append(o)
    return kernel, strides, dil, begin, out


def _whole_window(x, attrs) -> bool:
    """The pool's one window covers the whole unpadded input in every spatial dim (a
    kernel at least the input's size, no padding, no auto_pad, no dilation): then it is a
    global pool.  HF EfficientNet's head is AvgPool2d(1280, ceil_mode=True) on a 7 x 7
    map, which TVM's pool kernel evaluates as 1280 x 1280 bounds-checked taps per output
    (40 s a call)."""
    try:
        shape = static_shape(x)
    except Exception:  # symbolic dims: leave it to TVM
        return False
    spatial = shape[2:]
    kernel = [int(k) for k in attrs.get("kernel_shape", [])]
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * len(spatial))]
    dil = [int(d) for d in attrs.get("dilations", [1] * len(spatial))]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    return (len(kernel) == len(spatial) > 0 and auto_pad == "NOTSET" and not any(pads)
            and all(d == 1 for d in dil) and all(k >= n for k, n in zip(kernel, spatial))
            and all(_pool_out(n, k, s, attrs) == 1 for n, k, s in zip(
                spatial, kernel, attrs.get("strides", [1] * len(spatial)))))


def _pool_out(n, k, s, attrs) -> int:
    span = (n - k) / int(s) + 1
    return int(np.ceil(span)) if int(attrs.get("ceil_mode", 0)) else int(np.floor(span))


@register("AveragePool", since=1, override=True)
def average_pool(bb, inputs, attrs, ctx):
    """AveragePool whose one window covers the whole input: a mean over the spatial dims
    (count_include_pad cannot matter without padding; the part of a ceil_mode window past
    the input is never counted).  Otherwise TVM's."""
    x = inputs[0]
    if _whole_window(x, attrs):
        return relax.op.mean(x, axis=list(range(2, len(static_shape(x)))), keepdims=True)
    return tvm_converter("AveragePool")(bb, inputs, attrs, ctx)


def _global_max(x):
    """Max over the spatial dims of a statically shaped NC... tensor as one max_pool window
    (a float pool skips NaN as onnxruntime's pools do, ``compiler/lowering/legalize_pool.py``;
    ``relax.max`` follows ReduceMax's NaN rule instead)."""
    spatial = static_shape(x)[2:]
    k = len(spatial)
    pool = {1: relax.op.nn.max_pool1d, 2: relax.op.nn.max_pool2d,
            3: relax.op.nn.max_pool3d}.get(k)
    if pool is None or not is_float(dtype_of(x)):
        return relax.op.max(x, axis=list(range(2, 2 + k)), keepdims=True)
    return pool(x, pool_size=spatial, strides=[1] * k, padding=[0] * (2 * k))


@register("GlobalMaxPool", override=True)
def global_max_pool(bb, inputs, attrs, ctx):
    """GlobalMaxPool: one max_pool window over the spatial dims when they are static (NaN
    skipped as onnxruntime's pool does), else TVM's (a ``relax.max``)."""
    try:
        return _global_max(inputs[0])
    except UnsupportedError:  # symbolic spatial dims
        return tvm_converter("GlobalMaxPool")(bb, inputs, attrs, ctx)


@register("MaxPool", since=8, override=True)
def max_pool(bb, inputs, attrs, ctx):
    """MaxPool; with the Indices output requested, one TE argmax reduction gives both the
    maximum and its flat index into the input (n, c, then row-major over the spatial
    axes, or column-major for storage_order=1), the first maximum winning ties as in the
    reference.  One output: TVM's."""
    from tvm import te, tirx


    node = ctx.node
    if len(node.output) < 2 or not node.output[1]:
        if _whole_window(inputs[0], attrs):  # one window over the whole input
            return _global_max(inputs[0])
        return tvm_converter("MaxPool")(bb, inputs, attrs, ctx)
    x = inputs[0]
    shape = static_shape(x)
    dtype = dtype_of(x)
    spatial = shape[2:]
    k = len(spatial)
    order = int(attrs.get("storage_order", 0))
    if order == 1 and k != 2:
        refuse(ctx, f"storage_order=1 with {k} spatial axes")
    kernel, strides, dil, begin, out = _pool_geometry(ctx, attrs, spatial)
    lowest = -np.inf if is_float(dtype) else np.iinfo(np.dtype(dtype)).min
    big = np.iinfo(np.int64).max

    def compute(t):
        def combine(a, b):  # (index, value): the larger value, then the smaller index
            take_a = tirx.Or(a[1] > b[1], tirx.And(a[1] == b[1], a[0] < b[0]))
            return tirx.Select(take_a, a[0], b[0]), tirx.Select(take_a, a[1], b[1])

        argmax = te.comm_reducer(combine, lambda t0, t1: (tirx.const(big, t0),
                                                          tirx.const(lowest, t1)),
                                 name="argmax_first")
        rk = [te.reduce_axis((0, kernel[i]), name=f"r{i}") for i in range(k)]

        def body(n, c, *o):
            pos = [o[i] * strides[i] - begin[i] + rk[i] * dil[i] for i in range(k)]
            inside = tirx.const(True, "bool")
            for i in range(k):
                inside = tirx.And(inside, tirx.And(pos[i] >= 0, pos[i] < spatial[i]))
            flat = (n * shape[1] + c).astype("int64")
            dims = list(range(k)) if order == 0 else list(reversed(range(k)))
            for i in dims:
                flat = flat * spatial[i] + pos[i].astype("int64")
            safe = [tirx.max(tirx.min(p, spatial[i] - 1), 0) for i, p in enumerate(pos)]
            value = tirx.Select(inside, t[(n, c, *safe)], tirx.const(lowest, dtype))
            index = tirx.Select(inside, flat, tirx.const(big, "int64"))
            return argmax((index, value), axis=rk)

        idx, val = te.compute(shape[:2] + out, body, name="max_pool_argmax")
        return [val, idx]

    res = bb.emit_te(compute, x, primfunc_name_hint="max_pool_with_indices")
    return relax.Tuple([bb.emit(relax.TupleGetItem(res, 0)),
                        bb.emit(relax.TupleGetItem(res, 1))])


@register("MaxUnpool", since=9, override=True)
def max_unpool(bb, inputs, attrs, ctx):
    """MaxUnpool; with output_shape, as the reference: the values are scattered into the
    shape inferred from kernel, strides and pads (the indices index that shape), which is
    then placed at the origin of a zero tensor of output_shape.  Without it: TVM's."""

    if len(inputs) < 3 or inputs[2] is None:
        return tvm_converter("MaxUnpool")(bb, inputs, attrs, ctx)
    out_shape = constant_value(inputs[2])
    if out_shape is None:
        refuse(ctx, "a non-constant output_shape input")
    out_shape = [int(v) for v in np.asarray(out_shape).reshape(-1)]
    y = bb.normalize(tvm_converter("MaxUnpool")(bb, [inputs[0], inputs[1], None], attrs, ctx))
    inferred = static_shape(y)
    if len(out_shape) != len(inferred) or any(o < i for o, i in zip(out_shape, inferred)):
        refuse(ctx, f"output_shape {out_shape} smaller than the unpooled shape {inferred}")
    if out_shape == inferred:
        return y
    return relax.op.nn.pad(y, [v for o, i in zip(out_shape, inferred) for v in (0, o - i)])


# --------------------------------------------------------------------------- #
# Resize: refuse what TVM 0.27's converter computes wrongly
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# CumSum (11+), CumProd (26+)
# --------------------------------------------------------------------------- #


@register("Dropout", override=True)
def dropout(bb, inputs, attrs, ctx):
    """Dropout where it is deterministic: inference (training_mode false) or a ratio of 0
    give output = input and mask = all true (bool).  Training with a ratio > 0 draws
    random numbers and is refused.  training_mode and ratio given as inputs must be
    constants (the session binds them as values when they are graph inputs)."""
    node = ctx.node
    training = bool(attrs.get("training_mode", 0)) if "training_mode" in attrs else False
    if len(inputs) > 2 and inputs[2] is not None:
        value = const_input(inputs[2], "training_mode", node)
        training = bool(np.asarray(value).item())
    if training:
        ratio = 0.5
        if len(inputs) > 1 and inputs[1] is not None:
            ratio = float(np.asarray(const_input(inputs[1], "ratio", node)).item())
        if ratio != 0:
            raise UnsupportedError(f"node {node.name!r} (Dropout): training_mode=True with "
                                   f"ratio={ratio} is not supported (random dropout; onnxc "
                                   "compiles inference)")
    x = inputs[0]
    if len(node.output) > 1 and node.output[1]:
        if ctx.opset < 12:
            # onnxruntime's Dropout 7-11 (an IdentityOp) fills the mask with zeros in
            # inference: 0 of x's type at 7-9 (the mask is typed T there), false at 10-11
            # (onnx.reference gives true); from 12 both give true
            return relax.Tuple([x, relax.op.zeros_like(
                x, dtype=str(x.ty.dtype) if ctx.opset < 10 else "bool")])
        return relax.Tuple([x, relax.op.ones_like(x, dtype="bool")])
    return x


@register("BatchNormalization", override=True)
def batch_norm(bb, inputs, attrs, ctx):
    """BatchNormalization: inference is TVM's (opsets 7-8's ``spatial=0``, per element, is
    ours); training_mode=1 (opset 14+) normalizes with
    the batch statistics and returns the running mean and variance updated with
    ``momentum``, as the reference computes them (population variance)."""
    if ctx.opset < 9 and attrs.get("spatial", 1) == 0:
        return _batch_norm_per_element(bb, inputs, attrs, ctx)
    if not attrs.get("training_mode", 0):
        return tvm_converter("BatchNormalization")(bb, inputs, attrs, ctx)
    x, scale, bias, mean, var = inputs[:5]
    ndim = x.ty.ndim
    axes = [0] + list(range(2, ndim))
    dtype = str(x.ty.dtype)
    eps = relax.const(np.array(attrs.get("epsilon", 1e-5), dtype), dtype)
    momentum = float(attrs.get("momentum", 0.9))

    def per_channel(t):
        return relax.op.reshape(t, [1, -1] + [1] * (ndim - 2))

    batch_mean = bb.emit(relax.op.mean(x, axis=axes))
    centered = bb.emit(relax.op.subtract(x, per_channel(batch_mean)))
    batch_var = bb.emit(relax.op.mean(relax.op.multiply(centered, centered), axis=axes))
    y = relax.op.divide(relax.op.multiply(per_channel(scale), centered),
                        relax.op.sqrt(relax.op.add(per_channel(batch_var), eps)))
    y = bb.emit(relax.op.add(y, per_channel(bias)))
    m = relax.const(np.array(momentum, dtype), dtype)
    m1 = relax.const(np.array(1 - momentum, dtype), dtype)
    running_mean = relax.op.add(relax.op.multiply(mean, m), relax.op.multiply(batch_mean, m1))
    running_var = relax.op.add(relax.op.multiply(var, m), relax.op.multiply(batch_var, m1))
    outs = [y, bb.emit(running_mean), bb.emit(running_var)][:max(len(ctx.node.output), 1)]
    return outs[0] if len(outs) == 1 else relax.Tuple(outs)


def _batch_norm_per_element(bb, inputs, attrs, ctx):
    """BatchNormalization 7-8 with ``spatial=0`` (inference): statistics per element of
    (C, D1, ..., Dn), not per channel; scale, B, mean and var hold one value per element.
    TVM's converter knows only the per-channel form (relax.nn.batch_norm refuses the
    shapes)."""
    x = inputs[0]
    dims = static_dims(x, ctx)
    dtype = str(x.ty.dtype)
    params = []
    for name, t in zip(("scale", "B", "mean", "var"), inputs[1:5]):
        shape = static_dims(t, ctx)
        if shape != dims[1:]:  # onnxruntime refuses other shapes too
            refuse(ctx, f"spatial=0 with {name} of shape {shape} for an input of shape "
                   f"{dims} (shape {dims[1:]} expected)")
        params.append(t)
    scale, bias, mean, var = params
    eps = relax.const(np.array(attrs.get("epsilon", 1e-5), dtype), dtype)
    y = relax.op.divide(relax.op.multiply(relax.op.subtract(x, mean), scale),
                        relax.op.sqrt(relax.op.add(var, eps)))
    if any(ctx.node.output[1:]):
        refuse(ctx, "spatial=0 with the training outputs (mean, var, saved_mean, saved_var)")
    return relax.op.add(y, bias)


@register("LayerNormalization", since=17, override=True)
def layer_norm(bb, inputs, attrs, ctx):
    """LayerNormalization; the optional Mean and InvStdDev outputs computed too."""
    y = tvm_converter("LayerNormalization")(bb, inputs, attrs, ctx)
    if isinstance(y, relax.Tuple):
        y = y.fields[0]
    outputs = [o for o in ctx.node.output]
    if len(outputs) <= 1 or not any(outputs[1:]):
        return y
    x = inputs[0]
    ndim = x.ty.ndim
    axis = int(attrs.get("axis", -1))
    axis = axis + ndim if axis < 0 else axis
    axes = list(range(axis, ndim))
    eps = float(attrs.get("epsilon", 1e-5))
    stash = int(attrs.get("stash_type", 1))
    xs = relax.op.astype(x, "float32") if stash == 1 and x.ty.dtype != "float32" else x
    mean = bb.emit(relax.op.mean(xs, axis=axes, keepdims=True))
    centered = bb.emit(relax.op.subtract(xs, mean))
    var = relax.op.mean(relax.op.multiply(centered, centered), axis=axes, keepdims=True)
    inv = relax.op.rsqrt(relax.op.add(var, relax.const(eps, xs.ty.dtype)))
    return relax.Tuple([y, mean, bb.emit(inv)])


def _group_norm(bb, inputs, attrs, ctx, per_group: bool):
    """GroupNormalization as a layer norm over each group's row ``[N, G, C/G * spatial]``
    (onnxc's row kernel: ``cpu.row_reduction``, vector partial sums, a symbolic row too),
    then the per-channel affine: TVM's group_norm reduces over (C/G, *spatial) axes at
    once, which no CPU rule takes (2.5x onnxruntime static, 1000x over a symbolic image).
    ``per_group``: opset 18's scale / bias, one value per group (repeated per channel)."""
    x, scale, bias = inputs[:3]
    shape = list(x.ty.shape.values) if getattr(x.ty, "shape", None) is not None else None
    groups = int(attrs["num_groups"])
    if shape is None or len(shape) < 2 or not isinstance(shape[1], tvm.tirx.IntImm):
        refuse(ctx, "an input without a static channel count")
    channels = int(shape[1])
    if groups <= 0 or channels % groups:
        refuse(ctx, f"num_groups={groups} with {channels} channels (must divide them)")
    stash = int(attrs.get("stash_type", 1))
    dtype = str(x.ty.dtype)
    if stash != 1 and dtype != "float32":
        refuse(ctx, f"stash_type={stash} on {dtype} (only float32 statistics)")
    xs = relax.op.astype(x, "float32") if dtype != "float32" else x
    row = channels // groups
    for d in shape[2:]:
        row = row * d
    row = tvm.tirx.const(int(row), "int64") if isinstance(row, int) else row
    rows = bb.normalize(relax.op.reshape(xs, relax.ShapeExpr([shape[0], groups, row])))
    eps = float(attrs.get("epsilon", 1e-5))
    if isinstance(row, tvm.tirx.IntImm):
        n = int(row)
        y = relax.op.nn.layer_norm(rows, _const(np.ones(n, np.float32)),
                                   _const(np.zeros(n, np.float32)), axes=[-1], epsilon=eps)
    else:  # the row's ones / zeros unread (center / scale off: legalize_vector_math)
        feat = relax.ShapeExpr([row])
        y = relax.op.nn.layer_norm(rows, relax.op.ones(feat, "float32"),
                                   relax.op.zeros(feat, "float32"), axes=[-1],
                                   epsilon=eps, center=False, scale=False)
    y = relax.op.reshape(bb.normalize(y), relax.ShapeExpr(shape))
    affine = [channels] + [1] * (len(shape) - 2)

    def per_channel(v):
        v = relax.op.astype(v, "float32") if str(v.ty.dtype) != "float32" else v
        if per_group:
            v = relax.op.repeat(relax.op.reshape(v, [groups, 1]), channels // groups, axis=1)
        return relax.op.reshape(v, affine)
    y = relax.op.add(relax.op.multiply(y, per_channel(scale)), per_channel(bias))
    return relax.op.astype(y, dtype) if dtype != "float32" else y


@register("GroupNormalization", since=18, until=20, override=True)
def group_norm_18(bb, inputs, attrs, ctx):
    """GroupNormalization-18 (scale and bias per group): ``_group_norm``."""
    return _group_norm(bb, inputs, attrs, ctx, per_group=True)


@register("GroupNormalization", since=21, override=True)
def group_norm(bb, inputs, attrs, ctx):
    """GroupNormalization-21 (scale and bias per channel, statistics in float32):
    ``_group_norm``."""
    return _group_norm(bb, inputs, attrs, ctx, per_group=False)


@register("Conv", override=True)
def conv(bb, inputs, attrs, ctx):
    """Conv with auto_pad SAME_UPPER / SAME_LOWER as explicit ``pads`` (static spatial
    input), else TVM's converter as is.  TVM's converter turns SAME into a separate
    ``nn.pad`` of the activation before an unpadded conv: one more kernel and a padded copy
    per conv, which also ends NCHWc layout chains (EfficientNet-B0's SAME depthwise convs:
    a pad and two layout transforms around each).  The pads are the spec's: ceil(n / s)
    outputs, the odd pixel at the end (UPPER) or the start (LOWER)."""
    auto_pad = attr_text(attrs.get("auto_pad"), "NOTSET")
    values = getattr(getattr(inputs[0].ty, "shape", None), "values", None)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER") or values is None or not all(
            hasattr(v, "value") for v in values[2:]):
        return tvm_converter("Conv")(bb, inputs, attrs, ctx)
    spatial = [int(v.value) for v in values[2:]]
    k = len(spatial)
    kernel = [int(v) for v in attrs.get("kernel_shape", static_dims(inputs[1], ctx)[2:])]
    strides = [int(v) for v in attrs.get("strides", [1] * k)]
    dil = [int(v) for v in attrs.get("dilations", [1] * k)]
    begin, end = [], []
    for n, kk, s, d in zip(spatial, kernel, strides, dil):
        total = max((-(-n // s) - 1) * s + (kk - 1) * d + 1 - n, 0)
        lo = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        begin.append(lo)
        end.append(total - lo)
    explicit = {a: v for a, v in attrs.items() if a != "auto_pad"}
    explicit["pads"] = begin + end
    return tvm_converter("Conv")(bb, inputs, explicit, ctx)


@register("ConvTranspose", override=True)
def conv_transpose(bb, inputs, attrs, ctx):
    """ConvTranspose with the output_shape attribute (TVM ignores it), as the reference:
    pads from output_shape under auto_pad SAME_UPPER/SAME_LOWER, else the pads given (0 by
    default); output pixel o reads the unpadded full result at o + pad_begin, zero where
    that falls outside it; the bias is added everywhere.  Without output_shape: TVM's."""
    if "output_shape" not in attrs:
        return tvm_converter("ConvTranspose")(bb, inputs, attrs, ctx)
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    dims = static_dims(x, ctx)
    k = len(dims) - 2
    out_shape = [int(v) for v in attrs["output_shape"]][-k:]
    strides = [int(v) for v in attrs.get("strides", [1] * k)]
    dilations = [int(v) for v in attrs.get("dilations", [1] * k)]
    kernel = [int(v) for v in attrs.get("kernel_shape", static_dims(w, ctx)[2:])]
    out_pad = [int(v) for v in attrs.get("output_padding", [0] * k)]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if "pads" in attrs or auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        begin = [int(v) for v in attrs.get("pads", [0] * 2 * k)][:k]
    else:
        total = [s * (n - 1) + op + (kk - 1) * d + 1 - o for s, n, op, kk, d, o in
                 zip(strides, dims[2:], out_pad, kernel, dilations, out_shape)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    full_attrs = {a: v for a, v in attrs.items()
                  if a not in ("output_shape", "pads", "output_padding", "auto_pad")}
    full = bb.normalize(tvm_converter("ConvTranspose")(bb, [x, w, None], full_attrs, ctx))
    full_dims = static_dims(full, ctx)[2:]
    lo = [max(b, 0) for b in begin]
    hi = [min(b + o, f) for b, o, f in zip(begin, out_shape, full_dims)]
    if any(h <= l for l, h in zip(lo, hi)):
        raise UnsupportedError(f"node {ctx.node.name!r} (ConvTranspose): output_shape "
                               f"{out_shape} with pads {begin} leaves no computed pixel")
    y = relax.op.strided_slice(full, axes=list(range(2, 2 + k)), begin=lo, end=hi)
    before = [max(-b, 0) for b in begin]
    after = [o - p - (h - l) for o, p, l, h in zip(out_shape, before, lo, hi)]
    if any(before) or any(after):
        y = relax.op.nn.pad(bb.normalize(y), [0, 0, 0, 0] + [v for pa in zip(before, after)
                                                            for v in pa])
    if bias is not None:
        y = relax.op.add(bb.normalize(y), relax.op.reshape(bias, [1, -1] + [1] * k))
    return y


@register("LpNormalization", since=1)
def lp_normalization(bb, inputs, attrs, ctx):
    """LpNormalization, p = 1 (sum of |x|) or 2 (Euclidean) along ``axis``; a zero norm
    gives 0 (as ONNX's reference and test data)."""
    x = inputs[0]
    float_only(ctx, x)
    dtype = dtype_of(x)
    axis = normalize_axis(ctx, int(attrs.get("axis", -1)), x.ty.ndim)
    p = int(attrs.get("p", 2))
    if p == 1:
        norm = relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True)
    elif p == 2:
        norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True))
    else:
        refuse(ctx, f"p={p} (1 or 2)")
    norm = bb.emit(norm)
    zero = scalar(0, dtype)
    is_zero = relax.op.equal(norm, zero)
    safe = relax.op.where(is_zero, scalar(1, dtype), norm)
    return relax.op.where(is_zero, zero, relax.op.divide(x, safe))


@register("Col2Im", since=18)
def col2im(bb, inputs, attrs, ctx):
    """Col2Im: sum the (N, C * prod(block), L) columns back into (N, C, *image_shape),
    with strides, dilations and pads; image_shape and block_shape must be constants."""
    from tvm import te, tirx

    x = inputs[0]
    dims = static_shape(x)
    image = int_values(ctx, inputs[1], "image_shape")
    block = int_values(ctx, inputs[2], "block_shape")
    nd = len(image)
    if len(dims) != 3 or len(block) != nd or nd == 0:
        refuse(ctx, f"input of shape {dims} with image_shape {image} and block_shape {block}")
    strides = list(attrs.get("strides", [1] * nd))
    dil = list(attrs.get("dilations", [1] * nd))
    pads = list(attrs.get("pads", [0] * (2 * nd)))
    if len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd or \
            min(strides + dil + block) < 1 or min(pads) < 0:
        refuse(ctx, f"strides={strides}, dilations={dil}, pads={pads} for {nd} spatial axes")
    ksize = int(np.prod(block))
    nblocks = [(image[i] + pads[i] + pads[i + nd] - dil[i] * (block[i] - 1) - 1) // strides[i]
               + 1 for i in range(nd)]
    if dims[1] % ksize or min(nblocks) < 1 or int(np.prod(nblocks)) != dims[2]:
        refuse(ctx, f"input of shape {dims}: expects C * {ksize} rows and "
                f"{int(np.prod(nblocks))} blocks {nblocks}")
    n, channels = dims[0], dims[1] // ksize
    offsets = list(itertools.product(*[range(b) for b in block]))

    def compute(t):
        def value(b, c, *pos):
            acc = tirx.const(0, t.dtype)
            for k, off in enumerate(offsets):
                ok, flat = None, None
                for i in range(nd):
                    q = pos[i] + pads[i] - off[i] * dil[i]
                    idx = tirx.floordiv(q, strides[i])
                    cond = tirx.all(q >= 0, tirx.floormod(q, strides[i]) == 0,
                                    idx < nblocks[i])
                    ok = cond if ok is None else tirx.all(ok, cond)
                    flat = idx if flat is None else flat * nblocks[i] + idx
                flat = tirx.max(tirx.min(flat, dims[2] - 1), 0)
                acc = acc + tirx.Select(ok, t[b, c * ksize + k, flat], tirx.const(0, t.dtype))
            return acc

        return te.compute([n, channels] + image, value, name="col2im")

    return bb.emit_te(compute, x, primfunc_name_hint="col2im")


# --------------------------------------------------------------------------- #
# DeformConv (opset 19+)
# --------------------------------------------------------------------------- #

# onnxc's DeformConv converter (opset 19+): a 2-D convolution whose kernel taps sample the
# input at learned fractional offsets.
#
# ``deform_conv(X, W, offset, B, mask) => matmul(W, deformed_columns(X, offset, mask)) + B``:
# a TE compute gathers, for every input channel, kernel tap and output position, the input
# bilinearly interpolated at the tap's offset position (zero outside the image), times the
# mask; a grouped matmul with the weights then sums over channels and taps.  This follows
# ONNX's reference (``onnx/reference/ops/op_deform_conv.py``: GridSample, bilinear,
# ``align_corners=1``, zero padding), which implements 2-D only; other ranks are refused.
# For float16 the reference rounds every product and partial sum to float16; onnxc rounds the
# sampled values to float16 but sums them in the matmul (accumulated in float32), which is
# closer to the exact result and may differ from the reference by a few float16 ulps.


def _ints(attrs, name: str, default: list[int]) -> list[int]:
    value = attrs.get(name)
    return [int(v) for v in value] if value is not None else list(default)


@register("DeformConv", since=19)
def deform_conv(bb, inputs, attrs, ctx):
    """DeformConv over (N, C, H, W): bilinear sampling at ``offset`` (optional ``mask``),
    ``group``, ``offset_group``, ``pads``, ``strides``, ``dilations``, optional bias."""
    from tvm import te, tirx

    x, w, offset = inputs[0], inputs[1], inputs[2]
    bias = inputs[3] if len(inputs) > 3 else None
    mask = inputs[4] if len(inputs) > 4 else None
    dtype = dtype_of(x)
    if not is_float(dtype) or dtype == "bfloat16":
        refuse(ctx, f"X of type {dtype}")
    others = [t for t in (w, offset, bias, mask) if t is not None]
    if any(dtype_of(t) != dtype for t in others):
        refuse(ctx, f"inputs of mixed types ({[dtype_of(t) for t in [x] + others]})")
    xd, wd, od = static_shape(x), static_shape(w), static_shape(offset)
    if len(xd) != 4:
        refuse(ctx, f"X of shape {xd} (only 2-D deformable convolution, as ONNX's reference)")
    n, channels, height, width = xd
    oc, cg = wd[0], wd[1]
    kh, kw = _ints(attrs, "kernel_shape", wd[2:])
    if [kh, kw] != wd[2:]:
        refuse(ctx, f"kernel_shape {[kh, kw]} with weights of shape {wd}")
    group = int(attrs.get("group", 1))
    og = int(attrs.get("offset_group", 1))
    sh, sw = _ints(attrs, "strides", [1, 1])
    dh, dw = _ints(attrs, "dilations", [1, 1])
    pads = _ints(attrs, "pads", [0, 0, 0, 0])
    if group < 1 or og < 1 or channels != cg * group or oc % group or channels % og:
        refuse(ctx, f"X of shape {xd} with W of shape {wd}, group={group}, "
                     f"offset_group={og}")
    oh = (height + pads[0] + pads[2] - ((kh - 1) * dh + 1)) // sh + 1
    ow = (width + pads[1] + pads[3] - ((kw - 1) * dw + 1)) // sw + 1
    if od != [n, og * kh * kw * 2, oh, ow]:
        refuse(ctx, f"offset of shape {od} (expected {[n, og * kh * kw * 2, oh, ow]} from "
                     "the kernel, pads, strides and dilations)")
    if mask is not None and static_shape(mask) != [n, og * kh * kw, oh, ow]:
        refuse(ctx, f"mask of shape {static_shape(mask)} (expected {[n, og * kh * kw, oh, ow]})")
    if bias is not None and static_shape(bias) != [oc]:
        refuse(ctx, f"B of shape {static_shape(bias)} (expected {[oc]})")
    per_og = channels // og
    # the reference's sampling positions go through float32 (GridSample's coordinates)
    cdt = "float64" if dtype == "float64" else "float32"

    def columns(data, off, *maybe_mask):
        def value(b, c, ky, kx, i, j):
            g = c // per_og
            tap = (g * kh + ky) * kw + kx
            y = tirx.Cast(cdt, i * sh - pads[0] + ky * dh) + tirx.Cast(cdt, off[b, tap * 2, i, j])
            xx = tirx.Cast(cdt, j * sw - pads[1] + kx * dw) + \
                tirx.Cast(cdt, off[b, tap * 2 + 1, i, j])
            y0f, x0f = tirx.floor(y), tirx.floor(xx)
            ly, lx = tirx.Cast(dtype, y - y0f), tirx.Cast(dtype, xx - x0f)
            y0, x0 = tirx.Cast("int64", y0f), tirx.Cast("int64", x0f)

            def pixel(yy, xq):
                # a neighbour outside the image is onnxruntime's ``0 * X[b, c, 0, 0]``
                # (its plan keeps index 0 with weight 0): 0, or NaN where that pixel is
                # NaN / Inf, as the reference's zero would not be
                inside = tirx.all(yy >= 0, yy < height, xq >= 0, xq < width)
                yc = tirx.max(tirx.min(yy, height - 1), 0)
                xc = tirx.max(tirx.min(xq, width - 1), 0)
                corner = data[b, c, 0, 0]
                # 0 * corner written out: TVM's simplifier folds a product by 0 to 0
                # (copysign in cdt: LLVM has no float16 copysign intrinsic here)
                signed_zero = tirx.Cast(dtype, tirx.copysign(tirx.const(0, cdt),
                                                             tirx.Cast(cdt, corner)))
                zero_times = tirx.Select(tirx.isfinite(corner), signed_zero,
                                         tirx.const(float("nan"), dtype))
                return tirx.Select(inside, data[b, c, yc, xc], zero_times)

            one = tirx.const(1, dtype)
            top = (one - lx) * pixel(y0, x0) + lx * pixel(y0, x0 + 1)
            bottom = (one - lx) * pixel(y0 + 1, x0) + lx * pixel(y0 + 1, x0 + 1)
            v = (one - ly) * top + ly * bottom
            if maybe_mask:
                v = v * maybe_mask[0][b, tap, i, j]
            return v

        return te.compute([n, channels, kh, kw, oh, ow], value, name="deform_columns")

    args = [x, offset] + ([mask] if mask is not None else [])
    cols = bb.emit_te(columns, *args, primfunc_name_hint="deform_columns")
    cols = relax.op.reshape(cols, [n, group, cg * kh * kw, oh * ow])
    wmat = relax.op.reshape(w, [1, group, oc // group, cg * kh * kw])
    out = relax.op.reshape(bb.emit(relax.op.matmul(wmat, cols)), [n, oc, oh, ow])
    if bias is not None:
        out = relax.op.add(out, relax.op.reshape(bias, [1, oc, 1, 1]))
    return out
