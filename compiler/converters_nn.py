"""onnxc's converters for neural-network ops TVM 0.27 lacks or gets wrong.

Attention (opset 23+), NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, ...  Each
follows the ONNX spec and its reference implementation (``onnx/reference/ops``) and refuses,
with an ``UnsupportedError`` naming the node and attribute, what it does not implement.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import helper
from tvm import relax

from . import legalize_reductions  # noqa: F401  (float max/min with +-inf identity)
from .errors import UnsupportedError
from .registry import register_op


def _register(op, since=1):
    return register_op("", op, since=since, implementation="onnxc")


def _refuse(ctx, what: str):
    node = ctx.node
    raise UnsupportedError(f"node {node.name!r} ({node.op_type}): {what} is not supported")


def _shape(x) -> list[int]:
    """Static shape of a tensor expression (ints)."""
    from tvm import tirx

    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        raise UnsupportedError("input shape is not known at compile time")
    return [int(v.value) for v in values]


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _scalar(value, dtype: str):
    """A rank-0 Relax constant of ``dtype`` holding ``value`` rounded as numpy would."""
    arr = np.array(value, dtype=_np_dtype(dtype))
    return relax.const(arr, dtype)


def _const(arr: np.ndarray):
    return relax.const(arr, str(arr.dtype))


def _dtype(x) -> str:
    return str(x.ty.dtype)


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def _is_neginf(bb, x):
    """x == -inf as a bool tensor (isinf and negative: no -inf comparison constant)."""
    return relax.op.logical_and(relax.op.isinf(x),
                                relax.op.less(x, _scalar(0, _dtype(x))))


def _safe_softmax(bb, x, axis=-1):
    """Softmax over ``axis`` as ONNX's reference computes it: a row whose maximum is -inf
    (fully masked) gives zeros, not NaN."""
    dtype = _dtype(x)
    zero, one = _scalar(0, dtype), _scalar(1, dtype)
    mx = bb.emit(relax.op.max(x, axis=[axis], keepdims=True))
    safe = relax.op.where(_is_neginf(bb, mx), zero, mx)
    tmp = bb.emit(relax.op.exp(relax.op.subtract(x, safe)))
    s = bb.emit(relax.op.sum(tmp, axis=[axis], keepdims=True))
    s = relax.op.where(relax.op.equal(s, zero), one, s)
    return bb.emit(relax.op.divide(tmp, s))


# --------------------------------------------------------------------------- #
# Attention (opset 23, 24, 25)
# --------------------------------------------------------------------------- #


@_register("Attention", since=23)
def attention(bb, inputs, attrs, ctx):
    """Scaled dot-product attention as in ONNX's reference: 3-D inputs with q_num_heads /
    kv_num_heads or 4-D, GQA/MQA (kv heads repeated), scale, is_causal (offset-aware),
    attn_mask (bool or additive; padded on the kv axis), past/present key and value,
    softcap, qk_matmul_output_mode 0-3, softmax_precision, nonpad_kv_seqlen and the
    sliding window (left/right_window_size); fully masked rows give 0."""
    node = ctx.node
    inputs = list(inputs) + [None] * (7 - len(inputs))
    q, k, v, mask, past_k, past_v, nonpad = inputs[:7]
    dtype = _dtype(q)
    if not _is_float(dtype):
        _refuse(ctx, f"input type {dtype}")
    rank = q.ty.ndim
    if rank not in (3, 4) or k.ty.ndim != rank or v.ty.ndim != rank:
        _refuse(ctx, f"Q/K/V of ranks {q.ty.ndim}/{k.ty.ndim}/{v.ty.ndim}")
    if (past_k is None) != (past_v is None):
        _refuse(ctx, "past_key without past_value (or the reverse)")
    if nonpad is not None and past_k is not None:
        _refuse(ctx, "nonpad_kv_seqlen together with past_key/past_value")
    q_heads = attrs.get("q_num_heads")
    kv_heads = attrs.get("kv_num_heads")
    left = int(attrs.get("left_window_size", -1))
    right = int(attrs.get("right_window_size", -1))
    if left < -1 or right < -1:
        _refuse(ctx, f"left_window_size={left} / right_window_size={right} (must be >= -1)")
    is_causal = bool(attrs.get("is_causal", 0))
    softcap = float(attrs.get("softcap", 0.0))
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        _refuse(ctx, f"attribute qk_matmul_output_mode={mode}")
    sm_precision = attrs.get("softmax_precision")
    if softcap > 0 and mode == 0 and len(node.output) > 3 and node.output[3]:
        # the spec says the raw QK product, ONNX's reference returns it after the softcap
        _refuse(ctx, "the qk_matmul_output output with qk_matmul_output_mode=0 and softcap "
                "(the spec and the reference implementation disagree)")
    if ctx.opset >= 25 and rank == 4 and (q_heads is not None or kv_heads is not None):
        _refuse(ctx, "q_num_heads/kv_num_heads with 4-D inputs")

    def to_4d(x, heads, what):
        b, s, hidden = _shape(x)
        if heads is None or heads <= 0 or hidden % heads:
            _refuse(ctx, f"3-D {what} of hidden size {hidden} with num_heads={heads}")
        x = relax.op.reshape(x, [b, s, heads, hidden // heads])
        return bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))

    if rank == 3:
        if q_heads is None or kv_heads is None:
            _refuse(ctx, "3-D inputs without q_num_heads and kv_num_heads")
        q = to_4d(q, int(q_heads), "Q")
        k = to_4d(k, int(kv_heads), "K")
        v = to_4d(v, int(kv_heads), "V")
    batch, hq, sq, dh = _shape(q)

    scale = attrs.get("scale")
    scale = 1.0 / np.sqrt(dh) if scale is None else float(scale)
    sqrt_scale = _scalar(np.sqrt(scale), dtype)

    if past_k is not None:
        k = bb.emit(relax.op.concat([past_k, k], axis=2))
        v = bb.emit(relax.op.concat([past_v, v], axis=2))
    present_k, present_v = k, v
    skv = _shape(k)[2]
    past_len = _shape(past_k)[2] if past_k is not None else 0

    # --- additive bias (None: no masking at all) ---------------------------------------
    neg_inf, zero = _scalar(-np.inf, dtype), _scalar(0, dtype)
    bias = None
    if mask is not None:
        mshape = _shape(mask)
        mdtype = _dtype(mask)
        pad = skv - mshape[-1]
        if pad < 0:
            _refuse(ctx, f"attn_mask of kv length {mshape[-1]} > {skv}")
        if pad > 0:
            fill = np.zeros(mshape[:-1] + [pad], dtype=bool) if mdtype == "bool" else \
                np.full(mshape[:-1] + [pad], -np.inf, dtype=_np_dtype(mdtype))
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
            return _const(np.where(allowed_np_fn(diff), 0, -np.inf).astype(_np_dtype(dtype)))
        offs = relax.op.subtract(relax.op.reshape(relax.op.astype(nonpad, "int64"),
                                                  [batch, 1, 1]),
                                 _scalar(sq, "int64"))
        diff = relax.op.subtract(relax.op.add(_const(i_idx), offs), _const(j_idx))
        allowed = allowed_relax_fn(bb.emit(diff))
        out = relax.op.where(allowed, zero, neg_inf)
        return bb.emit(relax.op.reshape(out, [batch, 1, sq, skv]))

    def add_bias(b, extra):
        return extra if b is None else bb.emit(relax.op.add(b, extra))

    if is_causal:
        bias = add_bias(bias, frontier(lambda d: d >= 0,
                                       lambda d: relax.op.greater_equal(d, _scalar(0, "int64"))))
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
                ok = relax.op.less_equal(d, _scalar(left, "int64"))
            if right >= 0:
                r = relax.op.greater_equal(d, _scalar(-right, "int64"))
                ok = r if ok is None else relax.op.logical_and(ok, r)
            return ok

        bias = add_bias(bias, frontier(np_rule, relax_rule))
    if nonpad is not None:
        valid = relax.op.less(_const(np.arange(skv, dtype=np.int64).reshape(1, skv)),
                              relax.op.reshape(relax.op.astype(nonpad, "int64"), [batch, 1]))
        pad_bias = relax.op.reshape(relax.op.where(valid, zero, neg_inf), [batch, 1, 1, skv])
        bias = add_bias(bias, bb.emit(pad_bias))

    # --- GQA / MQA ------------------------------------------------------------------
    hk, hv = _shape(k)[1], _shape(v)[1]
    if hk != hv:
        _refuse(ctx, f"K with {hk} heads and V with {hv} heads")
    if hq != hk:
        if hq % hk:
            _refuse(ctx, f"{hq} query heads over {hk} key/value heads (not a multiple)")
        k = bb.emit(relax.op.repeat(k, hq // hk, axis=1))
        v = bb.emit(relax.op.repeat(v, hq // hk, axis=1))

    # --- scores ---------------------------------------------------------------------
    qs = relax.op.multiply(q, sqrt_scale)
    kt = relax.op.multiply(relax.op.permute_dims(k, [0, 1, 3, 2]), sqrt_scale)
    qk = bb.emit(relax.op.matmul(bb.emit(qs), bb.emit(kt)))
    qk_out = qk
    if softcap > 0:
        cap = _scalar(softcap, dtype)
        qk = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(qk, cap)), cap))
        if mode == 1:
            qk_out = qk
    scores = qk if bias is None else bb.emit(relax.op.add(qk, bias))
    if mode == 2:
        qk_out = scores
    if sm_precision is not None:
        sm_dtype = helper.tensor_dtype_to_np_dtype(int(sm_precision))
        sm_dtype = "bfloat16" if "bfloat16" in str(sm_dtype) else np.dtype(sm_dtype).name
        if not _is_float(sm_dtype):
            _refuse(ctx, f"attribute softmax_precision={sm_precision}")
        if sm_dtype != dtype:
            scores = bb.emit(relax.op.astype(scores, sm_dtype))
    probs = _safe_softmax(bb, scores)
    if bias is not None:
        # fully masked rows (decided on the bias, as the reference does) give 0
        row_max = bb.emit(relax.op.max(bias, axis=[-1], keepdims=True))
        probs = bb.emit(relax.op.where(_is_neginf(bb, row_max),
                                       _scalar(0, _dtype(probs)), probs))
    if mode == 3:
        qk_out = probs
    if _dtype(probs) != dtype:
        probs = bb.emit(relax.op.astype(probs, dtype))
    if _dtype(qk_out) != dtype:
        qk_out = bb.emit(relax.op.astype(qk_out, dtype))
    y = bb.emit(relax.op.matmul(probs, v))
    if rank == 3:
        b_, h_, s_, d_ = _shape(y)
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
        _refuse(ctx, f"attribute reduction={r!r}")
    return r


def _nll(bb, ctx, logp, target, weight, attrs):
    """ONNX's NLL of log-probabilities ``logp`` (N, C, d...) at ``target`` (N, d...)."""
    reduction = _reduction(ctx, attrs)
    dtype = _dtype(logp)
    if not _is_float(dtype):
        _refuse(ctx, f"input type {dtype}")
    shape = _shape(logp)
    if len(shape) < 2:
        _refuse(ctx, f"input of rank {len(shape)} (must be >= 2)")
    tshape = _shape(target)
    if tshape != [shape[0]] + shape[2:]:
        _refuse(ctx, f"target of shape {tshape} for input of shape {shape}")
    n_classes = shape[1]
    tdtype = _dtype(target)
    ii = attrs.get("ignore_index")
    # indices clipped into [0, C): an ignored (or out-of-range ignore_index) target reads
    # some class, and its loss is then replaced by 0
    safe = relax.op.minimum(relax.op.maximum(target, _scalar(0, tdtype)),
                            _scalar(n_classes - 1, tdtype))
    safe = bb.emit(relax.op.astype(safe, "int64") if tdtype != "int64" else safe)
    picked = relax.op.gather_elements(logp, relax.op.expand_dims(safe, 1), axis=1)
    loss = bb.emit(relax.op.negative(relax.op.squeeze(picked, [1])))
    zero = _scalar(0, dtype)
    keep = None
    if ii is not None:
        keep = bb.emit(relax.op.not_equal(target, _scalar(int(ii), tdtype)))
        loss = bb.emit(relax.op.where(keep, loss, zero))
    w = None
    if weight is not None:
        w = relax.op.take(weight, safe, axis=0)
        if _dtype(weight) != dtype:
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
        return relax.op.divide(total, _scalar(int(np.prod(tshape)), dtype))
    # mean: divided by the sum of the weights applied (ignored targets weigh 0)
    return relax.op.divide(total, relax.op.sum(w))


