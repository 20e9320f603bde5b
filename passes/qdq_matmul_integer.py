"""matmul(DQ(xq, sx, zx), DQ(Wq, sw, zw)) => float32(matmul_int32(xq - zx, Wq - zw)) * (sx * sw).

QDQ models (``quantize_static``) compute a quantized MatMul / Gemm as a float matmul of
dequantized operands (Gemm's transB: of the transposed dequantized weight).  With ``Wq`` a constant 8-bit weight (zero point and scale per tensor
or per output column) and ``xq`` an 8-bit activation with a per-tensor scale and zero
point, the product is rewritten in the form TVM's MatMulInteger converter emits, so that
``pack_int_matmul`` packs it onto the integer kernel (``cpu.matmul_int8``) and FuseOps fuses
the scale multiply, the bias add and the next QuantizeLinear (requantisation) into its
epilogue.  Integer products are exact, so the result equals the float reference up to the
float rounding of the sum.  Runs before fold_constants, which would fold ``DQ(Wq)`` into a
float weight and lose the integers.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Match, rewrite_matches

RULE = "matmul(DQ(xq), DQ(Wq)) => float32(matmul_int32(xq - zx, Wq - zw)) * sx * sw"
_BYTE = ("uint8", "int8")


class QdqMatmulInteger(GraphPass):
    """Float matmul of a dequantized 8-bit activation by a dequantized constant 8-bit weight
    => int32 matmul and a scale (pack_int_matmul then packs it)."""

    name = "qdq_matmul_integer"
    opt_level = 2

    def rewrite(self, mod, report: PassReport, options: dict):
        # the dequantized activation may feed other matmuls (Q, K, V): only the matmul is
        # replaced, so the match holds its root alone
        return rewrite_matches(mod, report, _match, _plan)


def _size(x) -> int | None:
    shape = getattr(x.ty, "shape", None)
    if shape is None:
        return None
    try:
        return int(np.prod([int(d) for d in shape]))
    except TypeError:
        return None


def _match(df, var):
    call = df.call(var, "matmul")
    if call is None or str(call.ty.dtype) != "float32":
        return None
    x, w = call.args
    # Gemm(transB=1) imports as matmul(A, permute_dims(DQ(Wq [N, K])))
    tr = df.call(w, "permute_dims")
    if tr is not None:
        axes = tr.attrs.axes
        if axes is None or [int(a) for a in axes] != [1, 0]:
            return None
        w = tr.args[0]
    dx, dw = df.call(x, "dequantize"), df.call(w, "dequantize")
    if dx is None or dw is None:
        return None
    xq, sx, zx = dx.args
    wq, sw, zw = dw.args
    wq_c, sw_c, zw_c = df.const(wq), df.const(sw), df.const(zw)
    if wq_c is None or sw_c is None or zw_c is None or wq_c.ndim != 2:
        return None
    col_axis = (1, -1)
    if tr is not None:  # [N, K] stored: the product's columns are its axis 0
        wq_c, col_axis = wq_c.T, (0, -2)
    k, n = wq_c.shape
    if str(xq.ty.dtype) not in _BYTE or str(wq_c.dtype) not in _BYTE:
        return None
    if _size(sx) != 1 or _size(zx) != 1 or sw_c.dtype != np.float32:
        return None
    # the weight's scale / zero point: per tensor, or per output column
    per_col = sw_c.size == n and n > 1
    if not (sw_c.size == 1 or (per_col and int(dw.attrs.axis) in col_axis)):
        return None
    if zw_c.size not in (1, n) or (zw_c.size == n > 1 and not per_col):
        return None
    xs = getattr(x.ty, "shape", None)
    if xs is None or len(xs) < 2 or int(xs[-1]) != k:
        return None
    w32 = wq_c.astype(np.int32) - zw_c.astype(np.int32).reshape(1, -1 if zw_c.size > 1 else 1)
    scale = sw_c.reshape(-1) if per_col else sw_c.reshape(())
    return Match(RULE, var, info={"xq": xq, "sx": sx, "zx": zx, "w32": w32, "sw": scale})


def _plan(m):
    i = m.info

    def build(em):
        a = em.emit(relax.op.subtract(
            relax.op.astype(i["xq"], "int32"),
            relax.op.astype(relax.op.reshape(i["zx"], []), "int32")))
        acc = em.emit(relax.op.matmul(a, relax.const(i["w32"]), out_dtype="int32"))
        scale = relax.op.multiply(relax.op.reshape(i["sx"], []), relax.const(i["sw"]))
        return relax.op.multiply(relax.op.astype(acc, "float32"), scale)
    return build
