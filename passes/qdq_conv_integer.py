"""conv2d(DQ(xq, sx, zx), DQ(Wq, sw, zw)) => float32(conv2d_int32(int16(xq) - zx, Wq - zw)) * (sx * sw);
Q(x) / DQ(q) per tensor => elementwise arithmetic.

QDQ models (``quantize_static``) compute a quantized Conv as a float conv of dequantized
operands.  With ``Wq`` a constant 8-bit weight (scale and zero point per tensor or per output
channel, axis 0) and ``xq`` an 8-bit activation with one scale and zero point, the conv is
rewritten as an int32-accumulating conv of the activation widened to int16 minus its zero
point (the conv's zero padding is then the dequantized 0, as in the float model) by the
integer weight ``Wq - zw``, then one float multiply by ``sx * sw[f]``.  Integer products are
exact.  The bias add, and the QuantizeLinear after it (requantisation), stay elementwise ops
that FuseOps fuses into the conv's epilogue.  ``pack_int_conv`` (after convert_layout) packs
the blocked int conv onto the integer kernel, the widening becoming a stage of it.

Per-tensor activation QuantizeLinear / DequantizeLinear become their arithmetic
(``clip(round(x / s) + z)``, ``(float(q) - z) * s``), as TVM legalizes them:
convert_layout carries that through NCHW[b]c, where it stops at relax.quantize, so the
8-bit activations between convs stay blocked. Grouped convs are integer where every group
holds whole channel blocks, in and out (RegNet-X's 24-channel groups: three blocks of 8);
depthwise convs and other groups stay float (the report counts them), and so do convs
whose output channels have no channel block (``convert_layout.channel_block``: whole
blocks of the target, or half blocks of 8 on 16-lane targets, whose integer dot is the
256-bit instruction; options ``layout`` and ``block``, set by the driver as
convert_layout's): convert_layout keeps such a conv NCHW, where an int32 conv had no
kernel but TVM's reduction (2.5 ms against onnxruntime's 55 us for a 24 -> 72 1x1), so it
stays float. Runs before fold_constants, which would fold ``DQ(Wq)`` into a float weight
and lose the integers.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .context import GraphPass, PassReport
from .convert_layout import channel_block
from .dataflow import Match, record, rewrite

RULE = "conv2d(DQ(xq), DQ(Wq)) => float32(conv2d_int32(int16(xq) - zx, Wq - zw)) * sx * sw"
RULE_Q = "Q(x) => clip(round(x * (1 / s)) + z)"
RULE_DQ = "DQ(q) => (float(q) - z) * s"
GROUPED = "grouped/depthwise QDQ conv left float: groups of no whole channel blocks"
UNBLOCKED = "QDQ conv left float: output channels of no channel block"
_BYTE = ("uint8", "int8")


class QdqConvInteger(GraphPass):
    """Float conv of a dequantized 8-bit activation by a dequantized constant 8-bit weight
    => int32 conv and a scale; per-tensor activation Q / DQ => elementwise arithmetic."""

    name = "qdq_conv_integer"
    opt_level = 2
    # the activation layout convert_layout will choose and its channel block (the driver
    # sets both from the target, as convert_layout's)
    options = {"layout": "NCHWc", "block": 16}

    def rewrite(self, mod, report: PassReport, options: dict):
        from .dataflow import Dataflow

        df = Dataflow(mod)
        blocks = int(options["block"]) if str(options["layout"]) == "NCHWc" else 0
        matches, left = [], {GROUPED: 0, UNBLOCKED: 0}
        for b in df.roots():
            m = _match_conv(df, b.var, blocks) or _match_qdq(df, b.var)
            if isinstance(m, str):
                left[m] += 1
            elif m is not None:
                matches.append(m)
        report.rewrites.update({why: n for why, n in left.items() if n})
        if not any(m.rule == RULE for m in matches):
            return mod  # no integer conv: leave the Q / DQ ops of other models as they are
        record(report, df, matches)
        return rewrite(mod, matches, _plan)


def _scalar_param(df, x, dtype=None):
    """The value of a one-element constant (of ``dtype`` when given), else None."""
    c = df.const(x)
    if c is None or c.size != 1 or (dtype is not None and str(c.dtype) != dtype):
        return None
    return c.reshape(())


def _match_conv(df, var, block: int):
    """The integer rewrite of conv2d ``var`` (a Match), GROUPED or UNBLOCKED when it stays
    float, None when it is no QDQ conv.  ``block``: the channel block convert_layout will
    give whole-block convs (0: none, the graph stays NCHW)."""
    call = df.call(var, "nn.conv2d")
    if call is None or str(call.ty.dtype) != "float32":
        return None
    a = call.attrs
    if (a.data_layout != "NCHW" or a.kernel_layout != "OIHW"
            or (a.out_layout or "NCHW") != "NCHW"):
        return None
    x, w = call.args
    dx, dw = df.call(x, "dequantize"), df.call(w, "dequantize")
    if dx is None or dw is None:
        return None
    xq, sx, zx = dx.args
    wq, sw, zw = (df.const(e) for e in dw.args)
    if str(xq.ty.dtype) not in _BYTE or wq is None or sw is None or zw is None:
        return None
    sxc, zxc = _scalar_param(df, sx, "float32"), _scalar_param(df, zx)
    if sxc is None or zxc is None or str(wq.dtype) not in _BYTE or wq.ndim != 4:
        return None
    f = wq.shape[0]
    if sw.dtype != np.float32 or sw.size not in (1, f) or zw.size not in (1, f):
        return None
    if f > 1 and (sw.size == f or zw.size == f) and int(dw.attrs.axis) not in (0, -4):
        return None
    g = int(a.groups)
    if not block or not channel_block(f, block):
        return GROUPED if g != 1 else UNBLOCKED
    if g != 1:
        # grouped: integer where every group holds whole channel blocks, in and out, as
        # convert_layout blocks such a conv (RegNet-X's 24-channel groups in blocks of 8)
        c = int(wq.shape[1]) * g
        bi, bo = channel_block(c, block), channel_block(f, block)
        if not bi or (c // g) % bi or (f // g) % bo:
            return GROUPED
    w16 = wq.astype(np.int16) - zw.astype(np.int16).reshape(-1, 1, 1, 1)
    scale = (np.float32(sxc) * sw.reshape(-1)).astype(np.float32)
    return Match(RULE, var, info={"xq": xq, "zx": int(zxc), "w16": w16, "scale": scale,
                                  "attrs": a})


def _match_qdq(df, var):
    """A per-tensor Q / DQ of an activation (scale and zero point constant scalars)."""
    call = df.call(var, "quantize", "dequantize")
    if call is None:
        return None
    x, s, z = call.args
    sc, zc = _scalar_param(df, s, "float32"), _scalar_param(df, z)
    if sc is None or zc is None or df.const(x) is not None:
        return None
    if call.op.name == "relax.quantize":
        if str(x.ty.dtype) != "float32" or str(call.ty.dtype) not in _BYTE:
            return None
        return Match(RULE_Q, var, info={"x": x, "s": float(sc), "z": int(zc),
                                        "dtype": str(call.ty.dtype)})
    if str(x.ty.dtype) not in _BYTE or str(call.ty.dtype) != "float32":
        return None
    return Match(RULE_DQ, var, info={"x": x, "s": float(sc), "z": int(zc)})


def _plan(m):
    i = m.info
    if m.rule == RULE_Q:
        lo, hi = np.iinfo(i["dtype"]).min, np.iinfo(i["dtype"]).max

        def quantize(em):
            # x * (1 / s): a multiply in the conv epilogue where a divide cost as much as a 1x1
            # conv's 64-deep sum (onnxruntime's QLinearConv, what its QDQ fusion runs, also
            # requantises with one multiply); may round a tie the other way: one step, rarely
            r = relax.op.round(relax.op.multiply(
                i["x"], relax.const(np.float32(1.0) / np.float32(i["s"]), "float32")))
            if i["z"]:
                r = relax.op.add(r, relax.const(float(i["z"]), "float32"))
            # saturated in int32 with max / min: not relax.clip, at which TVM's ConvertLayout
            # stops; not float max / min, whose NaN-keeping selects read their operand twice
            # (a conv epilogue with two requantisations inlined held 16 copies of itself).
            # |x / s| < 2^31 for any activation a calibration could give a scale to
            r = relax.op.astype(r, "int32")
            r = relax.op.minimum(relax.op.maximum(r, relax.const(int(lo), "int32")),
                                 relax.const(int(hi), "int32"))
            return relax.op.astype(r, i["dtype"])
        return quantize
    if m.rule == RULE_DQ:
        def dequantize(em):
            d = relax.op.astype(i["x"], "float32")
            if i["z"]:
                d = relax.op.subtract(d, relax.const(float(i["z"]), "float32"))
            return relax.op.multiply(d, relax.const(i["s"], "float32"))
        return dequantize

    def conv(em):
        a = i["attrs"]
        x16 = em.emit(relax.op.subtract(relax.op.astype(i["xq"], "int16"),
                                        relax.const(np.int16(i["zx"]))))
        acc = em.emit(relax.op.nn.conv2d(
            x16, relax.const(i["w16"]), strides=a.strides, padding=a.padding,
            dilation=a.dilation, groups=a.groups, out_dtype="int32"))
        sc = i["scale"]
        # per tensor: a scalar (a [1, 1, 1, 1] constant fails TVM's ConvertLayout)
        scale = relax.const(sc.reshape(()) if sc.size == 1 else sc.reshape(1, -1, 1, 1))
        return relax.op.multiply(relax.op.astype(acc, "float32"), scale)
    return conv