@_register("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(bb, inputs, attrs, ctx):
    """NegativeLogLikelihoodLoss: reduction none/sum/mean, optional weight, ignore_index,
    inputs (N, C) or (N, C, d1, ..., dk)."""
    inputs = list(inputs) + [None] * (3 - len(inputs))
    return _nll(bb, ctx, inputs[0], inputs[1], inputs[2], attrs)


@_register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(bb, inputs, attrs, ctx):
    """SoftmaxCrossEntropyLoss: NLL of log_softmax over axis 1; reduction none/sum/mean,
    weight, ignore_index, N-d inputs, and the optional log_prob output."""
    inputs = list(inputs) + [None] * (3 - len(inputs))
    x = inputs[0]
    if not _is_float(_dtype(x)) or x.ty.ndim < 2:
        _refuse(ctx, f"input of type {_dtype(x)} and rank {x.ty.ndim}")
    logp = bb.emit(relax.op.nn.log_softmax(x, axis=1))
    loss = _nll(bb, ctx, logp, inputs[1], inputs[2], attrs)
    outs = [o for o in ctx.node.output]
    if len(outs) > 1:
        return relax.Tuple([loss, logp])
    return loss


# --------------------------------------------------------------------------- #
# RMSNormalization (23+) over every axis
# --------------------------------------------------------------------------- #


@_register("RMSNormalization", since=23)
def rms_normalization(bb, inputs, attrs, ctx):
    """RMSNormalization; over all axes (axis 0 or -rank) decomposed as the reference
    computes it, x / sqrt(mean(x^2) + epsilon) * scale in the stash type, because TVM
    0.27's rms_norm kernel fails to build there ("Tensor dimension mismatch in read").
    Other axes: TVM's."""
    from .registry import tvm_converter

    x, scale = inputs[0], inputs[1]
    ndim = x.ty.ndim
    axis = int(attrs.get("axis", -1))
    if (axis + ndim if axis < 0 else axis) != 0:
        return tvm_converter("RMSNormalization")(bb, inputs, attrs, ctx)
    if int(attrs.get("stash_type", 1)) != 1:
        _refuse(ctx, f"attribute stash_type={attrs.get('stash_type')}")
    dtype = _dtype(x)
    xs = relax.op.astype(x, "float32") if dtype != "float32" else x
    ws = relax.op.astype(scale, "float32") if _dtype(scale) != "float32" else scale
    xs = bb.emit(xs)
    ms = relax.op.mean(relax.op.multiply(xs, xs), axis=list(range(ndim)), keepdims=True)
    eps = _scalar(float(attrs.get("epsilon", 1e-5)), "float32")
    inv = bb.emit(relax.op.divide(_scalar(1, "float32"), relax.op.sqrt(relax.op.add(ms, eps))))
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
    auto_pad = _text(attrs.get("auto_pad"), "NOTSET")
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
            _refuse(ctx, f"attribute auto_pad={auto_pad!r}")
        out.append(o)
    return kernel, strides, dil, begin, out


@_register("MaxPool", since=8)
def max_pool(bb, inputs, attrs, ctx):
    """MaxPool; with the Indices output requested, one TE argmax reduction gives both the
    maximum and its flat index into the input (n, c, then row-major over the spatial
    axes, or column-major for storage_order=1), the first maximum winning ties as in the
    reference.  One output: TVM's."""
    from tvm import te, tirx

    from .registry import tvm_converter

    node = ctx.node
    if len(node.output) < 2 or not node.output[1]:
        return tvm_converter("MaxPool")(bb, inputs, attrs, ctx)
    x = inputs[0]
    shape = _shape(x)
    dtype = _dtype(x)
    spatial = shape[2:]
    k = len(spatial)
    order = int(attrs.get("storage_order", 0))
    if order == 1 and k != 2:
        _refuse(ctx, f"storage_order=1 with {k} spatial axes")
    kernel, strides, dil, begin, out = _pool_geometry(ctx, attrs, spatial)
    lowest = -np.inf if _is_float(dtype) else np.iinfo(np.dtype(dtype)).min
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


@_register("MaxUnpool", since=9)
def max_unpool(bb, inputs, attrs, ctx):
    """MaxUnpool; with output_shape, as the reference: the values are scattered into the
    shape inferred from kernel, strides and pads (the indices index that shape), which is
    then placed at the origin of a zero tensor of output_shape.  Without it: TVM's."""
    from .converters import _static_value
    from .registry import tvm_converter

    if len(inputs) < 3 or inputs[2] is None:
        return tvm_converter("MaxUnpool")(bb, inputs, attrs, ctx)
    out_shape = _static_value(inputs[2])
    if out_shape is None:
        _refuse(ctx, "a non-constant output_shape input")
    out_shape = [int(v) for v in np.asarray(out_shape).reshape(-1)]
    y = bb.normalize(tvm_converter("MaxUnpool")(bb, [inputs[0], inputs[1], None], attrs, ctx))
    inferred = _shape(y)
    if len(out_shape) != len(inferred) or any(o < i for o, i in zip(out_shape, inferred)):
        _refuse(ctx, f"output_shape {out_shape} smaller than the unpooled shape {inferred}")
    if out_shape == inferred:
        return y
    return relax.op.nn.pad(y, [v for o, i in zip(out_shape, inferred) for v in (0, o - i)])


# --------------------------------------------------------------------------- #
# Resize: refuse what TVM 0.27's converter computes wrongly
# --------------------------------------------------------------------------- #


def _previous_converter(op: str):
    """The converter registered for ``op`` before this module (onnxc's or TVM's)."""
    from .registry import REGISTRY

    entries = REGISTRY.versions("", op)
    if not entries:
        raise KeyError(op)
    return entries[-1].converter


_resize_before = _previous_converter("Resize")


def _text(v, default):
    v = default if v is None else v
    return v.decode() if isinstance(v, bytes) else str(v)


@_register("Resize", since=10)
def resize(bb, inputs, attrs, ctx):
    """Resize (the converter before this one), refusing what TVM computes wrongly: TVM maps
    output to input coordinates with the size ratio ``in / out``, ONNX with the given
    ``scales`` (they differ when ``in * scale`` is not an integer), and in float32, so a
    nearest-mode sample that falls exactly halfway between two pixels may round the wrong
    way."""
    from fractions import Fraction

    from .converters import _static_value

    x = inputs[0]
    if ctx.opset < 11:
        scales, sizes = (inputs[1] if len(inputs) > 1 else None), None
    else:
        scales = inputs[2] if len(inputs) > 2 else None
        sizes = inputs[3] if len(inputs) > 3 else None
    axes = attrs.get("axes")
    policy = _text(attrs.get("keep_aspect_ratio_policy"), "stretch")
    in_shape = _shape(x)
    out_shape = None
    if axes is None and policy == "stretch":
        sv = None if scales is None else _static_value(scales)
        zv = None if sizes is None else _static_value(sizes)
        if sv is not None and sv.size == len(in_shape):
            for d, (n, s) in enumerate(zip(in_shape, sv.reshape(-1).tolist())):
                if Fraction(n) * Fraction(s) != int(Fraction(n) * Fraction(s)):
                    _refuse(ctx, f"attribute/input scales={sv.reshape(-1).tolist()} (axis {d}: "
                            f"{n} * {s} is not an integer; TVM would use the size ratio)")
            out_shape = [int(n * s) for n, s in zip(in_shape, sv.reshape(-1).tolist())]
        elif zv is not None and zv.size == len(in_shape):
            out_shape = [int(v) for v in zv.reshape(-1)]
    mode = _text(attrs.get("mode"), "nearest")
    coord = _text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    nearest = _text(attrs.get("nearest_mode"), "round_prefer_floor")
    if out_shape is not None and mode == "nearest" and nearest.startswith("round"):
        for d, (n, m) in enumerate(zip(in_shape, out_shape)):
            if n != m and m > 0 and not _tvm_nearest_agrees(n, m, coord, nearest):
                _refuse(ctx, f"mode=nearest with nearest_mode={nearest} and "
                        f"coordinate_transformation_mode={coord} from size {n} to {m} "
                        f"(axis {d}): an output falls exactly halfway between two inputs, "
                        "which TVM's float32 arithmetic does not round as ONNX")
    return _resize_before(bb, inputs, attrs, ctx)


def _tvm_nearest_agrees(n: int, m: int, coord: str, nearest: str) -> bool:
    """Whether TVM's float32 nearest-index computation (topi ``get_inx`` and
    ``get_closest_index``, with or without FMA contraction) gives ONNX's index for every
    output of an axis resized from ``n`` to ``m``.  Only exact ties can differ."""
    from fractions import Fraction

    half, r = Fraction(1, 2), Fraction(n, m)
    f32 = np.float32
    scale = f32(n) / f32(m)
    for o in range(m):
        if coord == "half_pixel" or (coord == "pytorch_half_pixel" and m > 1):
            exact = (o + half) * r - half
            a = f32(o) + f32(0.5)
            tvm = [f32(f32(a * scale) - f32(0.5)), f32(float(a) * float(scale) - 0.5)]
        elif coord == "pytorch_half_pixel":
            exact, tvm = Fraction(0), [f32(0)]
        elif coord == "asymmetric":
            exact, tvm = o * r, [f32(scale * f32(o))]
        elif coord == "tf_half_pixel_for_nn":
            exact, tvm = (o + half) * r, [f32((f32(o) + f32(0.5)) * scale)]
        elif coord == "align_corners":
            exact = Fraction(o * (n - 1), m - 1) if m > 1 else Fraction(0)
            tvm = [f32(f32(f32(n - 1) / f32(m - 1)) * f32(o))] if m > 1 else [f32(0)]
        else:
            return True  # not checked (tf_crop_and_resize depends on roi)
        if exact - (exact.numerator // exact.denominator) != half:
            continue  # not a tie: float error far below 1/2 cannot change the index
        want = math.floor(exact) if nearest == "round_prefer_floor" else math.ceil(exact)
        for t in tvm:
            got = math.ceil(t - f32(0.5)) if nearest == "round_prefer_floor" else \
                math.floor(t + f32(0.5))
            if got != want:
                return False
    return True


# --------------------------------------------------------------------------- #
# CumSum (11+), CumProd (26+)
# --------------------------------------------------------------------------- #


def _cumulative(kind: str):
    def convert(bb, inputs, attrs, ctx):
        """Cumulative sum/product along a constant axis; exclusive and reverse honoured.
        A TE reduction over the prefix (or suffix): out[i] = op(x[k] for k <= i)."""
        from tvm import te, tirx

        from .converters import _static_value

        x, axis_in = inputs[0], inputs[1]
        axis = _static_value(axis_in) if axis_in is not None else None
        if axis is None:
            _refuse(ctx, "a non-constant axis input")
        ndim = x.ty.ndim
        axis = int(np.asarray(axis).reshape(-1)[0])
        axis = axis + ndim if axis < 0 else axis
        if not 0 <= axis < ndim:
            _refuse(ctx, f"axis {axis} for an input of rank {ndim}")
        exclusive = bool(attrs.get("exclusive", 0))
        reverse = bool(attrs.get("reverse", 0))
        n = _shape(x)[axis]
        if n == 0:
            return x

        def compute(t):
            k = te.reduce_axis((0, n), name="k")
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


_register("CumSum", since=11)(_cumulative("sum"))
_register("CumProd", since=26)(_cumulative("prod"))
