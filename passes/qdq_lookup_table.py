"""Q(f(DQ(x))) => table[x]: an 8-bit function of one 8-bit tensor as a 256-entry lookup.

QDQ models (``quantize_static``) leave activations between a DequantizeLinear and a
QuantizeLinear as float ops: EfficientNet's swish ``Q(DQ(a) * DQ(Q(sigmoid(DQ(a)))))``,
MobileNetV3's hard-swish, a transformer's GELU after its first FC.  With per-tensor
constant scales and zero points, and every other operand a scalar constant, the result
depends on the 8-bit value of ``x`` alone: 256 possible inputs.  The chain is evaluated
here on all of them (numpy, float32 as the kernels compute: ``round`` half to even,
saturating ``quantize``) and replaced by ``take(table, x)``: a kernel of its own (FuseOps
fuses no injective op into a matmul's or conv's epilogue) that reads and writes a byte per
element, where the chain cost an erf / exp polynomial and two requantisations per element
in the producer's epilogue.  onnxruntime computes QLinearSigmoid / QLinearLeakyRelu the
same way (a table per node).

Only chains with an op that costs more than a few vector instructions per element
(``_COSTLY``: exp, erf, tanh, sigmoid, division...) are replaced: a plain requantisation
stays the arithmetic that ``qdq_conv_integer`` / ``qdq_matmul_integer`` fuse.  Runs first,
while the Q / DQ ops are still ops (``qdq_conv_integer`` turns the activations' into
arithmetic).  A NaN inside the chain quantizes to the low end of the 8-bit type, as the
kernels' saturating cast does.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from .context import GraphPass, PassReport
from .dataflow import Match, qdq_params, rewrite_matches

RULE = "Q(f(DQ(x))) => table[x] (256 entries)"
_BYTE = ("uint8", "int8")
_ERF = np.vectorize(math.erf, otypes=[np.float64])
_UNARY = {
    "negative": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda v: 1.0 / np.sqrt(v), "tanh": np.tanh, "floor": np.floor,
    "ceil": np.ceil, "round": np.rint, "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "erf": _ERF, "nn.relu": lambda v: np.maximum(v, 0),
    "nn.silu": lambda v: v / (1.0 + np.exp(-v)),
    "nn.gelu": lambda v: 0.5 * v * (1.0 + _ERF(v / math.sqrt(2.0))),
    "nn.gelu_tanh": lambda v: 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                     * (v + 0.044715 * v ** 3))),
}
_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
           "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum,
           "power": np.power}
# a chain without one of these is arithmetic the requantisation passes fuse anyway
_COSTLY = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "nn.silu", "nn.gelu",
           "nn.gelu_tanh", "divide", "power"}
_MAX_NODES = 64  # operands visited per chain


class QdqLookupTable(GraphPass):
    """QuantizeLinear of an elementwise float function of one dequantized 8-bit tensor
    (per-tensor, scalar constants elsewhere) => a 256-entry table lookup."""

    name = "qdq_lookup_table"
    opt_level = 2
    options = {"layout": "NCHW"}

    def rewrite(self, mod, report: PassReport, options: dict):
        # A table lookup (take) cannot follow convert_layout's blocked layouts (TVM's
        # ConvertLayout has no layout rule for take: a transform each side of it) and
        # FuseOps does not fuse it into a conv's epilogue: with the graph converted, 4-D
        # conv activations keep the arithmetic.  QDQ EfficientNet-B0 with tables anyway:
        # 141 separate kernels, 12 layout transforms, 11.4 -> 12.8 ms one thread.
        keep_4d = str(options["layout"]) != "NCHW"

        def match(df, var):
            m = _match(df, var)
            return None if m is None or (keep_4d and m.info["x"].ty.ndim == 4) else m
        return rewrite_matches(mod, report, match, _plan)


def _match(df, var):
    q = df.call(var, "quantize")
    if q is None or str(q.attrs.out_dtype) not in _BYTE:
        return None
    params = qdq_params(df, q)
    if params is None:
        return None
    state = {"x": None, "ops": set(), "nodes": 0}
    if not _walk(df, q.args[0], state) or state["x"] is None:
        return None
    if not state["ops"] & _COSTLY:
        return None
    x = state["x"]
    info = np.iinfo(str(x.ty.dtype))
    codes = np.arange(info.min, info.max + 1).astype(str(x.ty.dtype))
    table = _quantize(_evaluate(df, q.args[0], x, codes, {}), *params, str(q.attrs.out_dtype))
    return Match(RULE, var, [], {"x": x, "table": table, "offset": -int(info.min)})


def _walk(df, expr, state) -> bool:
    """True when ``expr`` is an elementwise chain over scalar constants and per-tensor
    dequantizes of one 8-bit tensor (recorded in ``state["x"]``).  A ``DQ(Q(inner))``
    (a requantised intermediate: the sigmoid inside a swish) is read through when
    ``inner`` is itself such a chain of the same tensor, else it is the tensor."""
    state["nodes"] += 1
    if state["nodes"] > _MAX_NODES:
        return False
    c = df.const(expr)
    if c is not None:
        return c.size == 1 and c.dtype.kind == "f"
    if str(getattr(expr.ty, "dtype", "")) != "float32":
        return False
    dq = df.call(expr, "dequantize")
    if dq is not None:
        src = df.source(dq.args[0])
        if str(src.ty.dtype) not in _BYTE or qdq_params(df, dq) is None:
            return False
        if state["x"] is not None and state["x"].same_as(src):
            return True
        q = df.call(src, "quantize")
        if q is not None and qdq_params(df, q) is not None:
            trial = dict(state, ops=set(state["ops"]))
            if _walk(df, q.args[0], trial) and trial["x"] is not None:
                state.update(trial)
                state["ops"].add("quantize")
                return True
        if state["x"] is None:
            state["x"] = src
            return True
        return False
    call = df.call(expr, *_UNARY, *_BINARY, "clip", "astype")
    if call is None:
        return False
    name = call.op.name[6:]
    if name == "astype" and str(call.attrs.dtype) != "float32":
        return False
    state["ops"].add(name)
    return all(_walk(df, a, state) for a in _tensors(call))


def _tensors(call) -> list:
    """The tensor operands of ``call`` (clip's bounds and astype's dtype are attributes
    or scalar immediates)."""
    return [a for a in call.args if isinstance(a, (relax.Var, GenericConst))]


def _quantize(v: np.ndarray, scale: float, zero: int, dtype: str) -> np.ndarray:
    """QuantizeLinear in float32: round half to even (x / scale), plus the zero point,
    saturated to ``dtype`` (NaN to the low end)."""
    info = np.iinfo(dtype)
    r = np.rint(v.astype(np.float32) / np.float32(scale)).astype(np.float64) + zero
    r = np.where(np.isnan(r), info.min, r)
    return np.clip(r, info.min, info.max).astype(dtype)


def _dequantize(codes: np.ndarray, scale: float, zero: int) -> np.ndarray:
    return ((codes.astype(np.int32) - zero).astype(np.float32) * np.float32(scale))


def _evaluate(df, expr, x, codes, cache) -> np.ndarray:
    """``expr`` (a chain ``_walk`` accepted, of ``x``) on the values ``codes`` of ``x``:
    float32, one value per code."""
    key = df.source(expr)
    if key in cache:
        return cache[key]
    c = df.const(expr)
    if c is not None:
        out = np.float32(c.reshape(()))
    elif (dq := df.call(expr, "dequantize")) is not None:
        s, z = qdq_params(df, dq)
        if df.source(dq.args[0]).same_as(x):     # DQ(x)
            out = _dequantize(codes, s, z)
        else:                                    # DQ(Q(inner)), inner a chain of x
            q = df.call(dq.args[0], "quantize")
            qs, qz = qdq_params(df, q)
            inner = _quantize(_evaluate(df, q.args[0], x, codes, cache), qs, qz,
                              str(q.attrs.out_dtype))
            out = _dequantize(inner, s, z)
    else:
        call = df.value(expr)
        name = call.op.name[6:]
        args = [_evaluate(df, a, x, codes, cache) for a in _tensors(call)]
        with np.errstate(all="ignore"):
            if name in _UNARY:
                out = _UNARY[name](args[0].astype(np.float32))
            elif name in _BINARY:
                out = _BINARY[name](args[0], args[1])
            elif name == "clip":
                lo, hi = (float(a.value) for a in call.args[1:3])
                out = np.clip(args[0], lo, hi)
            else:  # astype to float32
                out = args[0]
    out = np.asarray(out, dtype=np.float32)
    cache[key] = out
    return out


def _plan(m):
    def emit(e):
        index = relax.op.astype(m.info["x"], "int32")
        if m.info["offset"]:
            index = relax.op.add(e.emit(index), relax.const(m.info["offset"], "int32"))
        return relax.op.take(relax.const(m.info["table"]), e.emit(index), axis=0)
    return emit
