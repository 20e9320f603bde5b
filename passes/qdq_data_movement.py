"""Q(op(DQ(q, s, z)), s, z) => op(q) for data movement and max pooling on 8-bit tensors.

onnxruntime's quantizer wraps the ops that only move data (Reshape, Transpose, Slice,
Concat, Squeeze, Unsqueeze, Flatten) and MaxPool in a DequantizeLinear before and a
QuantizeLinear after that share the input's scale and zero point (its "direct 8-bit"
ops).  Per tensor, dequantization commutes with moving data, and with max (it is
increasing), so ``Q(op(DQ(q)))`` with the same parameters is ``op(q)`` exactly: round((q -
z) s / s) + z is q.  The op then moves bytes instead of dequantizing, moving floats and
requantizing: ShuffleNetV2's channel shuffle (split, concat, reshape, transpose, reshape,
each between a DQ and a Q) was one scalar kernel of four requantisations per element,
327 us against onnxruntime's 15 (one thread).  A concat needs every input dequantized with
the output's parameters; the parts of a Split, each quantized with its input's parameters,
become one split of the bytes.  Runs first, while the Q / DQ ops are still ops.
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Match, qdq_params, rewrite_matches

RULE = "Q(op(DQ(q))) => op(q) (data movement / max pool, same scale and zero point)"
_BYTE = ("uint8", "int8")
# ops whose result reads each output element from one input element (or the max of some)
_MOVES = ("reshape", "permute_dims", "strided_slice", "squeeze", "expand_dims", "flatten",
          "nn.max_pool2d", "nn.max_pool1d", "nn.max_pool3d")


class QdqDataMovement(GraphPass):
    """QuantizeLinear of a data-movement op (or max pool, or concat) over DequantizeLinear
    of 8-bit tensors with the same per-tensor scale and zero point => the op on the bytes."""

    name = "qdq_data_movement"
    opt_level = 2

    def rewrite(self, mod, report: PassReport, options: dict):
        _SPLITS.clear()
        try:
            return rewrite_matches(mod, report, _match, _plan)
        finally:
            _SPLITS.clear()


def _source(df, expr, params, dtype):
    """``q`` when ``expr`` is DQ(q) of a ``dtype`` tensor with ``params``, else None."""
    dq = df.call(expr, "dequantize")
    if dq is None or qdq_params(df, dq) != params:
        return None
    q = dq.args[0]
    return q if str(q.ty.dtype) == dtype else None


def _match(df, var):
    quant = df.call(var, "quantize")
    if quant is None or str(quant.attrs.out_dtype) not in _BYTE:
        return None
    params = qdq_params(df, quant)
    if params is None or params[0] <= 0:
        return None
    dtype = str(quant.attrs.out_dtype)
    item = df.value(quant.args[0])
    if isinstance(item, relax.TupleGetItem):  # a half of Split (ShuffleNet's chunk)
        split = df.call(item.tuple_value, "split")
        src = _source(df, split.args[0], params, dtype) if split is not None else None
        if src is None:
            return None
        return Match(RULE, var, [], {"op": split, "args": [src], "index": item.index,
                                     "key": df.source(item.tuple_value)})
    op = df.call(quant.args[0], *_MOVES, "concat")
    if op is None:
        return None
    if op.op.name == "relax.concat":
        parts = df.value(op.args[0])
        if not isinstance(parts, relax.Tuple):
            return None
        sources = [_source(df, p, params, dtype) for p in parts.fields]
        if any(s is None for s in sources):
            return None
        return Match(RULE, var, [], {"op": op, "args": [relax.Tuple(sources)]})
    src = _source(df, op.args[0], params, dtype)
    if src is None:
        return None
    return Match(RULE, var, [], {"op": op, "args": [src, *op.args[1:]]})


def _plan(m):
    op = m.info["op"]
    if "index" not in m.info:
        return lambda e: relax.Call(op.op, m.info["args"], op.attrs, op.ty_args)

    def item(e):  # one split of the bytes for all of its quantized parts
        parts = _SPLITS.get(m.info["key"])
        if parts is None:
            parts = _SPLITS[m.info["key"]] = e.emit(
                relax.Call(op.op, m.info["args"], op.attrs, op.ty_args))
        return relax.TupleGetItem(parts, m.info["index"])
    return item


_SPLITS: dict = {}  # split binding -> its 8-bit split, within one rewrite (QdqDataMovement)
