"""onnxc's converters for ONNX Runtime's contrib operators (domain ``com.microsoft``, version 1).

What ``onnxruntime.transformers.optimizer`` emits for BERT / GPT-2 style models, as
onnxruntime's ContribOperators.md defines the ops and as onnxruntime 1.32 computes them
(the tests compare with it): SkipLayerNormalization, SkipSimplifiedLayerNormalization,
Gelu, FastGelu, BiasGelu, BiasAdd, QuickGelu, FusedMatMul, EmbedLayerNormalization,
Attention; then MultiHeadAttention, RotaryEmbedding and GroupQueryAttention.

Each op is written as the Relax ops our own recognition produces from the decomposed
form, so the fused ops reach the same kernels: layer norms become ``nn.layer_norm`` /
``nn.rms_norm`` (what ``passes/fuse_rms_norm.py`` makes), GELUs ``nn.gelu`` /
``nn.gelu_tanh`` (``passes/fuse_gelu.py``), and attention the exporters' chain
``softmax(Q @ K^T * scale + mask) @ V`` over (B, N, S, H) heads, which
``passes/fuse_attention.py`` turns into ``nn.attention`` when it is enabled.

Attributes and inputs onnxc does not reproduce are refused naming the node, the attribute
and its value (``refuse``): rotary inside Attention, shared past/present buffers, the
(3B+2) mask form, sliding windows, softcap, quantized KV caches, ...
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from .common import (attr_text, constant_value, dtype_of, is_float, refuse, scalar,
                     shape_of, static_shape)
from .quantization import dequantized, eight_bit, per_tensor, quantized
from .rnn import rotary_embedding
from ..registry import register_op

MS = "com.microsoft"

# onnxruntime's default for the additive mask (Attention, MultiHeadAttention)
MASK_FILTER_VALUE = -10000.0


def _register(op):
    return register_op(MS, op, since=1, implementation="onnxc")


def _pad(inputs, n):
    return list(inputs) + [None] * (n - len(inputs))


def _wants(ctx, k: int) -> bool:
    """Whether the node's output ``k`` is used (present and named)."""
    return len(ctx.node.output) > k and bool(ctx.node.output[k])


def _read(ctx, k: int) -> bool:
    """Whether the node's output ``k`` is named and also read by a node or returned (an
    exporter may name an optional output that nothing reads)."""
    return _wants(ctx, k) and (ctx.importer is None
                               or ctx.importer.is_read(ctx.node.output[k]))


def _float(ctx, x, what="input"):
    if not is_float(dtype_of(x)):
        refuse(ctx, f"{what} of type {dtype_of(x)}")


def _dims(ctx, x, what):
    try:
        return static_shape(x)
    except Exception:
        refuse(ctx, f"{what} of a shape not known at compile time")


def _shape(ctx, x, what) -> list:
    """Shape of ``x``: ints where static, TIR expressions where symbolic (a model exported
    with dynamic batch / sequence axes, compiled once for ranges of them)."""
    shape = shape_of(x)
    if shape is None:
        refuse(ctx, f"{what} of unknown shape")
    return shape


