"""conv2d(x, W[F, C, KH, KW]) => conv2d_nchw_packed(x, Wp[F/b, C, KH, KW, b]), Wp packed at
compile time (OIHW -> OIHW[b]o).

Activations stay NCHW; only the constant weight changes layout, once, here.  With ``b``
output channels contiguous, the x86 rule ``conv2d_packed`` keeps an ``(output pixels x
b)`` tile of accumulators in registers, loads ``b / lanes`` weight vectors per tap and
broadcasts each input value into them: the channel block is the vector, so odd output
widths (SqueezeNet's 55/27/13, the 111- and 112-wide stems) no longer give short vectors.
Runs after the passes that change conv weights (fold_batchnorm) and needs the weights as
constants (fold_constants).  Fires on 2-D float32 convs with ``groups == 1``, NCHW/OIHW,
at least ``min_taps`` kernel taps and an output channel count that some block in
``blocks`` divides: whole AVX-512 vectors by default (measured on znver5, 1x1 included:
1.3-4x conv2d_nchw at 7x7 and 14x14 outputs; a ragged 8- or 40-channel block lost to
conv2d_nchw on SqueezeNet's 1000-channel 1x1, so F = 1000 or 24 stays unpacked).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from .context import GraphPass, PassReport
from .dataflow import rewrite_calls

# Channel blocks, best first: two AVX-512 vectors, one, three (the x86 rule also takes
# ragged blocks such as 24 or 40, through the ``blocks`` option)
BLOCKS = (32, 16, 48)


class PackConvWeights(GraphPass):
    """conv2d(x, W) => conv2d_nchw_packed(x, pack(W)) for spatial convs with constant W."""

    name = "pack_conv_weights"
    opt_level = 2
    options = {"min_taps": 1, "blocks": BLOCKS}

    def rewrite(self, mod, report: PassReport, options: dict):
        min_taps, blocks = int(options["min_taps"]), tuple(options["blocks"])
        out, rewritten = rewrite_calls(mod, "relax.nn.conv2d",
                                       lambda m, call: _packed(m, call, min_taps, blocks))
        if rewritten:
            report.rewrites["conv2d(x, W) => conv2d_nchw_packed(x, OIHW[b]o(W))"] = len(rewritten)
            names = getattr(report, "node_names", None) or []
            report.nodes = [_node_name(v, names) for v in rewritten]
        return out


def conv2d_nchw_packed(data, wp, strides, padding, dilation):
    """TE compute: ``out[n, f, y, x] = sum_{c, ry, rx} pad(data)[n, c, y*sh + ry*dh,
    x*sw + rx*dw] * wp[f // b, c, ry, rx, f % b]`` with ``wp`` of shape [F/b, C, KH, KW, b].
    ``padding`` is (top, left, bottom, right)."""
    n, c, h, w = (int(d) for d in data.shape)
    fo, _, kh, kw, b = (int(d) for d in wp.shape)
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    if pt or pl or pb or pr:
        data = topi.nn.pad(data, [0, 0, pt, pl], [0, 0, pb, pr], name="pad_temp")
    rc = te.reduce_axis((0, c), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    return te.compute(
        (n, fo * b, oh, ow),
        lambda i, f, y, x: te.sum(
            data[i, rc, y * sh + ry * dh, x * sw + rx * dw]
            * wp[te.indexdiv(f, b), rc, ry, rx, te.indexmod(f, b)], axis=[rc, ry, rx]),
        name="conv2d_nchw_packed")


def pack_oihw(w: np.ndarray, b: int) -> np.ndarray:
    """OIHW -> OIHW[b]o: ``wp[fo, c, y, x, fi] = w[fo * b + fi, c, y, x]``."""
    f, c, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(f // b, b, c, kh, kw).transpose(0, 2, 3, 4, 1))


def _node_name(var, names) -> str:
    """The ONNX node name behind a binding tagged ``n<k>`` (compiler/lowering/provenance.py)."""
    tag = var.name
    if tag.startswith("n"):
        head = tag[1:].split("_")[0]
        if head.isdigit() and int(head) < len(names):
            return names[int(head)]
    return tag


def _block(f: int, blocks) -> int:
    return next((b for b in blocks if f % b == 0), 0)


def _packed(m, call, min_taps: int, blocks):
    """``call`` (a relax.nn.conv2d) as conv2d_nchw_packed on W packed in channel blocks,
    emitted through ``m`` (rewrite_calls' mutator); None when it does not qualify."""
    a = call.attrs
    data, weight = call.args
    if not isinstance(weight, GenericConst):
        return None
    if (int(a.groups) != 1 or a.data_layout != "NCHW" or a.kernel_layout != "OIHW"
            or a.out_layout != "NCHW"
            or (str(a.out_dtype) if a.out_dtype is not None else "") not in (
                "", "void", "float32")):
        return None
    dty = data.ty
    w = weight.value.numpy()
    if str(dty.dtype) != "float32" or w.dtype != np.float32 or dty.ndim != 4 or w.ndim != 4:
        return None
    if dty.shape is None or any(not isinstance(d, tvm.tirx.IntImm) for d in dty.shape):
        return None
    f, _, kh, kw = w.shape
    b = _block(f, blocks)
    if kh * kw < min_taps or not b:
        return None
    data = m.visit_expr(data)
    wp = relax.const(pack_oihw(w, b))
    return m.builder_.call_te(
        conv2d_nchw_packed, data, wp, [int(s) for s in a.strides],
        [int(p) for p in a.padding], [int(d) for d in a.dilation],
        primfunc_name_hint="conv2d")

