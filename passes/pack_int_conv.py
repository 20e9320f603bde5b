"""conv2d_int32(int16(a) - za, W) in NCHW[b]c => conv2d_int_packed(a16 = pad(int16(a) - za), pack(W)).

The int32 convs ``qdq_conv_integer`` writes, once convert_layout has blocked them (data
``NCHW{b}c`` with weights ``OIHW{b}i{b}o``, or an RGB stem reading ``NCHW`` with ``OIHW{b}o``,
output ``NCHW{b}c``), become one TE kernel whose inner step is the CPU rule
``cpu.conv2d_int8``'s ``vpmaddwd`` (two input channels of one output channel per i32 lane,
i16 operands).  The constant weight is packed here once to ``[F/b, CO, KH, KW, CP, b, 2]``
(input-channel pairs innermost; int8 when it fits), and the activation's widening to int16
minus its zero point becomes the kernel's first stage, which also pads it (with the
dequantized 0) and lays it out ``[N, CO, H+pads, W+pads, CP, 2]``: the kernel reads the
8-bit activation as the previous kernel wrote it.  Blocked input (block ``bi``, which may
differ from the output's ``b``: a 16 -> 8 half-block projection): ``CO = C/bi, CP = bi/2``;
NCHW input: ``CO = 1, CP = ceil(C/2)`` (an odd C gets a zero channel).  Every blocked int
conv is taken (TVM cannot lower a blocked int conv2d); convs left NCHW become the float
conv of the same integers (``RULE_FLOAT``).  Runs after convert_layout, before
pack_conv_weights.

On targets with an 8-bit dot (option ``u8_dot``, set by the driver: passes/int8_quads.py)
an 8-bit activation by a weight that fits s8 is not widened: the weight is packed by fours
of input channels, ``[F/b, CO, KH, KW, CQ, b, 4]`` int8, the first stage only pads the
activation (with its zero point, so padding adds nothing once corrected) into ``[N, CO,
H+pads, W+pads, CQ, 4]``, flipping its sign bit where the dot takes the other 8-bit type
(``shift``), and the zero point is corrected after the sum, ``acc - (za - shift) *
sum(W[f])`` (a constant per output channel), fused into the write-back.
"""

from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import relax, te, tirx

from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from . import int8_quads
from .context import GraphPass, PassReport
from .dataflow import rewrite_calls

RULE = ("conv2d_int32(int16(a) - za, W) NCHW[b]c => conv2d_int_packed(pad(int16(a) - za), "
        "[F/b, CO, KH, KW, CP, b, 2](W))")
RULE_U8 = ("conv2d_int32(int16(a) - za, W) NCHW[b]c => conv2d_u8s8_packed(pad(8-bit a - shift, "
           "za - shift), [F/b, CO, KH, KW, CQ, b, 4](W)) - (za - shift) * sum(W[f])")
_BLOCKED = re.compile(r"^NCHW(\d+)c$")
_BYTE = ("uint8", "int8", "int16")


class PackIntConv(GraphPass):
    """Blocked int32 conv of a widened 8-bit activation by a constant weight => packed
    integer conv kernel (widening and padding inside it)."""

    name = "pack_int_conv"
    opt_level = 2
    options = dict(int8_quads.OPTIONS)

    def rewrite(self, mod, report: PassReport, options: dict):
        mod = int8_quads.rewrite(mod, report, "relax.nn.conv2d", _packed, options, RULE, RULE_U8)
        mod, floated = rewrite_calls(mod, "relax.nn.conv2d", _float_nchw)
        if floated:
            report.rewrites[RULE_FLOAT] = len(floated)
        return mod


# An int32 conv convert_layout left NCHW (qdq_conv_integer only makes those it expects
# blocked, but the whole graph can stay NCHW: an op convert_layout has not verified,
# --layout NCHW): no CPU rule takes an integer NCHW conv (TVM's reduction schedule ran 50x
# slower than onnxruntime), so it becomes the float conv of the same integers, which
# pack_conv_weights packs.  Exact while the sums stay below 2^24, as the QDQ model's own
# float conv is not.
RULE_FLOAT = "conv2d_int32(a16, W) left NCHW => int32(conv2d(float32(a16), float32(W)))"


def _float_nchw(m, call):
    a = call.attrs
    x, w = call.args
    if (a.data_layout != "NCHW" or str(a.out_dtype) != "int32"
            or not isinstance(w, GenericConst) or str(x.ty.dtype) not in _BYTE):
        return None
    wf = relax.const(w.value.numpy().astype(np.float32))
    conv = relax.op.nn.conv2d(relax.op.astype(m.visit_expr(x), "float32"), wf,
                              strides=a.strides, padding=a.padding, dilation=a.dilation,
                              groups=a.groups, data_layout="NCHW", kernel_layout=a.kernel_layout,
                              out_layout="NCHW", out_dtype="float32")
    return relax.op.astype(m.builder_.emit(conv), "int32")