def _same(a, b) -> bool:
    """Two dims (ints or TIR expressions) provably equal (``shape_arith.provably_equal``)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    from tvm import tirx

    from ..shape_arith import provably_equal

    return provably_equal(*(tirx.const(v, "int64") if isinstance(v, int) else v for v in (a, b)))


def _arange(n, dtype="int32", start=0):
    """start .. start + n - 1: a constant where both are static, else a run-time range."""
    if isinstance(n, int) and isinstance(start, int):
        return relax.const(np.arange(start, start + n, dtype=dtype), dtype)
    return relax.op.arange(start, start + n, 1, dtype)


def _dim_tensor(v):
    """A 0-d int64 tensor of dim ``v`` (an int, or a TIR expression of symbolic dims)."""
    if isinstance(v, int):
        return relax.const(v, "int64")
    return relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([v])), [])


def _rank(ctx, x, what) -> int:
    """Rank of ``x``, static or symbolic dims alike."""
    ndim = getattr(x.ty, "ndim", -1)
    if ndim is None or ndim < 0:
        refuse(ctx, f"{what} of unknown rank")
    return int(ndim)


def _refuse_set(ctx, attrs, name, ok=lambda v: not v):
    """Refuse attribute ``name`` when it is set to a value ``ok`` rejects."""
    if name in attrs and not ok(attrs[name]):
        value = attrs[name]
        value = value.decode() if isinstance(value, bytes) else value
        refuse(ctx, f"attribute {name}={value!r}")


def _slice(x, axis: int, begin: int, end: int, step: int = 1):
    return relax.op.strided_slice(x, axes=[axis], begin=[begin], end=[end], strides=[step])


def _outputs(*items):
    return relax.Tuple(list(items)) if len(items) > 1 else items[0]


# --------------------------------------------------------------------------- #
# Layer norms
# --------------------------------------------------------------------------- #


def _skip_sum(bb, ctx, x, skip, bias):
    _float(ctx, x)
    rank = _rank(ctx, x, "input")
    if rank not in (2, 3):
        refuse(ctx, f"input of rank {rank} (2 or 3 expected)")
    s = relax.op.add(x, skip)
    if bias is not None:
        s = relax.op.add(s, bias)
    return bb.emit(s)


@_register("SkipLayerNormalization")
def skip_layer_normalization(bb, inputs, attrs, ctx):
    """layer_norm(input + skip [+ bias]) * gamma [+ beta]; the optional outputs mean and
    inv_std_var (shape (..., 1)) and input_skip_bias_sum."""
    x, skip, gamma, beta, bias = _pad(inputs, 5)[:5]
    eps = float(attrs.get("epsilon", 1e-12))
    s = _skip_sum(bb, ctx, x, skip, bias)
    dtype = dtype_of(x)
    if beta is None:
        beta = relax.const(np.zeros(_dims(ctx, gamma, "gamma"), dtype), dtype)
    y = relax.op.nn.layer_norm(s, gamma, beta, axes=[-1], epsilon=eps)
    mean = inv = None
    if _wants(ctx, 1) or _wants(ctx, 2):
        mean = bb.emit(relax.op.mean(s, axis=[-1], keepdims=True))
        centred = bb.emit(relax.op.subtract(s, mean))
        var = relax.op.mean(relax.op.multiply(centred, centred), axis=[-1], keepdims=True)
        inv = relax.op.rsqrt(relax.op.add(var, scalar(eps, dtype)))
    if len(ctx.node.output) == 1:
        return y
    # an output the node leaves unnamed gets the sum as a placeholder: nothing reads it
    return _outputs(y, s if mean is None else mean, s if inv is None else inv, s)


@_register("SkipSimplifiedLayerNormalization")
def skip_simplified_layer_normalization(bb, inputs, attrs, ctx):
    """rms_norm(input + skip [+ bias]) * gamma; the optional outputs inv_std_var and
    input_skip_bias_sum (onnxruntime does not compute ``mean``: refused)."""
    x, skip, gamma, bias = _pad(inputs, 4)[:4]
    eps = float(attrs.get("epsilon", 1e-12))
    if _read(ctx, 1):  # onnxscript's ORT fusions name it, unread
        refuse(ctx, "output 'mean' (onnxruntime leaves it uncomputed for the simplified norm)")
    s = _skip_sum(bb, ctx, x, skip, bias)
    y = relax.op.nn.rms_norm(s, gamma, axes=[-1], epsilon=eps)
    inv = s
    if _wants(ctx, 2):
        ms = relax.op.mean(relax.op.multiply(s, s), axis=[-1], keepdims=True)
        inv = relax.op.rsqrt(relax.op.add(ms, scalar(eps, dtype_of(x))))
    # outputs as SkipLayerNormalization's; ``mean`` (refused above when read) has the sum in its place
    return _outputs(y, s, inv, s) if len(ctx.node.output) > 1 else y


def simplified_layer_normalization(bb, inputs, attrs, ctx):
    """X * rsqrt(mean(X^2 over axes axis..-1) + epsilon) * scale (RMSNorm); the optional
    output inv_std_var (X's shape, 1 over the normalised axes).  stash_type 1 (the
    default) computes a float16 / bfloat16 X in float32, as onnxruntime does."""
    x, scale = _pad(inputs, 2)[:2]
    _float(ctx, x)
    rank = _rank(ctx, x, "input")
    axis = int(attrs.get("axis", -1))
    if not -rank <= axis < rank:
        refuse(ctx, f"axis {axis} for an input of rank {rank}")
    axes = list(range(axis % rank, rank))
    eps = float(attrs.get("epsilon", 1e-5))
    dtype = dtype_of(x)
    stash = "float32" if int(attrs.get("stash_type", 1)) == 1 and dtype != "float64" else dtype
    xs, gs = (x, scale) if stash == dtype else (bb.emit(relax.op.astype(x, stash)),
                                                bb.emit(relax.op.astype(scale, stash)))
    y = bb.emit(relax.op.nn.rms_norm(xs, gs, axes=axes, epsilon=eps))
    if stash != dtype:
        y = bb.emit(relax.op.astype(y, dtype))
    if not _wants(ctx, 1):
        return y if len(ctx.node.output) == 1 else _outputs(y, y)
    ms = relax.op.mean(relax.op.multiply(xs, xs), axis=axes, keepdims=True)
    return _outputs(y, bb.emit(relax.op.rsqrt(relax.op.add(ms, scalar(eps, stash)))))


# onnxruntime registers SimplifiedLayerNormalization in the default domain only (version 1;
# its optimizers write it there for T5 / LLaMA-style RMSNorms; the loader reads it
# leniently, ``lenient.ORT_DEFAULT_DOMAIN_OPS``).
register_op("", "SimplifiedLayerNormalization", since=1, implementation="onnxc")(
    simplified_layer_normalization)


@_register("QEmbedLayerNormalization")
def q_embed_layer_normalization(bb, inputs, attrs, ctx):
    """EmbedLayerNormalization of 8-bit tables (quantize_dynamic / quantize_static of an
    EmbedLayerNormalization model): input_ids, segment_ids, the word / position / segment
    embeddings, gamma and beta quantized, mask, then their five scales and five zero
    points (per tensor); the float op on the dequantized tables."""
    ins = _pad(inputs, 18)
    tables = []
    names = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")
    for k, what in enumerate(names):
        q, scale, zero = ins[2 + k], ins[8 + k], ins[13 + k]
        if q is None:
            tables.append(None)
            continue
        eight_bit(ctx, (q, what))
        per_tensor(ctx, (scale, f"{what}_scale"), (zero, f"{what}_zero_point"))
        tables.append(dequantized(bb, q, scale, zero, axis=0))
    return embed_layer_normalization(bb, ins[:2] + tables + [ins[7]], attrs, ctx)


@_register("EmbedLayerNormalization")
def embed_layer_normalization(bb, inputs, attrs, ctx):
    """layer_norm(word[input_ids] + position[position_ids or 0..S-1] [+ segment[segment_ids]]);
    mask_index = per row the count of ``mask`` entries equal to 1 (onnxruntime's
    ``count_if(v == 1)``: a 2 or a -1 counts nothing; zeros without a mask); embedding_sum.

    Ids out of a table's range are clamped (onnxruntime raises an error instead)."""
    (ids, seg_ids, word, pos_table, seg_table, gamma, beta, mask,
     pos_ids) = _pad(inputs, 9)[:9]
    eps = float(attrs.get("epsilon", 1e-12))
    _refuse_set(ctx, attrs, "mask_index_type", lambda v: int(v) in (0, 1))
    if int(attrs.get("mask_index_type", 1)) == 0 and _wants(ctx, 1):
        refuse(ctx, "output mask_index with attribute mask_index_type=0")
    _float(ctx, word, "word_embedding")
    b, s = _shape(ctx, ids, "input_ids")
    emb = relax.op.take(word, ids, axis=0, mode="clip")
    if pos_ids is None and isinstance(s, int):
        positions = bb.emit(_slice(pos_table, 0, 0, s))                  # (S, H)
    elif pos_ids is None:  # a symbolic S: its range is capped at the table's rows
        from ..shape_arith import check_slice_bounds

        positions = bb.emit(check_slice_bounds(relax.op.strided_slice(
            pos_table, axes=[0], begin=[0], end=[s], strides=[1], assume_inbound=True),
            f"node {ctx.node.name!r} (EmbedLayerNormalization)"))
    else:
        positions = relax.op.take(pos_table, pos_ids, axis=0, mode="clip")
    emb = relax.op.add(emb, positions)
    if (seg_ids is None) != (seg_table is None):
        refuse(ctx, "segment_ids without segment_embedding (or the reverse)")
    if seg_ids is not None:
        emb = relax.op.add(emb, relax.op.take(seg_table, seg_ids, axis=0, mode="clip"))
    emb = bb.emit(emb)
    y = relax.op.nn.layer_norm(emb, gamma, beta, axes=[-1], epsilon=eps)
    if len(ctx.node.output) == 1:
        return y
    if mask is not None:
        ones = relax.op.equal(mask, relax.const(1, mask.ty.dtype))
        mask_index = relax.op.sum(relax.op.astype(ones, "int32"), axis=[1])
    elif isinstance(b, int):
        mask_index = relax.const(np.zeros([b], np.int32), "int32")
    else:
        mask_index = relax.op.zeros(relax.ShapeExpr([b]), "int32")
    return _outputs(y, mask_index, emb)


# --------------------------------------------------------------------------- #
# Activations and elementwise
# --------------------------------------------------------------------------- #


@_register("Gelu")
def gelu(bb, inputs, attrs, ctx):
    """x * 0.5 * (1 + erf(x / sqrt 2))"""
    _float(ctx, inputs[0])
    return relax.op.nn.gelu(inputs[0])


@_register("BiasGelu")
def bias_gelu(bb, inputs, attrs, ctx):
    """gelu(A + B) (erf form)"""
    _float(ctx, inputs[0])
    return relax.op.nn.gelu(bb.emit(relax.op.add(inputs[0], inputs[1])))


@_register("FastGelu")
def fast_gelu(bb, inputs, attrs, ctx):
    """gelu_tanh(X [+ bias]): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"""
    x, bias = _pad(inputs, 2)[:2]
    _float(ctx, x)
    if bias is not None:
        x = bb.emit(relax.op.add(x, bias))
    return relax.op.nn.gelu_tanh(x)


@_register("QuickGelu")
def quick_gelu(bb, inputs, attrs, ctx):
    """x * sigmoid(alpha * x), alpha 1.702 by default"""
    x = inputs[0]
    _float(ctx, x)
    alpha = float(attrs.get("alpha", 1.702))
    return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(x, scalar(alpha, dtype_of(x)))))


@_register("BiasAdd")
def bias_add(bb, inputs, attrs, ctx):
    """X + bias + skip"""
    x, bias, skip = inputs[0], inputs[1], inputs[2]
    return relax.op.add(relax.op.add(x, bias), skip)


@_register("FusedMatMul")
def fused_matmul(bb, inputs, attrs, ctx):
    """alpha * op(A) @ op(B), op = the transpose of the last two dims when transA / transB;
    transBatchA / transBatchB are refused."""
    a, b = inputs[0], inputs[1]
    _float(ctx, a, "A")
    for name in ("transBatchA", "transBatchB"):
        _refuse_set(ctx, attrs, name, lambda v: int(v) == 0)
    for x, flag, what in ((a, "transA", "A"), (b, "transB", "B")):
        if int(attrs.get(flag, 0)):
            rank = _rank(ctx, x, what)
            if rank < 2:
                refuse(ctx, f"{flag}=1 with {what} of rank {rank}")
    if int(attrs.get("transA", 0)):
        rank = _rank(ctx, a, "A")
        a = bb.emit(relax.op.permute_dims(a, list(range(rank - 2)) + [rank - 1, rank - 2]))
    if int(attrs.get("transB", 0)):
        rank = _rank(ctx, b, "B")
        b = bb.emit(relax.op.permute_dims(b, list(range(rank - 2)) + [rank - 1, rank - 2]))
    y = relax.op.matmul(a, b)
    alpha = float(attrs.get("alpha", 1.0))
    if alpha != 1.0:
        y = relax.op.multiply(bb.emit(y), scalar(alpha, dtype_of(a)))
    return y


