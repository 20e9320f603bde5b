"""conv(pad(x, zeros on spatial dims), W) => conv(x, W, padding + pad widths).

Exports with explicit "same" padding (HF MobileNetV2, TF-converted models, PyTorch's
``F.pad`` before a conv) put a Pad kernel before each conv: a full copy of the activation,
and in the blocked layout one more layout-converted tensor.  Folded, the conv pads as it
reads (its own padded stage, or inline for depthwise): HF MobileNetV2's explicit pads were
about a third of its kernel time.  Fires on ``relax.nn.pad`` in constant mode with value 0
on the spatial dims of a channels-first conv1d/2d/3d (the Pad converter emits that op only
for such pads).  Runs before the passes that rewrite convs (fold_batchnorm,
convert_layout, pack_conv_weights).
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, rewrite_matches

RULE = "conv(pad(x), W) => conv(x, W, padding + pad)"
_CONVS = {"nn.conv1d": ("NCW", relax.op.nn.conv1d), "nn.conv2d": ("NCHW", relax.op.nn.conv2d),
          "nn.conv3d": ("NCDHW", relax.op.nn.conv3d)}


class FoldPadIntoConv(GraphPass):
    """conv(pad(x), W) => conv(x, W) with the pad's widths added to the conv's padding."""

    name = "fold_pad_into_conv"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        return rewrite_matches(mod, report, _match, _plan)


def _match(df: Dataflow, root):
    conv = df.call(root, *_CONVS)
    if conv is None:
        return None
    layout, _ = _CONVS[conv.op.name[len("relax."):]]
    if conv.attrs.data_layout != layout:
        return None
    pd = df.call(conv.args[0], "nn.pad")
    if pd is None or pd.attrs.pad_mode != "constant" or float(pd.attrs.pad_value) != 0.0:
        return None
    width = [int(w) for w in pd.attrs.pad_width]
    nd = len(layout) - 2
    if len(width) != 2 * (nd + 2) or any(width[:4]) or min(width) < 0:
        return None
    before, after = width[4::2], width[5::2]
    padding = [int(p) for p in conv.attrs.padding]     # befores, then afters
    new = [p + w for p, w in zip(padding, before + after)]
    inner = [df.source(conv.args[0])] if df.private([conv.args[0]], root) else []
    return Match(RULE, root, inner, {"conv": conv, "x": pd.args[0], "padding": new})


def _plan(m: Match):
    conv, a = m.info["conv"], m.info["conv"].attrs
    make = _CONVS[conv.op.name[len("relax."):]][1]
    return lambda em: make(
        m.info["x"], conv.args[1], strides=a.strides, padding=m.info["padding"],
        dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
        kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=a.out_dtype)