def _geometry(a, wp, strides, padding, dilation) -> tuple:
    """The shapes both integer conv computes start from: (blocked, n, h, w, fo, co, kh, kw,
    cp, b, sh, sw, dh, dw, (top, left, bottom, right), oh, ow, sub), ``sub`` when an
    unpadded 1x1 conv of stride > 1 (ResNet's downsampling shortcuts) reads only the
    pixels of its output grid (a quarter of the input at stride 2)."""
    # a symbolic batch (an export with a dynamic batch) stays an expression: the kernel
    # takes it as its extent, and the batch loop (lowering/batch_loop.py) may then build
    # it for one sample
    n = a.shape[0] if not isinstance(a.shape[0], (int, tirx.IntImm)) else int(a.shape[0])
    h, w = (int(a.shape[k]) for k in (2, 3))
    fo, co_n, kh, kw, cp_n, b, _ = (int(d) for d in wp.shape)
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    pads = tuple(int(p) for p in padding)
    pt, pl, pb, pr = pads
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    sub = kh == kw == 1 and not any(pads) and (sh, sw) != (1, 1)
    return (len(a.shape) == 5, n, h, w, fo, co_n, kh, kw, cp_n, b, sh, sw, dh, dw, pads, oh,
            ow, sub)


def conv2d_int_packed(a, za, wp, strides, padding, dilation, channels: int, groups: int = 1):
    """TE compute.  ``a16[n, co, h, w, cp, k] = int16(a[..]) - za`` at input channel
    ``co * 2 CP + 2 cp + k`` and pixel ``(h - top, w - left)``, 0 in the padding and past
    ``channels`` (``za`` a scalar tensor or None); then ``out[n, fo, y, x, v] = sum_{co, ry,
    rx, cp, k} int32(a16[n, co, y sh + ry dh, x sw + rx dw, cp, k]) * int32(wp[fo, co, ry,
    rx, cp, v, k])``.  ``a`` is NCHW[b]c (5-D) or NCHW (4-D).  An unpadded strided 1x1 conv
    widens only the pixels it reads (``a16`` on the output grid, read at stride 1).  With
    ``groups`` > 1 (blocked, whole blocks per group) output block ``fo`` reads its group's
    ``CO`` input blocks (see :func:`_group_base`)."""
    (blocked, n, h, w, fo, co_n, kh, kw, cp_n, b, sh, sw, dh, dw, (pt, pl, pb, pr), oh, ow,
     sub) = _geometry(a, wp, strides, padding, dilation)

    def widen(i, co, y, x, cp, k):
        yy, xx = (y * sh, x * sw) if sub else (y - pt, x - pl)
        if blocked:
            v = a[i, co, yy, xx, cp * 2 + k]
            inside = [yy >= 0, yy < h, xx >= 0, xx < w] if (pt or pl or pb or pr) else []
        else:
            c = cp * 2 + k
            v = a[i, te.min(c, channels - 1), yy, xx]
            inside = ([yy >= 0, yy < h, xx >= 0, xx < w] if (pt or pl or pb or pr) else []) + \
                ([c < channels] if channels % 2 else [])
        v = v.astype("int16")
        if za is not None:
            v = v - za().astype("int16")
        if not inside:
            return v
        return te.if_then_else(tvm.tirx.all(*inside), v, tvm.tirx.const(0, "int16"))

    grid = (oh, ow) if sub else (h + pt + pb, w + pl + pr)
    a16 = te.compute((n, co_n * groups, *grid, cp_n, 2), widen, name="conv_int_a16")
    if sub:
        sh = sw = 1
    rco = te.reduce_axis((0, co_n), "rco")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    rcp = te.reduce_axis((0, cp_n), "rcp")
    rk = te.reduce_axis((0, 2), "rk")
    base = _group_base(fo, co_n, groups)
    return te.compute(
        (n, fo, oh, ow, b),
        lambda i, f, y, x, v: te.sum(
            a16[i, base(f) + rco, y * sh + ry * dh, x * sw + rx * dw, rcp, rk].astype("int32")
            * wp[f, rco, ry, rx, rcp, v, rk].astype("int32"),
            axis=[rco, ry, rx, rcp, rk]),
        name="conv2d_int")