# --------------------------------------------------------------------------- #
# What onnxruntime's graph optimizer writes (a model saved at ORT_ENABLE_EXTENDED)
# --------------------------------------------------------------------------- #


def _activation(ctx, y, name: str, params: dict):
    """onnxruntime's fused activation ``name`` (MLAS / ElementWiseRangedTransform) on ``y``;
    ``params``: alpha / beta / gamma as the op gives them (None: the default)."""
    dt = dtype_of(y)

    def p(key, default):
        v = params.get(key)
        return scalar(default if v is None else float(v), dt)

    if name == "":
        return y
    if name == "Relu":
        return relax.op.nn.relu(y)
    if name == "Sigmoid":
        return relax.op.sigmoid(y)
    if name == "Tanh":
        return relax.op.tanh(y)
    if name == "LeakyRelu":
        return relax.op.where(relax.op.less(y, scalar(0.0, dt)),
                              relax.op.multiply(y, p("alpha", 0.01)), y)
    if name == "Clip":
        lo = params.get("min", -math.inf)
        hi = params.get("max", math.inf)
        return relax.op.minimum(relax.op.maximum(y, scalar(lo, dt)), scalar(hi, dt))
    if name == "HardSigmoid":
        v = relax.op.add(relax.op.multiply(y, p("alpha", 0.2)), p("beta", 0.5))
        return relax.op.minimum(relax.op.maximum(v, scalar(0.0, dt)), scalar(1.0, dt))
    refuse(ctx, f"fused activation {name!r}")


@_register("FusedConv")
def fused_conv(bb, inputs, attrs, ctx):
    """activation(Conv(X, W, B) [+ Z]): onnxruntime's Conv + activation fusion (and its
    Conv + Add fusion: the optional 4th input Z is added before the activation).
    ``activation_params``: LeakyRelu's alpha; Clip's min, max; HardSigmoid's alpha, beta."""
    from .nn import conv

    x, w, b, z = _pad(inputs, 4)[:4]
    _float(ctx, x, "X")
    name = attr_text(attrs.get("activation"), "")
    values = [float(v) for v in attrs.get("activation_params", [])]
    keys = {"LeakyRelu": ("alpha",), "Clip": ("min", "max"),
            "HardSigmoid": ("alpha", "beta")}.get(name, ())
    if len(values) > len(keys):
        refuse(ctx, f"activation_params {values} for activation {name!r}")
    conv_attrs = {k: v for k, v in attrs.items() if k not in ("activation", "activation_params")}
    y = bb.emit(conv(bb, [x, w, b], conv_attrs, ctx))  # TVM reads inputs[2]: None or B
    if z is not None:
        y = bb.emit(relax.op.add(y, z))
    return _activation(ctx, y, name, dict(zip(keys, values)))


@_register("FusedGemm")
def fused_gemm(bb, inputs, attrs, ctx):
    """activation(Gemm(A, B, C)): onnxruntime's Gemm + activation fusion; the activation's
    parameters are the attributes ``activation_alpha`` / ``activation_beta`` /
    ``activation_gamma`` (LeakyRelu: alpha; HardSigmoid: alpha, beta)."""
    from ..registry import tvm_converter

    _float(ctx, inputs[0], "A")
    name = attr_text(attrs.get("activation"), "")
    params = {k[len("activation_"):]: v for k, v in attrs.items()
              if k.startswith("activation_")}
    known = {"LeakyRelu": {"alpha"}, "HardSigmoid": {"alpha", "beta"}}.get(name, set())
    extra = sorted(set(params) - known)
    if extra:
        refuse(ctx, f"attribute activation_{extra[0]} for activation {name!r}")
    if "leaky_relu_alpha" in attrs:  # the older spelling onnxruntime still reads
        params.setdefault("alpha", attrs["leaky_relu_alpha"])
    gemm_attrs = {k: v for k, v in attrs.items()
                  if k in ("alpha", "beta", "transA", "transB")}
    y = bb.emit(tvm_converter("Gemm")(bb, inputs, gemm_attrs, ctx))
    return _activation(ctx, y, name, params)


@_register("RotaryEmbedding")
def ms_rotary_embedding(bb, inputs, attrs, ctx):
    """RoPE on (B, S, N*H) or (B, N, S, H); position_ids (B, S), or (1,): the offset of
    position 0; interleaved or half-split pairs; partial rotation (rotary_embedding_dim).
    is_packed_batching and a scale other than 1 are refused."""
    x, pos, cos, sin = inputs[0], inputs[1], inputs[2], inputs[3]
    _refuse_set(ctx, attrs, "is_packed_batching", lambda v: int(v) == 0)
    _refuse_set(ctx, attrs, "scale", lambda v: float(v) == 1.0)
    shape = _dims(ctx, x, "input")
    half = _dims(ctx, cos, "cos_cache")[-1]
    attrs = dict(attrs)
    rd = int(attrs.get("rotary_embedding_dim", 0))
    if len(shape) == 3 and int(attrs.get("num_heads", 0)) <= 0:
        if rd:
            refuse(ctx, f"rotary_embedding_dim={rd} without num_heads")
        if shape[2] % (2 * half):
            refuse(ctx, f"hidden size {shape[2]} with cos_cache of last dimension {half}")
        attrs["num_heads"] = shape[2] // (2 * half)   # head size = 2 * cos_cache's width
    elif not rd:
        attrs["rotary_embedding_dim"] = 2 * half
    pos = _positions(bb, ctx, pos, shape[0], shape[1] if len(shape) == 3 else shape[2])
    return rotary_embedding(bb, [x, cos, sin, pos], attrs, ctx)


def _positions(bb, ctx, pos, b, s):
    """(B, S) int64 positions from position_ids of shape (B, S), or (1,): an offset."""
    pshape = _shape(ctx, pos, "position_ids")
    pos = relax.op.astype(pos, "int64")
    if pshape in ([1], []):
        steps = relax.op.reshape(_arange(s, "int64"), [1, s])
        return bb.emit(relax.op.add(relax.op.reshape(pos, [1, 1]), steps))
    if len(pshape) != 2 or not _same(pshape[1], s) or not (_same(pshape[0], 1)
                                                          or _same(pshape[0], b)):
        refuse(ctx, f"position_ids of shape {pshape} (({b}, {s}) or (1,) expected)")
    return bb.emit(pos)


# --------------------------------------------------------------------------- #
# Attention
# --------------------------------------------------------------------------- #


def _heads(bb, x, b, s, n, h):
    """(B, S, N*H) -> (B, N, S, H), as exporters write it (reshape, transpose)."""
    return bb.emit(relax.op.permute_dims(relax.op.reshape(x, [b, s, n, h]), [0, 2, 1, 3]))


def _keep_from_mask(bb, ctx, mask, b, s, t, what: str):
    """A bool ``keep`` broadcastable to (B, 1|N, S, T) from onnxruntime's mask forms:
    (B) lengths (right padding), (2B) ends then starts, (B, T) raw, (B, S, T) raw.  The
    (B, 1, M, M) form is refused: onnxruntime's CPU kernel refuses it too, so there is
    nothing to check a conversion against."""
    mshape = _shape(ctx, mask, what)
    cols = relax.op.reshape(_arange(t), [1, 1, 1, t])
    if len(mshape) == 1 and (_same(mshape[0], b) or _same(mshape[0], 2 * b)):
        m = relax.op.astype(mask, "int32")
        end = relax.op.reshape(_slice(m, 0, 0, b), [b, 1, 1, 1])
        keep = relax.op.less(cols, end)
        if not _same(mshape[0], b):
            start = relax.op.reshape(_slice(m, 0, b, 2 * b), [b, 1, 1, 1])
            keep = relax.op.logical_and(keep, relax.op.greater_equal(cols, start))
        return bb.emit(keep)

    def shaped(*want):
        return len(mshape) == len(want) and all(_same(a, w) for a, w in zip(mshape, want))

    raw = None
    if shaped(b, t):
        raw = relax.op.reshape(mask, [b, 1, 1, t])
    elif shaped(b, s, t):
        raw = relax.op.reshape(mask, [b, 1, s, t])
    if raw is None:
        refuse(ctx, f"{what} of shape {mshape} (with batch {b}, sequence {s}, total "
                    f"sequence {t}: (B), (2B), (B, T) or (B, S, T) expected)")
    return bb.emit(relax.op.greater(raw, relax.const(0, dtype_of(mask))))


