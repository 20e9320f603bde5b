"""conv(x, W) [+ b] -> batch_norm => conv(x, W*s) + ((b - mean)*s + beta), s = gamma/sqrt(var+eps).

Conv and ConvTranspose (1-3 spatial dims, grouped too) followed by an inference
BatchNormalization with constant parameters.  Runs after fold_constants (the weights must
be constants) and before weight packing/layout passes.  Does not fire when the conv (or
its bias add) has another user, which would see the scaled values.  The BN kernel goes;
the bias add fuses into the conv's epilogue.

An inference BN that follows no foldable conv (DenseNet's pre-activation BN -> ReLU -> conv)
becomes ``x * s + t`` with constant ``s``, ``t``: two elementwise ops that fuse into their
neighbours and that the layout pass can carry in NCHW[b]c (TVM's batch_norm cannot be, so
every such BN cost two layout transforms).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, dims_of, record, rewrite

_CONVS = ("nn.conv1d", "nn.conv2d", "nn.conv3d")
_TRANSPOSED = ("nn.conv1d_transpose", "nn.conv2d_transpose", "nn.conv3d_transpose")


class FoldBatchNorm(GraphPass):
    """conv(x, W) -> batch_norm => conv(x, W*s) + (b*s + t)"""

    name = "fold_batchnorm"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        df = Dataflow(mod)
        matches = [m for b in df.roots()
                   for m in [_match(df, b.var, b.value) or _match_affine(df, b.var, b.value)]
                   if m]
        record(report, df, matches)
        return rewrite(mod, matches, lambda m: (_plan if "conv" in m.info else _plan_affine)(m))


def _inference_bn(df: Dataflow, value):
    """(batch_norm call, its tuple's binding var, (s, beta, mean) as float64) when ``value``
    is item 0 of an inference batch_norm over axis 1 with constant 1-D params and no other
    item used; s = gamma / sqrt(var + eps), honouring ``scale``/``center``."""
    if not (isinstance(value, relax.TupleGetItem) and value.index == 0):
        return None
    bn = df.call(value.tuple_value, "nn.batch_norm")
    if bn is None or bn.attrs.training or int(bn.attrs.axis) != 1:
        return None
    params = [df.const(a) for a in bn.args[1:5]]
    if any(p is None or p.ndim != 1 for p in params) or len({p.shape[0] for p in params}) != 1:
        return None
    # only item 0 of the BN tuple may be used (inference: mean/var outputs are unused)
    if df.uses(bn_var := df.source(value.tuple_value)) != 1:
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    if not bn.attrs.scale:
        gamma = np.ones_like(gamma)
    if not bn.attrs.center:
        beta = np.zeros_like(beta)
    return bn, bn_var, (gamma / np.sqrt(var + float(bn.attrs.epsilon)), beta, mean)


def _match(df: Dataflow, root, value):
    found = _inference_bn(df, value)
    if found is None:
        return None
    bn, bn_var, (s, beta, mean) = found
    y, inner, bias = bn.args[0], [bn_var], None
    add = df.call(y, "add")
    if add is not None:
        if df.uses(y) != 1:
            return None
        inner.append(df.source(y))
        y, bias = _conv_and_bias(df, add)
        if bias is None:
            return None
    conv = df.call(y, *_CONVS, *_TRANSPOSED)
    if conv is None or df.uses(y) != 1 or not _layouts_ok(conv):
        return None
    w = df.const(conv.args[1])
    out_shape = dims_of(conv)  # the channels static; a symbolic batch or image is fine
    if (w is None or out_shape is None or len(out_shape) < 2 or out_shape[1] is None
            or str(conv.ty.dtype) not in ("float32", "float16", "float64")):
        return None
    channels = out_shape[1]
    if s.shape[0] != channels:
        return None
    inner.append(df.source(y))
    b = np.zeros(channels) if bias is None else bias
    return Match("conv -> batch_norm => conv(W*s) + bias", root, inner,
                 {"conv": conv, "conv_var": df.source(y), "w": w, "scale": s,
                  "shift": (b - mean) * s + beta, "ndim": len(out_shape)})


def _match_affine(df: Dataflow, root, value):
    """An inference batch_norm over axis 1 with constant params whose only used output is
    item 0 => x * s + t."""
    found = _inference_bn(df, value)
    if found is None:
        return None
    bn, bn_var, (s, beta, mean) = found
    shape = dims_of(bn.args[0])
    if (shape is None or len(shape) < 2 or s.shape[0] != shape[1]
            or str(bn.args[0].ty.dtype) not in ("float32", "float16", "float64")):
        return None
    return Match("batch_norm => x * s + t", root, [bn_var],
                 {"x": bn.args[0], "scale": s, "shift": beta - mean * s, "ndim": len(shape)})


def _plan_affine(m: Match):
    info = m.info

    def build(em):
        dtype = str(info["x"].ty.dtype)
        bshape = [1, -1] + [1] * (info["ndim"] - 2)
        scaled = em.emit(relax.op.multiply(info["x"], relax.const(
            info["scale"].reshape(bshape).astype(dtype), dtype)))
        return relax.op.add(scaled, relax.const(info["shift"].reshape(bshape).astype(dtype),
                                                dtype))

    return build


def _conv_and_bias(df: Dataflow, add):
    """(conv operand, per-channel bias as float64) of ``conv + b``, or (None, None)."""
    for y, c in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        b, shape = df.const(c), dims_of(y)
        if (b is None or shape is None or len(shape) < 2 or shape[1] is None
                or df.call(y, *_CONVS, *_TRANSPOSED) is None):
            continue
        # b must vary along the channel axis only: (C,1,..,1), (1,C,1,..,1) or a scalar
        if b.ndim > len(shape) or any(d != 1 for i, d in enumerate(b.shape)
                                      if i + len(shape) - b.ndim != 1):
            continue
        if b.size not in (1, shape[1]):
            continue
        return y, np.broadcast_to(b.reshape(-1), (shape[1],)).astype(np.float64)
    return None, None


def _layouts_ok(conv) -> bool:
    a = conv.attrs
    out_dtype = str(a.out_dtype) if a.out_dtype is not None else ""
    return (str(a.data_layout).startswith("NC") and str(a.out_layout) == str(a.data_layout)
            and str(a.kernel_layout)[:2] in ("OI", "IO")
            and out_dtype in ("", "void", str(conv.ty.dtype)))


def _scaled_weight(conv, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """W with every output channel's filter scaled by s (OI... or IO... with groups)."""
    k = w.astype(np.float64)
    spatial = [1] * (w.ndim - 2)
    if str(conv.attrs.kernel_layout).startswith("OI"):
        out = k * s.reshape([-1, 1] + spatial)
    else:  # IO...: shape (Cin, Cout/groups, ...); output channel g*Cout/groups + j
        g = int(conv.attrs.groups)
        cin, cog = w.shape[0], w.shape[1]
        out = (k.reshape([g, cin // g, cog] + list(w.shape[2:]))
               * s.reshape([g, 1, cog] + spatial)).reshape(w.shape)
    return out.astype(w.dtype)


def _plan(m: Match):
    conv, info = m.info["conv"], m.info

    def build(em):
        dtype = str(conv.ty.dtype)
        w = relax.const(_scaled_weight(conv, info["w"], info["scale"]), str(info["w"].dtype))
        y = em.emit(relax.Call(conv.op, [conv.args[0], w], conv.attrs, conv.ty_args),
                    like=info["conv_var"])
        shift = info["shift"].reshape([1, -1] + [1] * (info["ndim"] - 2)).astype(dtype)
        return relax.op.add(y, relax.const(shift, dtype))

    return build