def conv2d_u8s8_packed(a, za: int, wq, corr, strides, padding, dilation, channels: int,
                       groups: int = 1, shift: int = 0):
    """TE compute.  ``a8[n, co, h, w, cq, k] = a[..] - shift`` (``a`` u8 or s8; ``shift``
    +-128 turns it into the other 8-bit type, int8_quads.shift) at input channel ``co * 4
    CQ + 4 cq + k`` (clamped to the last one past ``channels``: their weights are 0) and
    pixel ``(h - top, w - left)``, the zero point ``za - shift`` in the padding; then
    ``acc[n, fo, y, x, v] = sum_{co, ry, rx, cq, k} int32(a8[n, co, y sh + ry dh, x sw + rx
    dw, cq, k]) * int32(wq[fo, co, ry, rx, cq, v, k])`` and ``out = acc - corr[fo, v]``
    (``corr = (za - shift) * sum(W[f])``, None when that is 0).  ``a`` is NCHW[b]c (5-D) or
    NCHW (4-D).  An unpadded strided 1x1 conv copies only the pixels it reads."""
    (blocked, n, h, w, fo, co_n, kh, kw, cq_n, b, sh, sw, dh, dw, (pt, pl, pb, pr), oh, ow,
     sub) = _geometry(a, wq, strides, padding, dilation)
    dtype = int8_quads.shifted_type(str(a.dtype), shift)

    def copy(i, co, y, x, cq, k):
        yy, xx = (y * sh, x * sw) if sub else (y - pt, x - pl)
        if blocked:
            v = a[i, co, yy, xx, cq * 4 + k]
        else:
            v = a[i, te.min(cq * 4 + k, channels - 1), yy, xx]
        v = int8_quads.shifted(v, shift)
        if not (pt or pl or pb or pr):
            return v
        inside = tvm.tirx.all(yy >= 0, yy < h, xx >= 0, xx < w)
        return te.if_then_else(inside, v, tvm.tirx.const(za - shift, dtype))

    a8 = te.compute((n, co_n * groups, *((oh, ow) if sub else (h + pt + pb, w + pl + pr)), cq_n,
                     4), copy, name="conv_int_a8")
    if sub:
        sh = sw = 1
    rco = te.reduce_axis((0, co_n), "rco")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    rcq = te.reduce_axis((0, cq_n), "rcq")
    rk = te.reduce_axis((0, 4), "rk")
    base = _group_base(fo, co_n, groups)
    acc = te.compute(
        (n, fo, oh, ow, b),
        lambda i, f, y, x, v: te.sum(
            a8[i, base(f) + rco, y * sh + ry * dh, x * sw + rx * dw, rcq, rk].astype("int32")
            * wq[f, rco, ry, rx, rcq, v, rk].astype("int32"),
            axis=[rco, ry, rx, rcq, rk]),
        name="conv2d_int")
    if corr is None:
        return acc
    return te.compute(acc.shape, lambda i, f, y, x, v: acc[i, f, y, x, v] - corr[f, v],
                      name="conv2d_int_zp")


