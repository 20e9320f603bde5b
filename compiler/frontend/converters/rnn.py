"""onnxc's converters for sequence ops TVM 0.27 lacks: RotaryEmbedding, CausalConvWithState,
LinearAttention, and the recurrent RNN / GRU / LSTM.

The recurrences are unrolled over the sequence length, which is static once the input shapes
are (the importer specialises them): one small group of Relax ops per step.  Each converter
follows the ONNX spec and its reference implementation (``onnx/reference/ops``) and refuses,
naming the node and what it does not implement, the rest.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .common import (register, refuse, shape_of, static_shape, scalar, dtype_of, is_float,
                     attr_text, cpu_lanes)




def _pad_inputs(inputs, n):
    return list(inputs) + [None] * (n - len(inputs))


def _slice(x, axis: int, begin: int, end: int, step: int = 1):
    return relax.op.strided_slice(x, axes=[axis], begin=[begin], end=[end], strides=[step])


def _stack(bb, items, axis):
    """Stack as expand_dims + concat: TVM 0.27's ConvertLayout (passes/convert_layout.py
    runs it on every graph) fails on relax.op.stack."""
    parts = [relax.op.expand_dims(t, axis) for t in items]
    return bb.emit(relax.op.concat(parts, axis=axis) if len(parts) > 1 else parts[0])


def _float_input(ctx, x, what):
    if not is_float(dtype_of(x)):
        refuse(ctx, f"{what} of type {dtype_of(x)}")


# --------------------------------------------------------------------------- #
# RotaryEmbedding (23+)
# --------------------------------------------------------------------------- #


@register("RotaryEmbedding", since=23)
def rotary_embedding(bb, inputs, attrs, ctx):
    """RotaryEmbedding: 4-D (B, H, S, D) or 3-D (B, S, H*D with num_heads) input; cos/sin
    caches gathered by position_ids (or given per batch and position); interleaved or
    half-split pairs; partial rotation (rotary_embedding_dim)."""
    x, cos, sin, pos = _pad_inputs(inputs, 4)[:4]
    _float_input(ctx, x, "input")
    shape = shape_of(x)
    if shape is None:
        refuse(ctx, "input of unknown rank")
    rank = len(shape)
    interleaved = bool(attrs.get("interleaved", 0))
    if rank == 4:
        b, h, s, d = shape
        x4 = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))       # (B, S, H, D)
    elif rank == 3:
        b, s, hidden = shape
        h = int(attrs.get("num_heads", 0))
        if h <= 0 or not isinstance(hidden, int) or hidden % h:
            refuse(ctx, f"3-D input of hidden size {hidden} with num_heads={h}")
        d = hidden // h
        # (B, S, H, D) through the 4-D (B, H, S, D) form: the direct reshape fuses into one
        # kernel whose 16-lane vectorised loop (x86 Fallback rule, one core) TVM 0.27
        # computes wrongly in the upper 8 lanes
        x4 = bb.emit(relax.op.reshape(x, [b, s, h, d]))
    else:
        refuse(ctx, f"input of rank {rank} (3 or 4 expected)")
    if not isinstance(d, int):
        refuse(ctx, "a head size not known at compile time")
    rd = int(attrs.get("rotary_embedding_dim", 0)) or d
    if rd > d or rd % 2:
        refuse(ctx, f"rotary_embedding_dim={rd} for head size {d}")
    half = rd // 2
    if pos is not None:
        cos = relax.op.take(cos, pos, axis=0)
        sin = relax.op.take(sin, pos, axis=0)
    cos = bb.emit(relax.op.expand_dims(cos, 2))                    # (B, S, 1, rd/2)
    sin = bb.emit(relax.op.expand_dims(sin, 2))
    last = (shape_of(cos) or [None])[-1]
    if last != half:
        refuse(ctx, f"cos_cache/sin_cache of last dimension {last} for "
                f"rotary_embedding_dim/2 = {half}")
    if interleaved:
        x1, x2 = _slice(x4, 3, 0, rd, 2), _slice(x4, 3, 1, rd, 2)
    else:
        x1, x2 = _slice(x4, 3, 0, half), _slice(x4, 3, half, rd)
    x1, x2 = bb.emit(x1), bb.emit(x2)
    real = relax.op.subtract(relax.op.multiply(cos, x1), relax.op.multiply(sin, x2))
    imag = relax.op.add(relax.op.multiply(sin, x1), relax.op.multiply(cos, x2))
    real, imag = bb.emit(real), bb.emit(imag)
    if interleaved:
        pairs = relax.op.concat([relax.op.expand_dims(real, 4), relax.op.expand_dims(imag, 4)],
                                axis=4)
        rot = relax.op.reshape(pairs, [b, s, h, rd])
    else:
        rot = relax.op.concat([real, imag], axis=3)
    rot = bb.emit(rot)
    if rd < d:
        rot = bb.emit(relax.op.concat([rot, _slice(x4, 3, rd, d)], axis=3))
    if rank == 3:
        return relax.op.reshape(rot, shape)
    return relax.op.permute_dims(rot, [0, 2, 1, 3])


# --------------------------------------------------------------------------- #
# CausalConvWithState (27+)
# --------------------------------------------------------------------------- #


@register("CausalConvWithState", since=27)
def causal_conv_with_state(bb, inputs, attrs, ctx):
    """CausalConvWithState: depthwise causal conv1d over (B, C, L) with a (C, 1, k) weight,
    left-padded by past_state (zeros without it); optional bias and SiLU/Swish; outputs the
    result and the last k-1 positions of the padded input as present_state."""
    x, w, bias, past = _pad_inputs(inputs, 4)[:4]
    _float_input(ctx, x, "input")
    act = attr_text(attrs.get("activation"), "none")
    if act not in ("none", "silu", "swish"):
        refuse(ctx, f"activation={act!r}")
    xs, ws = static_shape(x), static_shape(w)
    if len(xs) != 3 or len(ws) != 3 or ws[1] != 1 or ws[0] != xs[1]:
        refuse(ctx, f"input of shape {xs} with weight of shape {ws} (expects (B, C, L) and "
                "(C, 1, k))")
    batch, channels, length = xs
    k = ws[2]
    dtype = dtype_of(x)
    if past is None:
        pad = relax.op.zeros([batch, channels, k - 1], dtype) if k > 1 else None
    else:
        if static_shape(past) != [batch, channels, k - 1]:
            refuse(ctx, f"past_state of shape {static_shape(past)} (expects "
                    f"{[batch, channels, k - 1]})")
        pad = past if k > 1 else None
    padded = bb.emit(relax.op.concat([pad, x], axis=2)) if pad is not None else x
    y = relax.op.nn.conv1d(padded, w, strides=1, padding=0, groups=channels)
    if bias is not None:
        y = relax.op.add(y, relax.op.reshape(bias, [1, channels, 1]))
    y = bb.emit(y)
    if act != "none":
        # the reference applies SiLU in float32 and rounds once
        yf = bb.emit(relax.op.astype(y, "float32")) if dtype in ("float16", "bfloat16") else y
        y = bb.emit(relax.op.multiply(yf, relax.op.sigmoid(yf)))
        if dtype_of(y) != dtype:
            y = bb.emit(relax.op.astype(y, dtype))
    total = length + k - 1
    present = bb.emit(_slice(padded, 2, total - (k - 1), total))
    outs = [y, present][:len(ctx.node.output)]
    return outs[0] if len(outs) == 1 else relax.Tuple(outs)


# --------------------------------------------------------------------------- #
# LinearAttention (27+)
# --------------------------------------------------------------------------- #


def _heads_4d(bb, x, heads, what, ctx):
    """(B, T, H*D) -> (B, H, T, D) in float32."""
    b, t, hd = static_shape(x)
    if hd % heads:
        refuse(ctx, f"{what} of last dimension {hd} with {heads} heads")
    cast = dtype_of(x) != "float32"
    x = relax.op.permute_dims(relax.op.reshape(x, [b, t, heads, hd // heads]), [0, 2, 1, 3])
    if cast:
        x = relax.op.astype(x, "float32")
    return bb.emit(x)


@register("LinearAttention", since=27)
def linear_attention(bb, inputs, attrs, ctx):
    """LinearAttention: the recurrent state S (B, H_kv, d_k, d_v) updated per step by the
    rule linear (S += k v^T), gated (S *= exp(g) first), delta (v <- beta (v - S^T k)) or
    gated_delta; o_t = scale q_t S (GQA: kv heads repeated).  Unrolled over the static
    sequence length, in float32 as the reference; outputs (B, T, H_q*d_v) and the final
    state (in past_state's dtype, or the query's)."""
    q, k, v, past, decay, beta = _pad_inputs(inputs, 6)[:6]
    rule = attr_text(attrs.get("update_rule"), "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        refuse(ctx, f"update_rule={rule!r}")
    hq, hkv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    if hq is None or hkv is None or hq <= 0 or hkv <= 0 or hq % hkv:
        refuse(ctx, f"q_num_heads={hq} with kv_num_heads={hkv} (both required, q a "
                "multiple of kv)")
    gating = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        refuse(ctx, f"update_rule={rule!r} with decay {'given' if decay else 'omitted'} "
                f"and beta {'given' if beta else 'omitted'}")
    for x, what in ((q, "query"), (k, "key"), (v, "value")):
        _float_input(ctx, x, what)
        if x.ty.ndim != 3:
            refuse(ctx, f"{what} of rank {x.ty.ndim} (3 expected)")
    out_dtype = dtype_of(q)
    b, t, _ = static_shape(q)
    q4 = _heads_4d(bb, q, hq, "query", ctx)
    k4 = _heads_4d(bb, k, hkv, "key", ctx)
    v4 = _heads_4d(bb, v, hkv, "value", ctx)
    dk, dv = static_shape(q4)[3], static_shape(v4)[3]
    if static_shape(k4)[3] != dk:
        refuse(ctx, f"key head size {static_shape(k4)[3]} != query head size {dk}")
    group = hq // hkv
    if decay is not None:
        last = static_shape(decay)[-1]
        if decay.ty.ndim != 3 or last not in (hkv, hkv * dk):
            refuse(ctx, f"decay of shape {static_shape(decay)}")
        decay4 = _heads_4d(bb, decay, hkv, "decay", ctx)            # (B, H, T, 1 | dk)
        decay4 = bb.emit(relax.op.exp(relax.op.permute_dims(decay4, [0, 1, 3, 2])))
    if beta is not None:
        last = static_shape(beta)[-1]
        if beta.ty.ndim != 3 or last not in (hkv, 1):
            refuse(ctx, f"beta of shape {static_shape(beta)}")
        beta4 = _heads_4d(bb, beta, last, "beta", ctx)              # (B, H | 1, T, 1)
    state_dtype = out_dtype
    if past is not None:
        if static_shape(past) != [b, hkv, dk, dv]:
            refuse(ctx, f"past_state of shape {static_shape(past)} (expects {[b, hkv, dk, dv]})")
        state_dtype = dtype_of(past)
        state = past if state_dtype == "float32" else relax.op.astype(past, "float32")
        state = bb.emit(state)
    else:
        state = relax.const(np.zeros((b, hkv, dk, dv), np.float32), "float32")
    scale = attrs.get("scale")
    scale = 1.0 / np.sqrt(dk) if not scale else float(scale)

    outs = []
    for i in range(t):
        k_t = bb.emit(_slice(k4, 2, i, i + 1))                      # (B, H, 1, dk)
        v_t = bb.emit(_slice(v4, 2, i, i + 1))                      # (B, H, 1, dv)
        if gating:
            state = bb.emit(relax.op.multiply(state, _slice(decay4, 3, i, i + 1)))
        if delta:
            retrieved = relax.op.matmul(k_t, state)                 # (B, H, 1, dv)
            v_t = bb.emit(relax.op.multiply(_slice(beta4, 2, i, i + 1),
                                            relax.op.subtract(v_t, retrieved)))
        state = bb.emit(relax.op.add(state, relax.op.multiply(
            relax.op.permute_dims(k_t, [0, 1, 3, 2]), v_t)))
        read = state if group == 1 else relax.op.repeat(state, group, axis=1)
        outs.append(bb.emit(relax.op.matmul(_slice(q4, 2, i, i + 1), read)))
    o = relax.op.concat(outs, axis=2) if len(outs) > 1 else outs[0]   # (B, Hq, T, dv)
    o = relax.op.multiply(o, scalar(scale, "float32"))
    o = relax.op.reshape(relax.op.permute_dims(o, [0, 2, 1, 3]), [b, t, hq * dv])
    if out_dtype != "float32":
        o = relax.op.astype(o, out_dtype)
    o = bb.emit(o)
    if state_dtype != "float32":
        state = bb.emit(relax.op.astype(state, state_dtype))
    res = [o, state][:len(ctx.node.output)]
    return res[0] if len(res) == 1 else relax.Tuple(res)


# --------------------------------------------------------------------------- #
# RNN (7+), GRU (7+), LSTM (7+): unrolled over the sequence
# --------------------------------------------------------------------------- #

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _activation(ctx, name: str, alpha, beta):
    """The ONNX RNN activation ``name`` as a function of a Relax expression."""
    op = relax.op
    name = name.decode() if isinstance(name, bytes) else str(name)
    low = name.lower()

    def c(v, x):
        return scalar(v, dtype_of(x))

    if low == "sigmoid":
        return op.sigmoid
    if low == "tanh":
        return op.tanh
    if low == "relu":
        return op.nn.relu
    if low == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: op.where(op.greater_equal(x, c(0, x)), x, op.multiply(x, c(a, x)))
    if low == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: op.where(op.greater(x, c(a, x)), x, c(0, x))
    if low == "scaledtanh":
        a, b = (1.0 if alpha is None else alpha), (1.0 if beta is None else beta)
        return lambda x: op.multiply(c(a, x), op.tanh(op.multiply(x, c(b, x))))
    if low == "hardsigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        return lambda x: op.clip(op.add(op.multiply(x, c(a, x)), c(b, x)), 0, 1)
    if low == "elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: op.where(op.greater_equal(x, c(0, x)), x,
                                  op.multiply(c(a, x), op.subtract(op.exp(x), c(1, x))))
    if low == "softsign":
        return lambda x: op.divide(x, op.add(op.abs(x), c(1, x)))
    if low == "softplus":
        return lambda x: op.log(op.add(op.exp(x), c(1, x)))
    if low == "affine":
        a, b = (1.0 if alpha is None else alpha), (0.0 if beta is None else beta)
        return lambda x: op.add(op.multiply(x, c(a, x)), c(b, x))
    refuse(ctx, f"activation {name!r}")


def _fused_recurrence(bb, ctx, kind, inputs, acts, clip, attrs, direction, hidden, layout):
    """The layer as an input projection for every step (one matmul) and one recurrence
    kernel per direction (``schedules/cpu/recurrence.py``), for any (symbolic) sequence
    length and batch; None where that kernel does not cover the node (then it is unrolled
    over a static length): the default activations only, no clip, no peepholes, no
    sequence_lens, GRU only with linear_before_reset=1 (PyTorch's), float32, constant
    W / R / B."""
    from schedules.cpu.recurrence import pack, recurrence_kernel
    from .common import constant_value

    lanes = cpu_lanes()
    x, w, r, b, seq_lens, h0, c0, p = inputs
    n_dir = 2 if direction == "bidirectional" else 1
    n_g = _GATES[kind]
    if lanes is None or clip is not None or seq_lens is not None or p is not None:
        return None
    if [a.decode() if isinstance(a, bytes) else str(a) for a in acts] != \
            _DEFAULT_ACTS[kind] * n_dir or attrs.get("activation_alpha") or \
            attrs.get("activation_beta"):
        return None
    if kind == "GRU" and not int(attrs.get("linear_before_reset", 0)):
        return None
    if dtype_of(x) != "float32" or len(x.ty.shape) != 3:
        return None
    w_np, r_np = constant_value(w), constant_value(r)
    b_np = np.zeros((n_dir, 2 * n_g * hidden), np.float32) if b is None else constant_value(b)
    if w_np is None or r_np is None or b_np is None:
        return None
    op = relax.op
    seq, batch, _ = x.ty.shape.values
    f32 = "float32"
    outs_y, outs_h, outs_c = [], [], []
    for d in range(n_dir):
        reverse = direction == "reverse" or d == 1
        wb, rb = b_np[d, :n_g * hidden], b_np[d, n_g * hidden:]
        bias, rbias = (wb, rb) if kind == "GRU" else (wb + rb, np.zeros_like(rb))
        xw = bb.emit(op.add(op.matmul(x, relax.const(np.ascontiguousarray(w_np[d].T), f32)),
                            relax.const(bias.astype(np.float32), f32)))       # (S, B, G*H)
        rp = pack(r_np[d], kind, lanes)
        states = []
        for init in (h0, c0):
            if init is None:
                states.append(op.zeros(relax.ShapeExpr([batch, hidden]), f32))
            else:
                states.append(op.squeeze(_slice(init, 0, d, d + 1), [0]))
        states = [bb.emit(s_) for s_ in states]
        func = recurrence_kernel(kind, hidden, reverse, lanes)
        gv = bb.add_func(func, f"{kind.lower()}_recurrence")
        out = bb.emit(relax.call_tir(
            gv, relax.Tuple([xw, relax.const(rp, f32), relax.const(rbias.reshape(n_g, hidden)
                                                        .astype(np.float32), f32)] + states),
            [relax.TensorType([seq, batch, hidden], f32),
             relax.TensorType([batch, hidden], f32),
             relax.TensorType([batch, hidden], f32)]))
        outs_y.append(bb.emit(relax.TupleGetItem(out, 0)))
        outs_h.append(bb.emit(relax.TupleGetItem(out, 1)))
        outs_c.append(bb.emit(relax.TupleGetItem(out, 2)))
    return _layer_outputs(bb, ctx, kind, outs_y, outs_h, outs_c, layout)


def _layer_outputs(bb, ctx, kind, ys, hs, cs, layout):
    """The node's outputs from each direction's (S, B, H) outputs and last states: Y
    (S, D, B, H), Y_h and Y_c (D, B, H), in ``layout`` 1 batch first; as many as the node
    names."""
    op = relax.op
    y = _stack(bb, ys, 1)                                  # (S, D, B, H)
    y_h = _stack(bb, hs, 0)                                # (D, B, H)
    y_c = _stack(bb, cs, 0) if kind == "LSTM" else None
    if layout:
        y = bb.emit(op.permute_dims(y, [2, 0, 1, 3]))
        y_h = bb.emit(op.permute_dims(y_h, [1, 0, 2]))
        y_c = bb.emit(op.permute_dims(y_c, [1, 0, 2])) if y_c is not None else None
    outs = [y, y_h, y_c][:len(ctx.node.output)]
    return outs[0] if len(outs) == 1 else relax.Tuple(outs)


def _recurrent(kind: str):
    def convert(bb, inputs, attrs, ctx):
        op = relax.op
        n_g = _GATES[kind]
        x, w, r, b, seq_lens, h0, c0, p = _pad_inputs(inputs, 8)[:8]
        _float_input(ctx, x, "X")
        dtype = dtype_of(x)
        layout = int(attrs.get("layout", 0))
        direction = attr_text(attrs.get("direction"), "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            refuse(ctx, f"direction={direction!r}")
        n_dir = 2 if direction == "bidirectional" else 1
        if kind == "LSTM" and int(attrs.get("input_forget", 0)):
            refuse(ctx, "input_forget=1")
        clip = attrs.get("clip")
        if layout:
            x = op.permute_dims(x, [1, 0, 2])
            h0 = None if h0 is None else op.permute_dims(h0, [1, 0, 2])
            c0 = None if c0 is None else op.permute_dims(c0, [1, 0, 2])
        x = bb.emit(x)
        ws = static_shape(w)
        hidden = static_shape(r)[-1]
        if ws[0] != n_dir or ws[1] != n_g * hidden:
            refuse(ctx, f"W of shape {ws} for direction={direction} and hidden size {hidden}")
        acts = attrs.get("activations")
        n_act = len(_DEFAULT_ACTS[kind])
        acts = list(acts) if acts else _DEFAULT_ACTS[kind] * n_dir
        fused = _fused_recurrence(bb, ctx, kind, (x, w, r, b, seq_lens, h0, c0, p), acts,
                                  clip, attrs, direction, hidden, layout)
        if fused is not None:
            return fused
        seq, batch, _ = static_shape(x)
        if seq == 0:
            refuse(ctx, "an empty sequence")
        if len(acts) != n_act * n_dir:
            refuse(ctx, f"{len(acts)} activations (expects {n_act * n_dir})")
        alphas = list(attrs.get("activation_alpha", []) or [])
        betas = list(attrs.get("activation_beta", []) or [])
        fns = [_activation(ctx, a, alphas[i] if i < len(alphas) else None,
                           betas[i] if i < len(betas) else None) for i, a in enumerate(acts)]
        lbr = int(attrs.get("linear_before_reset", 0)) if kind == "GRU" else 0

        def clipped(v):
            return v if clip is None else op.clip(v, -float(clip), float(clip))

        lens = None
        if seq_lens is not None:
            lens = bb.emit(op.reshape(op.astype(seq_lens, "int64"), [batch, 1]))

        ys, hs, cs = [], [], []
        for d in range(n_dir):
            f = fns[d * n_act:(d + 1) * n_act]
            wd = bb.emit(op.squeeze(_slice(w, 0, d, d + 1), [0]))          # (G*H, I)
            rd = bb.emit(op.permute_dims(op.squeeze(_slice(r, 0, d, d + 1), [0])))  # (H, G*H)
            # X W^T + Wb for every step at once: (S, B, G*H)
            xw = op.matmul(x, op.permute_dims(wd))
            rb = None
            if b is not None:
                bd = bb.emit(op.squeeze(_slice(b, 0, d, d + 1), [0]))       # (2*G*H,)
                wb = _slice(bd, 0, 0, n_g * hidden)
                rb = bb.emit(_slice(bd, 0, n_g * hidden, 2 * n_g * hidden))
                if kind == "GRU" and lbr:
                    xw = op.add(xw, wb)
                else:
                    xw = op.add(op.add(xw, wb), rb)
                    rb = None
            xw = bb.emit(xw)
            zeros = relax.const(np.zeros((batch, hidden), np.dtype(dtype)), dtype)
            h = bb.emit(op.squeeze(_slice(h0, 0, d, d + 1), [0])) if h0 is not None else zeros
            cc = None
            if kind == "LSTM":
                cc = bb.emit(op.squeeze(_slice(c0, 0, d, d + 1), [0])) if c0 is not None \
                    else zeros
                if p is not None:
                    pd = bb.emit(op.squeeze(_slice(p, 0, d, d + 1), [0]))
                    p_i, p_o, p_f = (bb.emit(_slice(pd, 0, k * hidden, (k + 1) * hidden))
                                     for k in range(3))
            if kind == "GRU":
                # the recurrent weight's and bias' slices once, not once per step: each
                # step's slice became a constant of its own (a packed copy of the weight
                # per step: 150 MB of params for 2 x 100 steps of hidden 256)
                rd_zr = bb.emit(_slice(rd, 1, 0, 2 * hidden))
                rd_h = bb.emit(_slice(rd, 1, 2 * hidden, 3 * hidden))
                rb_zr = None if rb is None else bb.emit(_slice(rb, 0, 0, 2 * hidden))
                rb_h = None if rb is None else bb.emit(_slice(rb, 0, 2 * hidden, 3 * hidden))
            steps = range(seq) if (direction == "forward" or d == 0 and
                                   direction == "bidirectional") else range(seq - 1, -1, -1)
            y_steps = [None] * seq
            for t in steps:
                gx = bb.emit(op.squeeze(_slice(xw, 0, t, t + 1), [0]))     # (B, G*H)

                def gate(g, src):
                    return _slice(src, 1, g * hidden, (g + 1) * hidden)

                if kind == "RNN":
                    h_new = f[0](clipped(op.add(gx, op.matmul(h, rd))))
                    c_new = None
                elif kind == "GRU":
                    hr = bb.emit(op.matmul(h, rd_zr))
                    if rb_zr is not None:
                        hr = bb.emit(op.add(hr, rb_zr))
                    z = bb.emit(f[0](clipped(op.add(gate(0, gx), gate(0, hr)))))
                    rr = bb.emit(f[0](clipped(op.add(gate(1, gx), gate(1, hr)))))
                    rh = rd_h
                    if lbr:
                        hh = op.matmul(h, rh)
                        if rb_h is not None:
                            hh = op.add(hh, rb_h)
                        hh = op.multiply(rr, hh)
                    else:
                        hh = op.matmul(op.multiply(rr, h), rh)
                    ht = bb.emit(f[1](clipped(op.add(gate(2, gx), hh))))
                    one = scalar(1, dtype)
                    h_new = op.add(op.multiply(op.subtract(one, z), ht), op.multiply(z, h))
                    c_new = None
                else:  # LSTM, gates i, o, f, c
                    g_all = bb.emit(op.add(gx, op.matmul(h, rd)))
                    gi, go, gf, gc = (gate(k, g_all) for k in range(4))
                    if p is not None:
                        gi = op.add(gi, op.multiply(p_i, cc))
                        gf = op.add(gf, op.multiply(p_f, cc))
                    i_t = bb.emit(f[0](clipped(gi)))
                    f_t = bb.emit(f[0](clipped(gf)))
                    c_t = bb.emit(f[1](clipped(gc)))
                    c_new = bb.emit(op.add(op.multiply(f_t, cc), op.multiply(i_t, c_t)))
                    if p is not None:
                        go = op.add(go, op.multiply(p_o, c_new))
                    o_t = bb.emit(f[0](clipped(go)))
                    h_new = op.multiply(o_t, f[2](c_new))
                h_new = bb.emit(h_new)
                if lens is not None:
                    # steps at or past a batch entry's length leave its state alone and
                    # output 0 (in reverse, the state stays initial until its last step)
                    live = bb.emit(op.less(scalar(t, "int64"), lens))
                    y_steps[t] = bb.emit(op.where(live, h_new, zeros))
                    h = bb.emit(op.where(live, h_new, h))
                    if c_new is not None:
                        cc = bb.emit(op.where(live, c_new, cc))
                else:
                    y_steps[t] = h = h_new
                    cc = c_new if c_new is not None else cc
            ys.append(_stack(bb, y_steps, 0))                             # (S, B, H)
            hs.append(h)
            cs.append(cc)
        return _layer_outputs(bb, ctx, kind, ys, hs, cs, layout)

    convert.__doc__ = (f"{kind}: forward, reverse or bidirectional, layout 0/1, bias, "
                       "initial state, sequence_lens (per-batch masking), the ONNX "
                       "activation functions with alpha/beta, clip"
                       + (", peepholes" if kind == "LSTM" else "")
                       + (", linear_before_reset" if kind == "GRU" else "")
                       + "; on CPUs one recurrence kernel per direction over any "
                       "(symbolic) length where it covers the node "
                       "(schedules/cpu/recurrence.py), else unrolled over the static "
                       "sequence length.")
    return convert


for _kind in _GATES:
    register(_kind, since=7)(_recurrent(_kind))
