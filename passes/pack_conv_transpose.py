"""conv_transpose(x, W[C, F, *K]) => sub-pixel conv(pad(x), Wp[F/b, C, *T, *S, b]) with
T = ceil(K / S) taps per phase, Wp packed (and zero-padded to S*T taps) at compile time.

TVM legalizes conv{1,2,3}d_transpose as a dense conv over an input dilated with s - 1
zeros between pixels: s^d times the work, nearly all of it multiplying zeros (a U-Net's
2-D k2 s2 128->64 at 64x64: 420 ms against onnxruntime's 17 on one Zen 3 core).  Written
per output phase instead, ``o + p = s*q + r`` (``r = (o + p) % s``):
``out[o] = sum_{c, t < T} x[c, q - t] * W[c, f, r + s*t]``, reading ``x`` zero-padded
(its own stage, ``pad_temp``) and ``W`` zero-padded to ``s*T`` taps, so no branch and no
zero input.  The output channel block ``b`` is innermost and contiguous in ``Wp`` as in
pack_conv_weights; the CPU rule ``cpu.conv_transpose`` keeps a pixels x ``b`` register
tile vectorised over ``b``.  output_padding and the ONNX output_shape (which the converter
turns into pads and a slice) only change the output size, which the compute takes as is.

Fires on float32 conv{1,2,3}d_transpose with constant weights, ``groups == 1``, dilation
1, channels-first layouts (NCW/NCHW/NCDHW, IO* kernels) and an output channel count that
a block in ``blocks`` divides, that ``conv_transpose_as_conv`` (which runs first) left:
its phase conv takes the other channel counts, and 2-D ones with one tap per phase or many
input channels; grouped and dilated ones are left to TVM.  Needs the
weights folded to constants (fold_constants) and runs after fold_batchnorm, which scales
transposed-conv weights.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from .context import GraphPass, PassReport
from .dataflow import nodes_of, rewrite_calls

# Output channel blocks, best first: two AVX-512 vectors (four AVX2), one, three, then
# one AVX2 vector (a small decoder head: 8 or 24 channels).  On CPU targets the driver puts
# two of the target's vectors first (compiler/driver.py _conv_tiles: 16 on AVX2)
BLOCKS = (32, 16, 48, 8)

# spatial dims -> (data layout, kernel layout) the rewrite takes
LAYOUTS = {1: ("NCW", "IOW"), 2: ("NCHW", "IOHW"), 3: ("NCDHW", "IODHW")}


class PackConvTranspose(GraphPass):
    """conv_transpose(x, W) => sub-pixel conv(x, phases(W)) for 1/2/3-D, constant W."""

    name = "pack_conv_transpose"
    opt_level = 2
    options = {"blocks": BLOCKS}

    def rewrite(self, mod, report: PassReport, options: dict):
        blocks = tuple(int(b) for b in options["blocks"])
        rewritten = []
        for nd, layouts in LAYOUTS.items():
            mod, done = rewrite_calls(
                mod, f"relax.nn.conv{nd}d_transpose",
                lambda m, call, L=layouts: _phased(m, call, blocks, L))
            if done:
                rule = (f"conv{nd}d_transpose(x, W) => "
                        f"sub-pixel conv(pad(x), W as [F/b, C, *T, *S, b])")
                report.rewrites[rule] = len(done)
            rewritten += done
        names = report.node_names or []
        report.nodes = [names[k] if k < len(names) else f"#{k}"
                        for v in rewritten for k in nodes_of(v.name)] or [
                            v.name for v in rewritten if not nodes_of(v.name)]
        return mod


def conv_transpose_packed(data, wp, strides, pad_before, out_size):
    """TE compute of a 1-, 2- or 3-D transposed conv (dilation 1), per output phase:
    ``out[n, f, *o] = sum_{c, *t} pad(data)[n, c, *((o + p) // s - t + T - 1)] *
    wp[f // b, c, *t, *((o + p) % s), f % b]`` with ``wp`` of shape [F/b, C, *T, *S, b]
    (``pack_phases``), ``p`` = ``pad_before`` and ``out_size`` the output's spatial size
    (output_padding included)."""
    n, c, *size = (int(d) for d in data.shape)
    nd = len(size)
    fo, _, *rest = (int(d) for d in wp.shape)
    taps, b = rest[:nd], rest[-1]
    s, p = [int(v) for v in strides], [int(v) for v in pad_before]
    # x[q - t] for q = (o + p) // s over the whole output: T - 1 zeros before, and after
    # as many as the last q reaches past the input (output_padding, large outputs)
    before = [t - 1 for t in taps]
    after = [max(0, (o - 1 + p[i]) // s[i] - (size[i] - 1)) for i, o in enumerate(out_size)]
    if any(before) or any(after):
        data = topi.nn.pad(data, [0, 0, *before], [0, 0, *after], name="pad_temp")
    rc = te.reduce_axis((0, c), "rc")
    rt = [te.reduce_axis((0, t), "t" + "zyx"[3 - nd + i]) for i, t in enumerate(taps)]

    def body(i, f, *o):
        q = [te.indexdiv(o[d] + p[d], s[d]) - rt[d] + before[d] for d in range(nd)]
        r = [te.indexmod(o[d] + p[d], s[d]) for d in range(nd)]
        return te.sum(data[(i, rc, *q)] * wp[(te.indexdiv(f, b), rc, *rt, *r,
                                               te.indexmod(f, b))], axis=[rc, *rt])

    # te names iter vars after the lambda's parameters
    named = {1: lambda i, f, x: body(i, f, x), 2: lambda i, f, y, x: body(i, f, y, x),
             3: lambda i, f, z, y, x: body(i, f, z, y, x)}[nd]
    return te.compute((n, fo * b, *out_size), named, name=f"conv{nd}d_transpose_phased")


def phase_taps(w: np.ndarray, strides) -> np.ndarray:
    """IO* [C, F, *K] -> [C, F, T0, S0, T1, S1, ..] with T = ceil(K / S): ``[c, f, *(t, r)]
    = w[c, f, *(r + s * t)]`` (tap ``k = t * s + r``), zero where ``r + s*t >= K``."""
    c, f, *ks = w.shape
    s = [int(v) for v in strides]
    taps = [-(-k // st) for k, st in zip(ks, s)]
    wz = np.zeros((c, f, *[t * st for t, st in zip(taps, s)]), dtype=w.dtype)
    wz[(slice(None), slice(None), *[slice(0, k) for k in ks])] = w
    return wz.reshape(c, f, *[v for t, st in zip(taps, s) for v in (t, st)])


def pack_phases(w: np.ndarray, strides, b: int) -> np.ndarray:
    """IO* [C, F, *K] -> [F/b, C, *T, *S, b] with T = ceil(K / S):
    ``wp[fo, c, *t, *r, fi] = w[c, fo * b + fi, *(r + s * t)]``, zero where ``r + s*t >= K``."""
    c, f, *ks = w.shape
    nd = len(ks)
    wz = phase_taps(w, strides)
    wz = wz.reshape(c, f // b, b, *wz.shape[2:])
    t_axes = [3 + 2 * i for i in range(nd)]
    r_axes = [4 + 2 * i for i in range(nd)]
    return np.ascontiguousarray(wz.transpose(1, 0, *t_axes, *r_axes, 2))


def output_block(f: int, blocks) -> int:
    """The first of ``blocks`` that divides ``f`` output channels, 0 when none does."""
    return next((b for b in blocks if f % b == 0), 0)


def static_transposed(call, layouts):
    """(W as numpy [C, F, *K], input spatial size, strides, padding, output spatial size) of
    a relax.nn.conv{1,2,3}d_transpose ``call`` both rewrites take: a constant float32
    weight, float32 data of static shape, ``groups == 1``, dilation 1, the channels-first
    ``layouts`` (data, kernel) and at least one output pixel per axis; else None."""
    a = call.attrs
    data, weight = call.args
    if not isinstance(weight, GenericConst):
        return None
    dl, kl = layouts
    nd = len(dl) - 2
    if (int(a.groups) != 1 or a.data_layout != dl or a.kernel_layout != kl
            or a.out_layout != dl or any(int(d) != 1 for d in a.dilation)
            or (str(a.out_dtype) if a.out_dtype is not None else "") not in (
                "", "void", "float32")):
        return None
    dty = data.ty
    w = weight.value.numpy()
    if (str(dty.dtype) != "float32" or w.dtype != np.float32 or dty.ndim != nd + 2
            or w.ndim != nd + 2):
        return None
    if dty.shape is None or any(not isinstance(d, tvm.tirx.IntImm) for d in dty.shape):
        return None
    size = [int(d) for d in list(dty.shape)[2:]]
    s = [int(v) for v in a.strides]
    pad = [int(v) for v in a.padding]
    out_pad = [int(v) for v in a.output_padding]
    out = [(size[i] - 1) * s[i] - pad[i] - pad[nd + i] + w.shape[2 + i] + out_pad[i]
           for i in range(nd)]
    if any(o < 1 for o in out):
        return None
    return w, size, s, pad, out


def _phased(m, call, blocks, layouts):
    """``call`` (a relax.nn.conv{1,2,3}d_transpose) as conv_transpose_packed on phase-packed
    W, emitted through ``m`` (rewrite_calls' mutator); None when it does not qualify."""
    found = static_transposed(call, layouts)
    if found is None:
        return None
    w, _, s, pad, out = found
    b = output_block(w.shape[1], blocks)
    if not b:
        return None
    nd = len(out)
    data = m.visit_expr(call.args[0])
    return m.builder_.call_te(
        conv_transpose_packed, data, relax.const(pack_phases(w, s, b)), s, pad[:nd], out,
        primfunc_name_hint=f"conv{nd}d_transpose")