def _group_base(fo: int, co_n: int, groups: int):
    """``f -> `` the first input block output block ``f`` reads: 0 for a dense conv; with
    ``groups`` (each of ``fo / groups`` output and ``co_n`` input blocks), ``(f // (fo /
    groups)) * co_n`` (RegNet-X's 24-channel groups: three 8-channel blocks each)."""
    if groups == 1:
        return lambda f: 0
    return lambda f: te.indexdiv(f, fo // groups) * co_n


def pack_conv_quads(w: np.ndarray, blocked: bool) -> np.ndarray:
    """A blocked int weight ``[F/b, C/b, KH, KW, b, b]`` (OIHW[b]i[b]o) or ``[F/b, C, KH, KW,
    b]`` (OIHW[b]o, NCHW input), values in int8 -> ``[F/b, CO, KH, KW, CQ, b, 4]`` int8, four
    input channels innermost (NCHW input: ``CO = 1``, C padded with zero channels to fours)."""
    if blocked:
        fo, co, kh, kw, bi, bo = w.shape
        wq = w.reshape(fo, co, kh, kw, bi // 4, 4, bo).transpose(0, 1, 2, 3, 4, 6, 5)
    else:
        fo, c, kh, kw, bo = w.shape
        w = np.pad(w, ((0, 0), (0, -c % 4), (0, 0), (0, 0), (0, 0)))
        wq = w.reshape(fo, -1, 4, kh, kw, bo).transpose(0, 3, 4, 1, 5, 2)[:, None]
    return np.ascontiguousarray(wq.astype(np.int8))


def pack_conv_int(w: np.ndarray, blocked: bool) -> np.ndarray:
    """A blocked int weight ``[F/b, C/b, KH, KW, b, b]`` (OIHW[b]i[b]o) or ``[F/b, C, KH, KW,
    b]`` (OIHW[b]o, NCHW input) -> ``[F/b, CO, KH, KW, CP, b, 2]``, input-channel pairs
    innermost; int8 when every value fits, else int16."""
    if blocked:
        fo, co, kh, kw, bi, bo = w.shape
        wp = w.reshape(fo, co, kh, kw, bi // 2, 2, bo).transpose(0, 1, 2, 3, 4, 6, 5)
    else:
        fo, c, kh, kw, bo = w.shape
        w = np.pad(w, ((0, 0), (0, c % 2), (0, 0), (0, 0), (0, 0)))
        wp = w.reshape(fo, -1, 2, kh, kw, bo).transpose(0, 3, 4, 1, 5, 2)[:, None]
    dtype = np.int8 if wp.min(initial=0) >= -128 and wp.max(initial=0) <= 127 else np.int16
    return np.ascontiguousarray(wp.astype(dtype))


def _widened(df, x):
    """(a, za or None) when ``x`` is ``astype(a, i16) - za`` (``za`` a scalar constant) with
    ``a`` 8-bit; else (x, None) when ``x`` is already int16 or 8-bit; else None."""
    sub = df.call(x, "subtract")
    if sub is not None:
        cast, z = df.call(sub.args[0], "astype"), df.const(sub.args[1])
        if (cast is not None and z is not None and z.size == 1
                and str(cast.args[0].ty.dtype) in ("uint8", "int8")):
            return cast.args[0], z.reshape(()).astype(np.int16)
    cast = df.call(x, "astype")
    if cast is not None and str(cast.args[0].ty.dtype) in ("uint8", "int8"):
        return cast.args[0], None
    return (x, None) if str(x.ty.dtype) in _BYTE else None


def _packed(m, df, call, options: dict):
    """(``call`` (a blocked int32 relax.nn.conv2d) as conv2d_u8s8_packed or
    conv2d_int_packed, emitted through ``m``, whether it took the form by fours, whether
    that can saturate); None when it does not qualify."""
    a = call.attrs
    x, weight = call.args
    out = _BLOCKED.match(str(a.out_layout or a.data_layout))
    groups = int(a.groups)
    if out is None or str(call.ty.dtype) != "int32":
        return None
    blocked = str(a.data_layout) != "NCHW"
    if groups != 1 and not blocked:
        return None
    w = df.const(weight)
    if w is None or not np.issubdtype(w.dtype, np.integer) or w.ndim != (6 if blocked else 5):
        return None
    if blocked and w.shape[4] % 2:  # input channel blocks of whole pairs
        return None
    if not all(isinstance(d, tirx.IntImm) for d in x.ty.shape.values[1:]):
        return None  # a symbolic image: no integer rule (only the batch may be symbolic)
    widened = _widened(df, x)
    if widened is None:
        return None
    src, za = widened
    channels = int(src.ty.shape[1]) * (int(src.ty.shape[4]) if blocked else 1)
    # a graph input's activation is blocked after its widening (layout_transform(int16(a) -
    # za)): the form by fours blocks ``a`` itself, the widened copy is left dead
    moved = df.call(x, "layout_transform") if blocked else None
    inner = _widened(df, moved.args[0]) if moved is not None else None
    act8 = inner[0] if inner is not None else src
    byte = str(act8.ty.dtype)
    if int8_quads.use_quads(options, byte, w) and (not blocked or w.shape[4] % 4 == 0):
        z = int((inner or widened)[1]) if (inner or widened)[1] is not None else 0
        info = np.iinfo(byte)
        if info.min <= z <= info.max:
            by, _ = int8_quads.shift(options, byte)
            wq = pack_conv_quads(w, blocked)
            corr = (z - by) * wq.astype(np.int64).sum(axis=(1, 2, 3, 4, 6))
            corr = relax.const(corr.astype(np.int32)) if z != by else None
            act = m.visit_expr(act8)
            if inner is not None:
                act = m.builder_.emit(relax.op.layout_transform(
                    act, moved.attrs.index_map, pad_value=None))
            out = m.builder_.call_te(conv2d_u8s8_packed, act, z, relax.const(wq), corr,
                                     a.strides, a.padding, a.dilation, channels, groups, by,
                                     primfunc_name_hint="conv2d_integer")
            return out, True, int8_quads.can_saturate(options, wq)
    wp = pack_conv_int(w, blocked)
    za = relax.const(za) if za is not None else None
    return m.builder_.call_te(conv2d_int_packed, m.visit_expr(src), za, relax.const(wp),
                              a.strides, a.padding, a.dilation, channels, groups,
                              primfunc_name_hint="conv2d_integer"), False, False
