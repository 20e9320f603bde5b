"""The activation layout of every binding after the graph passes, so that tools can map a
kernel's tensor back to the ONNX (NCHW) layout.

``passes/convert_layout.py`` lets TVM's ConvertLayout choose per op; the result is only
visible in op attributes (conv2d's and the pools' ``out_layout``) and in the index maps of
the ``layout_transform`` calls it inserts.  ``binding_layouts`` propagates them forward
through ``main``: a binding holds ``"NCHW{b}c"``, ``"NHWC"``, ``None`` (the ONNX layout)
or ``"?"`` (derived from a converted tensor with a rank change: not mappable).  ConvertLayout writes
NHWC's transforms as ``permute_dims`` (untagged bindings), NCHW[b]c's as ``layout_transform``.
The graph records it per tensor (``tensors[i]["layout"]``); ``to_onnx_layout`` undoes it.
"""

from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import relax

from passes.dataflow import nodes_of

UNKNOWN = "?"
_BLOCKED = re.compile(r"^NCHW(\d+)c$")
_LAYOUT_OPS = {"relax.nn.conv2d", "relax.nn.max_pool2d", "relax.nn.avg_pool2d",
               "relax.nn.adaptive_avg_pool2d"}


def binding_layouts(mod) -> dict:
    """{binding name: layout} of ``mod["main"]`` for every binding not in the ONNX layout."""
    layout: dict = {}   # relax Var -> layout (absent: the ONNX layout)
    out: dict = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            got = _layout(b.value, layout, bool(nodes_of(b.var.name)))
            if got is not None:
                layout[b.var] = got
                out[b.var.name] = got
    return out


def _ndim(expr) -> int | None:
    ty = getattr(expr, "ty", None)
    return getattr(ty, "ndim", None) if isinstance(ty, relax.TensorType) else None


def _layout(value, layout: dict, tagged: bool = False):
    """The layout ``value`` writes; ``tagged``: its binding is an ONNX node's (a Transpose
    node's permute_dims is the ONNX tensor, not a layout change)."""
    if isinstance(value, relax.Var):
        return layout.get(value)
    if isinstance(value, relax.TupleGetItem):
        return layout.get(value.tuple_value)  # split outputs keep the input's layout
    if isinstance(value, relax.Tuple):  # concat's operands: their (common) layout
        return next((layout[f] for f in value.fields if f in layout), None)
    if not isinstance(value, relax.Call):
        return None
    name = getattr(value.op, "name", "")
    if name in _LAYOUT_OPS:
        attrs = value.attrs
        got = str(getattr(attrs, "out_layout", "") or getattr(attrs, "data_layout", "")
                  or getattr(attrs, "layout", ""))
        return None if got in ("", "NCHW", "NCW", "NCDHW") else got
    if name == "relax.layout_transform":
        return _transform_layout(value, layout.get(value.args[0]))
    if name == "relax.permute_dims" and not tagged:  # ConvertLayout's NHWC transforms
        axes = [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else None
        src = layout.get(value.args[0])
        if src is None and axes == [0, 2, 3, 1]:
            return "NHWC"
        if src == "NHWC" and axes == [0, 3, 1, 2]:
            return None
        return UNKNOWN if src is not None else None
    flat = [f for a in value.args for f in (a.fields if isinstance(a, relax.Tuple) else [a])]
    args = [a for a in flat if isinstance(a, relax.Var) and a in layout]
    if not args:
        return None
    src = args[0]
    ndim = _ndim(src)
    if ndim is None and isinstance(src.ty, relax.TupleType) and src.ty.fields:
        ndim = getattr(src.ty.fields[0], "ndim", None)  # a tuple of concat operands
    if ndim == _ndim(value):
        return layout[src]
    # a rank change (flatten, a reduction without keepdims): a result of rank <= 2 has
    # only the ONNX layout; a higher one (NC16c) is not one we map back
    out_ndim = _ndim(value)
    return None if out_ndim is not None and out_ndim <= 2 else UNKNOWN


def _transform_layout(call, src):
    """The layout a layout_transform writes, from its index map and the source layout:
    probe indices are mapped and the result compared with the maps ConvertLayout makes."""
    imap = call.attrs.index_map
    nin, nout = len(imap.initial_indices), len(imap.final_indices)
    probe = [7, 101, 1013, 10007, 3][:nin]
    try:
        got = [int(v) for v in imap.map_indices([tvm.tirx.IntImm("int64", p) for p in probe])]
    except Exception:  # an index map we cannot evaluate
        return UNKNOWN
    n, c, h, w = (probe + [0] * 4)[:4]
    if src is None and nin == 4:
        if got == [n, h, w, c]:
            return "NHWC"
        if nout == 5:
            b = _static_dim(call, 4)
            if b and got == [n, c // b, h, w, c % b]:
                return f"NCHW{b}c"
    if src == "NHWC" and nin == 4 and got == [n, w, c, h]:
        # (n, h, w, c) -> (n, c, h, w): the probe's positions are NHWC here
        return None
    m = _BLOCKED.match(src or "")
    if m and nin == 5 and nout == 4 and got == [n, c * int(m.group(1)) + probe[4], h, w]:
        return None
    return UNKNOWN


def _static_dim(call, axis: int) -> int | None:
    shape = getattr(call.ty, "shape", None)
    try:
        return int(shape.values[axis])
    except Exception:  # symbolic or absent
        return None


def to_onnx_layout(a: np.ndarray, layout, onnx_shape) -> np.ndarray | None:
    """``a`` (a tensor in ``layout``) in the ONNX layout of shape ``onnx_shape``; None when
    it cannot be mapped (unknown layout, or shapes that do not fit)."""
    onnx_shape = list(onnx_shape)
    if layout is None:
        return a
    if layout == "NHWC" and a.ndim == 4:
        out = a.transpose(0, 3, 1, 2)
    else:
        m = _BLOCKED.match(str(layout))
        if not (m and a.ndim == 5 and len(onnx_shape) == 4 and a.shape[4] == int(m.group(1))):
            return None
        n, c1, h, w, b = a.shape
        out = a.transpose(0, 1, 4, 2, 3).reshape(n, c1 * b, h, w)
        if onnx_shape[1] <= c1 * b:  # channels padded up to whole blocks
            out = out[:, :onnx_shape[1]]
    return out if list(out.shape) == onnx_shape else None
