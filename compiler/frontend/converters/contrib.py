"""onnxc's FlexAttention converter (domain ``ai.onnx.preview``, version 1).

``Y = cast(score_mod? -> softmax -> prob_mod?)(cast(Q·s @ (K·s)^T)) @ cast(V)``: scaled
dot-product attention over rank-4 Q, K, V with grouped-query heads, where the optional
``score_mod`` and ``prob_mod`` graph attributes are converted inline by the importer's
subgraph machinery (``control_flow.convert_subgraph``) with their one input bound to the
scores / probabilities.  The steps, dtypes and the ``s = sqrt(float32(scale))`` pre-scaling
follow ONNX's reference (``onnx/reference/ops/aionnx_preview/op_flex_attention.py``).

The scores (and everything after them) are computed in ``softmax_precision``: float32, or
float64 for double inputs.  A float16 or bfloat16 softmax precision, and bfloat16 inputs,
are refused: the reference rounds every step to the narrow type, which onnxc does not
reproduce (it accumulates narrow types in float32).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto
from tvm import relax

from .common import refuse, static_shape, dtype_of
from ..control_flow import convert_subgraph
from ..registry import register_op

PREVIEW = "ai.onnx.preview"

# softmax_precision values onnxc computes in (TensorProto element type -> dtype)
_PRECISIONS = {TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64"}


def _softmax_dtype(ctx, dtype: str, attrs) -> str:
    """The dtype of the scores, softmax and final matmul (the reference's rule)."""
    precision = attrs.get("softmax_precision")
    if precision is None:
        return "float64" if dtype == "float64" else "float32"
    if int(precision) not in _PRECISIONS:
        refuse(ctx, f"softmax_precision={int(precision)} (only float32 (1) and double (11): "
                     "the reference rounds each narrow-type step)")
    return _PRECISIONS[int(precision)]


def _modifier(bb, ctx, attrs, name: str, x, compute: str):
    """Apply the ``name`` graph attribute (score_mod / prob_mod) to ``x``, if present."""
    graph = attrs.get(name)
    if graph is None:
        return x
    if len(graph.input) != 1 or len(graph.output) != 1:
        refuse(ctx, f"{name} with {len(graph.input)} inputs and {len(graph.output)} outputs "
                     "(FlexAttention needs exactly 1 and 1)")
    (out,) = convert_subgraph(ctx, graph, {graph.input[0].name: x}, f"{ctx.label} {name}")
    (out,) = ctx.importer._shape_values_as_tensors([out], f"{ctx.label} {name}")
    if static_shape(out) != static_shape(x):
        refuse(ctx, f"{name} output of shape {static_shape(out)} (its input has {static_shape(x)}; the "
                     "modifier must keep the shape)")
    if dtype_of(out) != compute:  # the reference casts the modifier's output back
        out = relax.op.astype(out, compute)
    return bb.normalize(out)


@register_op(PREVIEW, "FlexAttention", since=1, implementation="onnxc")
def flex_attention(bb, inputs, attrs, ctx):
    """FlexAttention: Q (B, Hq, L, E), K (B, Hkv, S, E), V (B, Hkv, S, Ev) -> (B, Hq, L, Ev);
    optional ``scale`` (default 1/sqrt(E)), ``softmax_precision``, ``score_mod``,
    ``prob_mod``."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    dtype = dtype_of(q)
    if dtype_of(k) != dtype or dtype_of(v) != dtype:
        refuse(ctx, f"Q, K, V of types {dtype}, {dtype_of(k)}, {dtype_of(v)}")
    if dtype not in ("float16", "float32", "float64"):
        refuse(ctx, f"inputs of type {dtype}")
    qd, kd, vd = static_shape(q), static_shape(k), static_shape(v)
    if len(qd) != 4 or len(kd) != 4 or len(vd) != 4:
        refuse(ctx, f"Q, K, V of shapes {qd}, {kd}, {vd} (rank 4 is required)")
    if kd[1] != vd[1] or kd[2] != vd[2] or qd[3] != kd[3] or qd[0] != kd[0] or qd[0] != vd[0] \
            or kd[1] <= 0 or qd[1] % kd[1]:
        refuse(ctx, f"Q, K, V of shapes {qd}, {kd}, {vd} (inconsistent batch, heads, "
                     "sequence or head sizes)")
    compute = _softmax_dtype(ctx, dtype, attrs)
    scale = attrs.get("scale")
    scale = 1.0 / np.sqrt(qd[3]) if scale is None else float(scale)
    # the reference pre-scales Q and K by sqrt(scale), computed in float32
    root = relax.const(np.array(np.sqrt(np.float32(scale)), dtype=dtype), dtype)
    repeat = qd[1] // kd[1]
    if repeat > 1:  # GQA: query head h uses K/V head h // repeat
        k = bb.emit(relax.op.repeat(k, repeat, axis=1))
        v = bb.emit(relax.op.repeat(v, repeat, axis=1))
    qs = bb.emit(relax.op.multiply(q, root))
    kt = bb.emit(relax.op.permute_dims(relax.op.multiply(k, root), [0, 1, 3, 2]))
    scores = bb.emit(relax.op.matmul(qs, kt))
    if compute != dtype:
        scores = bb.emit(relax.op.astype(scores, compute))
    scores = _modifier(bb, ctx, attrs, "score_mod", scores, compute)
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    probs = _modifier(bb, ctx, attrs, "prob_mod", probs, compute)
    vc = v if compute == dtype else bb.emit(relax.op.astype(v, compute))
    out = bb.emit(relax.op.matmul(probs, vc))
    return out if compute == dtype else relax.op.astype(out, dtype)