def _causal_keep(s, t, past):
    """(1, 1, S, T): key t visible from query s when t <= past + s."""
    if all(isinstance(v, int) for v in (s, t, past)):
        rows = np.arange(s).reshape(s, 1) + past
        return relax.const((np.arange(t).reshape(1, t) <= rows).reshape(1, 1, s, t))
    rows = relax.op.reshape(_arange(s, start=past), [1, 1, s, 1])
    return relax.op.less_equal(relax.op.reshape(_arange(t), [1, 1, 1, t]), rows)


def _additive_mask(bb, dtype, keeps, bias, filter_value):
    """0 where every ``keep`` holds, else ``filter_value``; plus ``bias`` (attention_bias)."""
    add = None
    if keeps:
        keep = keeps[0]
        for k in keeps[1:]:
            keep = relax.op.logical_and(keep, k)
        add = bb.emit(relax.op.where(keep, scalar(0.0, dtype), scalar(filter_value, dtype)))
    if bias is not None:
        add = bias if add is None else bb.emit(relax.op.add(add, bias))
    return add


def _sdpa(bb, q, k, v, scale, mask, dtype):
    """softmax(Q @ K^T * scale [+ mask]) @ V over (B, N, S, H) heads -> (B, N, S, Hv): the
    chain ``passes/fuse_attention.py`` matches."""
    rank = 4
    kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
    scores = bb.emit(relax.op.matmul(q, kt))
    scores = bb.emit(relax.op.multiply(scores, scalar(scale, dtype)))
    if mask is not None:
        scores = bb.emit(relax.op.add(scores, mask))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=rank - 1))
    return bb.emit(relax.op.matmul(probs, v))


def _merge_heads(bb, o, b, s, n, h):
    """(B, N, S, H) -> (B, S, N*H)"""
    return relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), [b, s, n * h])


def _stack2(a, c):
    return relax.op.concat([relax.op.expand_dims(a, 0), relax.op.expand_dims(c, 0)], axis=0)


def _projection(bb, x, w, bias, begin, end):
    """x @ W[:, begin:end] (+ bias[begin:end]), slicing a constant W at compile time."""
    wv, bv = constant_value(w), None if bias is None else constant_value(bias)
    if wv is not None:
        y = relax.op.matmul(x, relax.const(np.ascontiguousarray(wv[:, begin:end])))
    else:
        y = relax.op.matmul(x, _slice(w, 1, begin, end))
    if bias is not None:
        bias = relax.const(np.ascontiguousarray(bv[begin:end])) if bv is not None else \
            _slice(bias, 0, begin, end)
        y = relax.op.add(bb.emit(y), bias)
    return bb.emit(y)


@_register("Attention")
def attention(bb, inputs, attrs, ctx):
    """Multi-head self-attention with packed Q/K/V weights (input_hidden, Dq + Dk + Dv),
    optional bias, mask_index ((B), (2B), (B, T), (B, S, T)), past
    (2, B, N, P, H) with output present, attention_bias, unidirectional, scale,
    qkv_hidden_sizes, mask_filter_value.  Refused: do_rotary, past_present_share_buffer,
    past_sequence_length, mask_index (3B+2) and (B, 1, M, M)."""
    x, w, bias, mask, past, attn_bias, past_len = _pad(inputs, 7)[:7]
    _float(ctx, x)
    _refuse_set(ctx, attrs, "do_rotary", lambda v: int(v) == 0)
    _refuse_set(ctx, attrs, "past_present_share_buffer", lambda v: int(v) == 0)
    if past_len is not None:
        refuse(ctx, "input past_sequence_length (shared past/present buffers)")
    n = int(attrs.get("num_heads", 0))
    b, s, din = _shape(ctx, x, "input")
    wshape = _dims(ctx, w, "weights")
    sizes = [int(v) for v in attrs.get("qkv_hidden_sizes", [])]
    if not sizes:
        if wshape[1] % 3:
            refuse(ctx, f"weights of shape {wshape} without qkv_hidden_sizes")
        sizes = [wshape[1] // 3] * 3
    if len(sizes) != 3 or sum(sizes) != wshape[1] or not _same(wshape[0], din) or \
            sizes[0] != sizes[1]:
        refuse(ctx, f"qkv_hidden_sizes={sizes} with weights of shape {wshape} and input "
                    f"hidden size {din}")
    if n <= 0 or sizes[0] % n or sizes[2] % n:
        refuse(ctx, f"num_heads={n} for hidden sizes {sizes}")
    hq, hv = sizes[0] // n, sizes[2] // n
    dtype = dtype_of(x)
    q = _heads(bb, _projection(bb, x, w, bias, 0, sizes[0]), b, s, n, hq)
    k = _heads(bb, _projection(bb, x, w, bias, sizes[0], 2 * sizes[0]), b, s, n, hq)
    v = _heads(bb, _projection(bb, x, w, bias, 2 * sizes[0], wshape[1]), b, s, n, hv)
    p = 0
    if past is not None:
        pshape = _shape(ctx, past, "past")
        if hq != hv or len(pshape) != 5 or not all(
                _same(a, w) for a, w in zip(pshape, (2, b, n, pshape[3], hq))):
            refuse(ctx, f"past of shape {pshape} (expected (2, {b}, {n}, P, {hq}), with equal "
                        "Q/K/V hidden sizes)")
        p = pshape[3]
        k = bb.emit(relax.op.concat([relax.op.squeeze(_slice(past, 0, 0, 1), [0]), k], axis=2))
        v = bb.emit(relax.op.concat([relax.op.squeeze(_slice(past, 0, 1, 2), [0]), v], axis=2))
    t = p + s
    keeps = []
    if mask is not None:
        keeps.append(_keep_from_mask(bb, ctx, mask, b, s, t, "mask_index"))
    if int(attrs.get("unidirectional", 0)):
        keeps.append(_causal_keep(s, t, p))
    filter_value = float(attrs.get("mask_filter_value", MASK_FILTER_VALUE))
    add = _additive_mask(bb, dtype, keeps, attn_bias, filter_value)
    scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / math.sqrt(hq)
    o = _merge_heads(bb, _sdpa(bb, q, k, v, scale, add, dtype), b, s, n, hv)
    if _wants(ctx, 1):
        return _outputs(o, _stack2(k, v))
    return o


@_register("QAttention")
def q_attention(bb, inputs, attrs, ctx):
    """Attention on 8-bit input and weights (quantize_dynamic of an Attention model):
    input, weight, bias, input_scale, weight_scale (per tensor or per column),
    mask_index, input_zero_point, weight_zero_point, past; the float Attention of
    DQ(input) and DQ(weight) (a constant weight dequantizes at compile time)."""
    x, w, bias, x_s, w_s, mask, x_z, w_z, past = _pad(inputs, 9)[:9]
    eight_bit(ctx, (x, "input"), (w, "weight"))
    per_tensor(ctx, (x_s, "input_scale"), (x_z, "input_zero_point"))
    cols = _dims(ctx, w, "weight")[-1]
    for v, what in ((w_s, "weight_scale"), (w_z, "weight_zero_point")):
        if v is not None and int(np.prod(_dims(ctx, v, what))) not in (1, cols):
            refuse(ctx, f"{what} of shape {_dims(ctx, v, what)} (per tensor or per column)")
    return attention(bb, [dequantized(bb, x, x_s, x_z),
                          dequantized(bb, w, w_s, w_z, axis=1), bias, mask, past],
                     attrs, ctx)


@_register("MultiHeadAttention")
def multi_head_attention(bb, inputs, attrs, ctx):
    """Multi-head attention on projected Q, K, V (B, S|L, N*H), or packed QKV (B, S, N, 3, H),
    packed KV (B, L, N, 2, H), or K/V already in heads (B, N, L, H); optional bias
    (Dq + Dk + Dv), key_padding_mask ((B), (B, T), (B, S, T)), attention_bias, past_key /
    past_value with outputs present_key / present_value; unidirectional, scale,
    mask_filter_value.  Refused: the (3B+2) mask, past_sequence_length, cache_indirection,
    output qk."""
    (query, key, value, bias, kpm, attn_bias, past_k, past_v, past_len,
     cache_ind) = _pad(inputs, 10)[:10]
    _float(ctx, query, "query")
    n = int(attrs.get("num_heads", 0))
    if n <= 0:
        refuse(ctx, f"num_heads={n}")
    if past_len is not None or cache_ind is not None:
        refuse(ctx, "inputs past_sequence_length / cache_indirection (shared buffers, beams)")
    if _wants(ctx, 3):
        refuse(ctx, "output qk")
    dtype = dtype_of(query)
    qshape = _shape(ctx, query, "query")
    kshape = _shape(ctx, key, "key") if key is not None else None
    if not isinstance(qshape[-1], int) or (kshape is not None and not isinstance(kshape[-1],
                                                                                  int)):
        refuse(ctx, "query / key of a hidden size not known at compile time")
    b, s = qshape[0], qshape[1]
    if len(qshape) == 5:                          # packed QKV (B, S, N, 3, H)
        if key is not None or value is not None or not _same(qshape[2], n) or \
                not _same(qshape[3], 3):
            refuse(ctx, f"query of shape {qshape} (packed QKV (B, S, {n}, 3, H), no key/value)")
        h = qshape[4]
        parts = [bb.emit(relax.op.squeeze(_slice(query, 3, i, i + 1), [3])) for i in range(3)]
        query, key, value = [relax.op.reshape(p_, [b, s, n * h]) for p_ in parts]
        kshape = [b, s, n * h]
    elif kshape is not None and len(kshape) == 5:  # packed KV (B, L, N, 2, H)
        if value is not None or not _same(kshape[2], n) or not _same(kshape[3], 2):
            refuse(ctx, f"key of shape {kshape} (packed KV (B, L, {n}, 2, H), no value)")
        h = kshape[4]
        parts = [bb.emit(relax.op.squeeze(_slice(key, 3, i, i + 1), [3])) for i in range(2)]
        key, value = [relax.op.reshape(p_, [b, kshape[1], n * h]) for p_ in parts]
        kshape = [b, kshape[1], n * h]
    if len(qshape) not in (3, 5) or key is None or value is None:
        refuse(ctx, f"query of shape {qshape} with key {kshape} (separate Q, K, V; packed "
                    "QKV or packed KV expected)")
    dq = n * (qshape[4] if len(qshape) == 5 else qshape[2] // n)
    if dq % n or (len(qshape) == 3 and qshape[2] % n):
        refuse(ctx, f"query hidden size {qshape[2]} with num_heads={n}")
    hq = dq // n
    kv_heads = len(kshape) == 4                   # K, V given as (B, N, L, H)
    vshape = _shape(ctx, value, "value") if kv_heads else None
    if bias is not None:
        bsz = _dims(ctx, bias, "bias")[0]
        if kv_heads:
            refuse(ctx, "bias with key/value given per head (B, N, L, H)")
        query = relax.op.add(query, _slice(bias, 0, 0, dq))
        key = relax.op.add(key, _slice(bias, 0, dq, 2 * dq))
        value = relax.op.add(value, _slice(bias, 0, 2 * dq, bsz))
    q = _heads(bb, bb.emit(query), b, s, n, hq)
    if kv_heads:
        if not (_same(kshape[0], b) and _same(kshape[1], n) and _same(kshape[3], hq)) or \
                len(vshape) != 4 or not isinstance(vshape[3], int):
            refuse(ctx, f"key/value of shapes {kshape}, {vshape} (expected (B, {n}, L, {hq}))")
        k, v, hv = key, value, vshape[3]
    else:
        value = bb.emit(value)
        dv = _shape(ctx, value, "value")[2]
        if not isinstance(dv, int) or dv % n:
            refuse(ctx, f"value hidden size {dv} with num_heads={n}")
        hv = dv // n
        length = kshape[1]
        k = _heads(bb, bb.emit(key), b, length, n, hq)
        v = _heads(bb, value, b, length, n, hv)
    p = 0
    if past_k is not None or past_v is not None:
        if past_k is None or past_v is None or kv_heads:
            refuse(ctx, "past_key without past_value (or with key/value given per head)")
        p = _shape(ctx, past_k, "past_key")[2]
        k = bb.emit(relax.op.concat([past_k, k], axis=2))
        v = bb.emit(relax.op.concat([past_v, v], axis=2))
    t = _shape(ctx, k, "key")[2]
    keeps = []
    if kpm is not None:
        if _same(_shape(ctx, kpm, "key_padding_mask")[0], 3 * b + 2):
            refuse(ctx, "key_padding_mask of shape (3B+2)")
        keeps.append(_keep_from_mask(bb, ctx, kpm, b, s, t, "key_padding_mask"))
    if int(attrs.get("unidirectional", 0)):
        keeps.append(_causal_keep(s, t, t - s))
    filter_value = float(attrs.get("mask_filter_value", MASK_FILTER_VALUE))
    add = _additive_mask(bb, dtype, keeps, attn_bias, filter_value)
    scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / math.sqrt(hq)
    o = _merge_heads(bb, _sdpa(bb, q, k, v, scale, add, dtype), b, s, n, hv)
    if _wants(ctx, 1) or _wants(ctx, 2):
        return _outputs(o, k, v)
    return o


@_register("GroupQueryAttention")
def group_query_attention(bb, inputs, attrs, ctx):
    """Grouped-query attention: query (B, S, N*H) with key/value (B, S, Nkv*H), or packed
    (B, S, (N + 2 Nkv) H); past_key / past_value (B, Nkv, P, H) and outputs present_key /
    present_value (B, Nkv, P + S, H); causal (default) with keys up to seqlens_k[b] visible;
    do_rotary with cos_cache / sin_cache (positions P + s, or position_ids);
    rotary_interleaved; attention_bias; scale.

    Two cache forms, as onnxruntime's (present length max(P, total_sequence_length)):

    * concatenated (present (B, Nkv, P + S, H)): the new keys are appended after the whole
      past; onnxruntime writes them at seqlens_k[b] + 1 - S instead, which differs only
      when a batch's past is shorter than the buffer; such constant seqlens_k are refused.
    * shared buffer (onnxruntime-genai's past_present_share_buffer: the model declares
      present_key with the past's length P, the cache's maximum): present is the past
      with rows seqlens_k[b] + 1 - S .. seqlens_k[b] replaced by the new keys; keys after
      seqlens_k[b] are masked, rotary positions start at seqlens_k[b] + 1 - S.  Shapes no
      longer depend on the step (only seqlens_k's values do): one static artifact decodes
      every step.

    Refused:
    local_window_size, softcap, smooth_softmax / head_sink, qk_output, quantized KV caches,
    sliding_window_cache, q/k norms, query_seqlens."""
    (query, key, value, past_k, past_v, seqlens_k, _total, cos, sin, pos_ids, attn_bias,
     head_sink, k_scale, v_scale, q_norm, k_norm, query_seqlens) = _pad(inputs, 17)[:17]
    _float(ctx, query, "query")
    _refuse_set(ctx, attrs, "local_window_size", lambda v: int(v) == -1)
    _refuse_set(ctx, attrs, "softcap", lambda v: float(v) == 0.0)
    _refuse_set(ctx, attrs, "smooth_softmax", lambda v: int(v) in (-1, 0))
    _refuse_set(ctx, attrs, "qk_output", lambda v: int(v) == 0)
    _refuse_set(ctx, attrs, "sliding_window_cache", lambda v: int(v) == 0)
    _refuse_set(ctx, attrs, "kv_cache_bit_width", lambda v: False)
    for name in ("k_quant_type", "v_quant_type"):
        _refuse_set(ctx, attrs, name, lambda v: (v.decode() if isinstance(v, bytes) else v)
                    == "NONE")
    for x, what in ((head_sink, "head_sink"), (k_scale, "k_scale"), (v_scale, "v_scale"),
                    (q_norm, "q_norm_weight"), (k_norm, "k_norm_weight"),
                    (query_seqlens, "query_seqlens")):
        if x is not None:
            refuse(ctx, f"input {what}")
    if _wants(ctx, 3):
        refuse(ctx, "output output_qk")
    n, nkv = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    if n <= 0 or nkv <= 0 or n % nkv:
        refuse(ctx, f"num_heads={n} with kv_num_heads={nkv}")
    dtype = dtype_of(query)
    b, s, d = _shape(ctx, query, "query")
    if not isinstance(d, int):
        refuse(ctx, "query of a hidden size not known at compile time")
    if key is None:                                  # packed QKV
        if value is not None or d % (n + 2 * nkv):
            refuse(ctx, f"packed query of hidden size {d} for {n} + 2 x {nkv} heads")
        h = d // (n + 2 * nkv)
        key = _slice(query, 2, n * h, (n + nkv) * h)
        value = _slice(query, 2, (n + nkv) * h, d)
        query = _slice(query, 2, 0, n * h)
    else:
        if d % n:
            refuse(ctx, f"query hidden size {d} with num_heads={n}")
        h = d // n
        kshape, vshape = _shape(ctx, key, "key"), _shape(ctx, value, "value")
        if len(kshape) != 3 or len(vshape) != 3 or not all(
                _same(x, w) for x, w in zip(kshape + vshape, [b, s, nkv * h] * 2)):
            refuse(ctx, f"key/value of shapes {kshape}, {vshape} (expected ({b}, {s}, "
                        f"{nkv * h}))")
    q = _heads(bb, bb.emit(query), b, s, n, h)
    k = _heads(bb, bb.emit(key), b, s, nkv, h)
    v = _heads(bb, bb.emit(value), b, s, nkv, h)
    p = 0
    if past_k is not None or past_v is not None:
        if past_k is None or past_v is None:
            refuse(ctx, "past_key without past_value")
        pshape = _shape(ctx, past_k, "past_key")
        if len(pshape) != 4 or not all(_same(x, w) for x, w in zip(pshape, (b, nkv,
                                                                           pshape[2], h))):
            refuse(ctx, f"past_key of shape {pshape} (expected ({b}, {nkv}, P, {h}))")
        p = pshape[2]
    has_past = not (isinstance(p, int) and p == 0)  # a symbolic P may be 0 at run time too
    shared = has_past and _shares_buffer(ctx, p)
    lens = constant_value(seqlens_k)
    if (not shared and lens is not None and has_past and isinstance(p + s, int)
            and np.any(np.asarray(lens).reshape(-1) != p + s - 1)):
        refuse(ctx, f"seqlens_k={np.asarray(lens).reshape(-1).tolist()} with a past buffer of "
                    f"{p} (pasts shorter than the buffer)")
    if int(attrs.get("do_rotary", 0)):
        if cos is None or sin is None:
            refuse(ctx, "do_rotary=1 without cos_cache / sin_cache")
        half = _dims(ctx, cos, "cos_cache")[-1]
        if pos_ids is None and shared:
            pos = bb.emit(relax.op.add(relax.op.reshape(_write_start(bb, seqlens_k, b, s),
                                                        [b, 1]),
                                       relax.op.reshape(_arange(s, "int64"), [1, s])))
        elif pos_ids is None:
            pos = bb.emit(relax.op.reshape(_arange(s, "int64", start=p), [1, s]))
        else:
            pos = _positions(bb, ctx, pos_ids, b, s)
        rot = {"interleaved": int(attrs.get("rotary_interleaved", 0)),
               "rotary_embedding_dim": 2 * half}
        q = bb.emit(rotary_embedding(bb, [q, cos, sin, pos], rot, ctx))
        k = bb.emit(rotary_embedding(bb, [k, cos, sin, pos], rot, ctx))
    if shared:
        start = _write_start(bb, seqlens_k, b, s)
        k, v = (_write_rows(bb, past, new, start, b, nkv, p, s, h)
                for past, new in ((past_k, k), (past_v, v)))
    elif has_past:
        k = bb.emit(relax.op.concat([past_k, k], axis=2))
        v = bb.emit(relax.op.concat([past_v, v], axis=2))
    t = p if shared else p + s
    present_k, present_v = k, v
    if n != nkv:                                     # query head j uses KV head j // (n/nkv)
        k = bb.emit(relax.op.repeat(k, n // nkv, axis=1))
        v = bb.emit(relax.op.repeat(v, n // nkv, axis=1))
    cols = relax.op.reshape(_arange(t), [1, 1, 1, t])
    last = relax.op.reshape(relax.op.astype(seqlens_k, "int32"), [b, 1, 1, 1])
    keeps = [bb.emit(relax.op.less_equal(cols, last))]
    if int(attrs.get("causal", 1)) and shared:  # query i sits at start[b] + i
        rows = relax.op.add(relax.op.reshape(start, [b, 1, 1, 1]),
                            relax.op.reshape(_arange(s, "int64"), [1, 1, s, 1]))
        keeps.append(bb.emit(relax.op.less_equal(
            relax.op.reshape(_arange(t, "int64"), [1, 1, 1, t]), rows)))
    elif int(attrs.get("causal", 1)):
        keeps.append(_causal_keep(s, t, p))
    add = _additive_mask(bb, dtype, keeps, attn_bias, float(np.finfo(np.float32).min)
                         if dtype == "float32" else float(np.finfo(np.float16).min))
    scale = float(attrs["scale"]) if attrs.get("scale") else 1.0 / math.sqrt(h)
    o = _merge_heads(bb, _sdpa(bb, q, k, v, scale, add, dtype), b, s, n, h)
    if _wants(ctx, 1) or _wants(ctx, 2):
        return _outputs(o, present_k, present_v)
    return o


def _shares_buffer(ctx, p) -> bool:
    """Whether the model declares present_key with the past's length (onnxruntime-genai's
    shared past/present buffer) rather than past + S."""
    if not _wants(ctx, 1) or ctx.importer is None:
        return False
    present = ctx.importer.declared_dims(ctx.node.output[1])
    return bool(present) and len(present) == 4 and (
        present[2] == p if isinstance(p, int) else present[2] == str(p))


def _write_start(bb, seqlens_k, b, s):
    """(B,) int64 seqlens_k[b] + 1 - S: where a shared buffer takes the new keys."""
    lens = relax.op.astype(relax.op.reshape(seqlens_k, [b]), "int64")
    return bb.emit(relax.op.subtract(lens, _dim_tensor(s - 1)))


def _write_rows(bb, past, new, start, b, nkv, p, s, h):
    """(B, Nkv, P, H): ``past`` with rows start[b] .. start[b] + S - 1 taken from ``new``
    (B, Nkv, S, H)."""
    rows = relax.op.reshape(_arange(p, "int64"), [1, 1, p, 1])
    off = bb.emit(relax.op.subtract(rows, relax.op.reshape(start, [b, 1, 1, 1])))
    inside = bb.emit(relax.op.logical_and(
        relax.op.greater_equal(off, relax.const(0, "int64")),
        relax.op.less(off, _dim_tensor(s))))
    idx = relax.op.minimum(relax.op.maximum(off, relax.const(0, "int64")), _dim_tensor(s - 1))
    idx = bb.emit(relax.op.broadcast_to(idx, [b, nkv, p, h]))
    taken = bb.emit(relax.op.gather_elements(new, idx, axis=2))
    return bb.emit(relax.op.where(inside, taken, past))


# --------------------------------------------------------------------------- #
# Dynamic quantisation (what onnxruntime's optimizer makes of quantize_dynamic's
# DynamicQuantizeLinear + MatMulInteger + Mul/Add): the default-domain ops TVM converts,
# in the form passes/pack_int_matmul.py packs onto the integer matmul kernel
# --------------------------------------------------------------------------- #


def _integer_matmul(bb, a, b, a_zp, b_zp, ctx):
    """int32 (a - a_zp) @ (b - b_zp) as the default-domain MatMulInteger converts it."""
    from ..registry import tvm_converter

    eight_bit(ctx, (a, "A"), (b, "B"))
    return bb.normalize(tvm_converter("MatMulInteger")(bb, [a, b, a_zp, b_zp], {}, ctx))


def _dequantize(bb, acc, scale, bias):
    y = relax.op.multiply(relax.op.astype(acc, "float32"), scale)
    return relax.op.add(y, bias) if bias is not None else y


@_register("DynamicQuantizeMatMul")
def dynamic_quantize_matmul(bb, inputs, attrs, ctx):
    """Y = (DynamicQuantizeLinear(A) - a_zp) @ (B - b_zp) * a_scale * b_scale + bias; B u8 /
    s8, b_scale and b_zero_point per tensor or per column."""
    from ..registry import tvm_converter

    a, b, b_scale, b_zp, bias = _pad(inputs, 5)
    _float(ctx, a, "input A")
    q = bb.emit(tvm_converter("DynamicQuantizeLinear")(bb, [a], {}, ctx))
    aq, a_scale, a_zp = (bb.emit(relax.TupleGetItem(q, i)) for i in range(3))
    acc = _integer_matmul(bb, aq, b, a_zp, b_zp, ctx)
    return _dequantize(bb, acc, relax.op.multiply(a_scale, b_scale), bias)


@_register("MatMulIntegerToFloat")
def matmul_integer_to_float(bb, inputs, attrs, ctx):
    """Y = (A - a_zp) @ (B - b_zp) * a_scale * b_scale + bias, A and B u8 / s8."""
    a, b, a_scale, b_scale, a_zp, b_zp, bias = _pad(inputs, 7)
    acc = _integer_matmul(bb, a, b, a_zp, b_zp, ctx)
    scale = relax.op.multiply(a_scale, b_scale)
    return _dequantize(bb, acc, scale, bias)


# --------------------------------------------------------------------------- #
# Block-quantized weights (what onnxruntime's MatMulNBitsQuantizer and GenAI's model
# builder write for LLMs): dequantized once, at compile time
# --------------------------------------------------------------------------- #


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 bytes holding ``bits``-bit codes low bits first -> the first ``count`` codes
    along the last axis (as uint8)."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits)
    codes = (packed[..., :, None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per)[..., :count]


def dequantize_nbits(b, scales, zero_points, k: int, n: int, bits: int, block: int):
    """W [N, K] float32 of MatMulNBits' B [N, k_blocks, blob], scales [N * k_blocks] and
    zero points (None: 2^(bits-1); uint8: packed codes per row of N; float: as scales):
    W[n, k] = (code - zero) * scale of k's block."""
    k_blocks = -(-k // block)
    codes = unpack_codes(b.reshape(n, k_blocks, -1), bits, block).astype(np.float32)
    scale = scales.astype(np.float32).reshape(n, k_blocks, 1)
    if zero_points is None:
        zero = np.float32(1 << (bits - 1))
    elif zero_points.dtype == np.uint8:
        zero = unpack_codes(zero_points.reshape(n, -1), bits, k_blocks).astype(np.float32)
        zero = zero.reshape(n, k_blocks, 1)
    else:
        zero = zero_points.astype(np.float32).reshape(n, k_blocks, 1)
    w = (codes - zero) * scale
    return w.reshape(n, k_blocks * block)[:, :k]


@_register("MatMulNBits")
def matmul_nbits(bb, inputs, attrs, ctx):
    """Y = A @ dequantize(B)^T + bias, B of ``bits``-bit codes (2, 4, 8) in blocks of
    ``block_size`` along K with a scale (and a zero point) per block.  B, scales and zero
    points must be constants: the weight is dequantized to float32 at compile time and
    takes the packed float matmul kernel (4-bit weights take 8x their memory in the
    artifact; an integer kernel on the codes is not built).  g_idx (act-order) and
    run-time weights are refused; accuracy_level only chooses onnxruntime's own compute
    precision (float32 here, the most accurate)."""
    a, b, scales, zps, g_idx, bias = _pad(inputs, 6)
    _float(ctx, a, "input A")
    k, n = int(attrs.get("K", 0)), int(attrs.get("N", 0))
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 0))
    if bits not in (2, 4, 8):
        refuse(ctx, f"bits={bits} (2, 4 and 8 are)")
    if k <= 0 or n <= 0 or block < 16 or block & (block - 1):
        refuse(ctx, f"K={k}, N={n}, block_size={block} (positive, block_size a power of 2 "
                    ">= 16)")
    if g_idx is not None:
        refuse(ctx, "input g_idx (act-order block indices)")
    values = {}
    for x, what in ((b, "B"), (scales, "scales"), (zps, "zero_points")):
        if x is None:
            continue
        v = constant_value(x)
        if v is None:
            refuse(ctx, f"input {what} computed at run time (a constant weight is)")
        values[what] = v
    k_blocks, blob = -(-k // block), block * bits // 8
    if values["B"].dtype != np.uint8 or values["B"].size != n * k_blocks * blob:
        refuse(ctx, f"B of type {values['B'].dtype} and shape {list(values['B'].shape)} "
                    f"(expected uint8 [{n}, {k_blocks}, {blob}])")
    if values["scales"].size != n * k_blocks:
        refuse(ctx, f"scales of shape {list(values['scales'].shape)} (expected "
                    f"[{n * k_blocks}])")
    zp = values.get("zero_points")
    if zp is not None:
        want = n * (-(-k_blocks * bits // 8)) if zp.dtype == np.uint8 else n * k_blocks
        if zp.size != want:
            refuse(ctx, f"zero_points of type {zp.dtype} and shape {list(zp.shape)} "
                        f"({want} elements expected)")
    if static_shape(a)[-1] != k:
        refuse(ctx, f"A of shape {static_shape(a)} with K={k}")
    w = dequantize_nbits(values["B"], values["scales"], zp, k, n, bits, block)
    dtype = dtype_of(a)
    y = relax.op.matmul(a, relax.const(np.ascontiguousarray(w.T).astype(dtype), dtype))
    return relax.op.add(bb.emit(y), bias) if bias is not None else y


# -- QOperator-format contrib ops (onnxruntime.quantization.quantize_static with
# QuantFormat.QOperator): each is its float op between DequantizeLinear and QuantizeLinear,
# so that the QDQ passes (qdq_conv_integer, qdq_matmul_integer) and convert_layout see the
# same graph as in the QDQ format; results within one output step of onnxruntime's
# fixed-point kernels (rounding ties).


@_register("QLinearAdd")
def qlinear_add(bb, inputs, attrs, ctx):
    """C = Q(DQ(A) + DQ(B)) per tensor (A, A_scale, A_zp, B, B_scale, B_zp, C_scale,
    C_zp), broadcasting as Add."""
    return _qlinear_binary(bb, inputs, ctx, relax.op.add)


@_register("QLinearMul")
def qlinear_mul(bb, inputs, attrs, ctx):
    """C = Q(DQ(A) * DQ(B)) per tensor."""
    return _qlinear_binary(bb, inputs, ctx, relax.op.multiply)


def _qlinear_binary(bb, inputs, ctx, op):
    a, a_s, a_z, b, b_s, b_z, c_s, c_z = _pad(inputs, 8)
    eight_bit(ctx, (a, "A"), (b, "B"))
    per_tensor(ctx, (a_s, "A_scale"), (a_z, "A_zero_point"), (b_s, "B_scale"),
                (b_z, "B_zero_point"), (c_s, "C_scale"), (c_z, "C_zero_point"))
    y = bb.emit(op(dequantized(bb, a, a_s, a_z), dequantized(bb, b, b_s, b_z)))
    return quantized(bb, y, c_s, c_z, a)


@_register("QLinearGlobalAveragePool")
def qlinear_global_average_pool(bb, inputs, attrs, ctx):
    """Y = Q(mean of DQ(X) over its spatial dims) per tensor; ``channels_last`` 0 or 1."""
    x, x_s, x_z, y_s, y_z = _pad(inputs, 5)
    eight_bit(ctx, (x, "X"))
    per_tensor(ctx, (x_s, "x_scale"), (x_z, "x_zero_point"), (y_s, "y_scale"),
                (y_z, "y_zero_point"))
    rank = x.ty.ndim
    axes = list(range(1, rank - 1)) if int(attrs.get("channels_last", 0)) else \
        list(range(2, rank))
    y = bb.emit(relax.op.mean(dequantized(bb, x, x_s, x_z), axis=axes, keepdims=True))
    return quantized(bb, y, y_s, y_z, x)


def _default_op(bb, op_type, inputs, attrs, ctx, opset):
    """The default domain's converter of ``op_type`` at ``opset`` applied to ``inputs``
    (float tensors of a QOperator op's body), emitted."""
    import dataclasses

    from ..registry import REGISTRY

    entry = REGISTRY.lookup("", op_type, opset)
    y = entry.converter(bb, inputs, attrs, dataclasses.replace(ctx, opset=opset))
    return y if isinstance(y, relax.Var) else bb.emit(y)


def _qlinear_unary(bb, inputs, ctx, fn):
    """Y = Q(fn(DQ(X))) per tensor for (X, X_scale, X_zero_point, Y_scale, Y_zero_point)."""
    x, x_s, x_z, y_s, y_z = _pad(inputs, 5)
    eight_bit(ctx, (x, "X"))
    per_tensor(ctx, (x_s, "X_scale"), (x_z, "X_zero_point"), (y_s, "Y_scale"),
               (y_z, "Y_zero_point"))
    return quantized(bb, fn(dequantized(bb, x, x_s, x_z)), y_s, y_z, x)


@_register("QLinearLeakyRelu")
def qlinear_leaky_relu(bb, inputs, attrs, ctx):
    """Y = Q(LeakyRelu(DQ(X), alpha)) per tensor (onnxruntime: a 256-entry table of it)."""
    alpha = float(attrs.get("alpha", 0.01))
    return _qlinear_unary(bb, inputs, ctx,
                          lambda x: bb.emit(relax.op.nn.leakyrelu(x, alpha)))


@_register("QLinearSigmoid")
def qlinear_sigmoid(bb, inputs, attrs, ctx):
    """Y = Q(Sigmoid(DQ(X))) per tensor (onnxruntime: a 256-entry table of it)."""
    return _qlinear_unary(bb, inputs, ctx, lambda x: bb.emit(relax.op.sigmoid(x)))


@_register("QLinearSoftmax")
def qlinear_softmax(bb, inputs, attrs, ctx):
    """Y = Q(Softmax(DQ(X))) per tensor; the ``opset`` attribute picks the Softmax
    (below 13: over the dims from ``axis`` on, flattened; from 13: over ``axis``)."""
    opset = int(attrs.get("opset", 0) or 0)
    if opset <= 0:
        refuse(ctx, "no 'opset' attribute (required: which Softmax it computes)")
    axis = int(attrs.get("axis", 1 if opset < 13 else -1))
    return _qlinear_unary(bb, inputs, ctx, lambda x: _default_op(
        bb, "Softmax", [x], {"axis": axis}, ctx, max(opset, 11)))


@_register("QLinearAveragePool")
def qlinear_average_pool(bb, inputs, attrs, ctx):
    """Y = Q(AveragePool(DQ(X))) per tensor, AveragePool's attributes; ``channels_last``
    1 reads X as N...C (transposed around the pool)."""
    pool_attrs = {k: v for k, v in attrs.items() if k != "channels_last"}
    last = int(attrs.get("channels_last", 0))

    def pool(x):
        rank = len(static_shape(x))
        if last:
            x = bb.emit(relax.op.permute_dims(x, [0, rank - 1] + list(range(1, rank - 1))))
        y = _default_op(bb, "AveragePool", [x], pool_attrs, ctx, 19)
        if last:
            y = bb.emit(relax.op.permute_dims(y, [0] + list(range(2, rank)) + [1]))
        return y
    return _qlinear_unary(bb, inputs, ctx, pool)


@_register("QLinearConcat")
def qlinear_concat(bb, inputs, attrs, ctx):
    """Y = Q(Concat(DQ(X_1), DQ(X_2), ...)) per tensor: inputs Y_scale, Y_zero_point, then
    (X, X_scale, X_zero_point) per input; ``axis`` as Concat."""
    y_s, y_z, rest = inputs[0], inputs[1], list(inputs[2:])
    if not rest or len(rest) % 3:
        refuse(ctx, f"{len(rest)} inputs after Y_scale / Y_zero_point (triples of X, "
                    "X_scale, X_zero_point expected)")
    per_tensor(ctx, (y_s, "Y_scale"), (y_z, "Y_zero_point"))
    parts = []
    for k in range(0, len(rest), 3):
        x, x_s, x_z = rest[k:k + 3]
        eight_bit(ctx, (x, f"X{k // 3}"))
        per_tensor(ctx, (x_s, f"X{k // 3}_scale"), (x_z, f"X{k // 3}_zero_point"))
        parts.append(dequantized(bb, x, x_s, x_z))
    y = bb.emit(relax.op.concat(parts, axis=int(attrs["axis"])))
    return quantized(bb, y, y_s, y_z, rest[0])


@_register("QLinearWhere")
def qlinear_where(bb, inputs, attrs, ctx):
    """Y = Q(Where(condition, DQ(X), DQ(Y))) per tensor: inputs condition, X, x_scale,
    x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point."""
    cond, x, x_s, x_z, y, y_s, y_z, z_s, z_z = _pad(inputs, 9)
    eight_bit(ctx, (x, "X"), (y, "Y"))
    per_tensor(ctx, (x_s, "x_scale"), (x_z, "x_zero_point"), (y_s, "y_scale"),
               (y_z, "y_zero_point"), (z_s, "z_scale"), (z_z, "z_zero_point"))
    out = bb.emit(relax.op.where(cond, dequantized(bb, x, x_s, x_z),
                                 dequantized(bb, y, y_s, y_z)))
    return quantized(bb, out, z_s, z_z, x)


@_register("QGemm")
def qgemm(bb, inputs, attrs, ctx):
    """Y = alpha * DQ(A)' @ DQ(B)' + DQ(C) (C int32 at A_scale * B_scale, zero point 0),
    quantized by y_scale / y_zero_point when given, else float.  B per tensor or per
    output column; transA / transB as Gemm.  A constant B is transposed here, so the
    matmul reads DQ(B) as qdq_matmul_integer expects."""
    a, a_s, a_z, b, b_s, b_z, c, y_s, y_z = _pad(inputs, 9)
    eight_bit(ctx, (a, "A"), (b, "B"))
    per_tensor(ctx, (a_s, "a_scale"), (a_z, "a_zero_point"), (y_s, "y_scale"),
                (y_z, "y_zero_point"))
    alpha = float(attrs.get("alpha", 1.0))
    xa = dequantized(bb, a, a_s, a_z)
    if int(attrs.get("transA", 0)):
        xa = bb.emit(relax.op.permute_dims(xa, [1, 0]))
    bv, trans_b = constant_value(b), int(attrs.get("transB", 0))
    if trans_b and bv is not None:
        b, trans_b = relax.const(np.ascontiguousarray(bv.T)), 0
    n = static_shape(b)[0 if trans_b else 1]
    if int(np.prod(static_shape(b_s))) not in (1, n):
        refuse(ctx, f"b_scale of shape {static_shape(b_s)} (per tensor or per column)")
    xb = dequantized(bb, b, b_s, b_z, axis=0 if trans_b else 1)
    if trans_b:
        xb = bb.emit(relax.op.permute_dims(xb, [1, 0]))
    y = bb.emit(relax.op.matmul(xa, xb))
    if alpha != 1.0:
        y = bb.emit(relax.op.multiply(y, relax.const(np.float32(alpha))))
    if c is not None:
        scale = bb.emit(relax.op.multiply(relax.op.reshape(a_s, []),
                                          relax.op.reshape(b_s, [-1])))
        y = bb.emit(relax.op.add(y, relax.op.multiply(relax.op.astype(c, "float32"), scale)))
    if y_s is None:
        return y
    return quantized(bb, y, y_s, y_z, a)
