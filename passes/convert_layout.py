"""Activation layout of conv graphs: NCHW (as imported), NCHW[b]c or NHWC.

NCHW[b]c (``b`` = the target's fp32 vector lanes: 16 for AVX-512, 8 for AVX2, 4 for NEON)
puts ``b`` channels innermost, so a conv kernel loads contiguous vectors of output channels
and stores them without a transpose, and every elementwise op, pool and reduction between
two convs stays in the blocked layout.  TVM's ``relax.transform.ConvertLayout`` does the
propagation: it converts each conv2d to the layout we ask for, pushes the layout through
the ops that can take it (add, relu, clip, pools, concat along channels, means, ...) and
inserts a ``layout_transform`` only where an op cannot, so consecutive convs share one
layout and a ResNet keeps one transform at each end.

We decide per conv (``layout_cb``), each tensor's channel block ``channel_block``: ``b``
when it divides the channels, else (16-lane targets) half of it when that divides them
(MobileNetV2's and EfficientNet's 24 and 40 channels: blocks of 8, one 8-lane vector), else
none.  A float32 2-D conv whose input and output channels both have a block goes to
``NCHW{bi}c`` -> ``NCHW{bo}c`` with weights ``OIHW{bi}i{bo}o`` (a 144 -> 24 projection:
``NCHW16c`` -> ``NCHW8c``); a depthwise conv (groups == C == F) to ``OIHW1i{b}o``; a conv
whose input channels have no block but whose outputs do (an RGB stem) reads NCHW and writes
``NCHW{b}c`` (weights ``OIHW{b}o``), so what follows is blocked without a transform; a
grouped conv whose groups hold whole channel blocks (in and out: RegNet's 64-channel groups)
goes to the blocked layouts as a dense one (each output block reading its group's input
blocks); any other conv (SqueezeNet's 1000-class 1x1, groups of 4 channels, 20 channels)
stays NCHW for ``pack_conv_weights``.  Where TVM's ConvertLayout fails with half blocks (a
concat of an 8- and a 16-channel-block tensor: "Invalid layout axis 8b") the graph is
converted again with whole blocks only.  A 4-D ``split`` (on which TVM's ConvertLayout
fails even in NCHW) becomes ``strided_slice`` s first (``_splits_as_slices``), and channel
slices and concats on block boundaries stay blocked (``_BlockedChannelOps``).  The int32
convs of QDQ models take the same blocks (half ones too: their dot's 256-bit form),
depthwise ones excepted.  The weight
and bias transforms of constants are computed here once (numpy), so no kernel
re-packs weights at run time.  TVM cannot lower the blocked conv2d itself:
``compiler/lowering/legalize_conv_nchwc.py`` does.

``layout`` option: ``NCHW`` (no change), ``NCHWc`` or ``NHWC`` (``HWIO`` weights, every
float32 conv).  The compile driver sets it from ``--layout`` and the target and reports the
choice; ``auto`` is NCHWc on CPU targets.
"""

from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27
from tvm.relax.expr_functor import PyExprMutator, mutator

from .context import GraphPass, PassConfigError, PassReport
from .dataflow import nodes_of, rebind, rewrite_calls, tag
from .relax_util import apply_index_map

LAYOUTS = ("NCHW", "NCHWc", "NHWC")


class ConvertLayout(GraphPass):
    """conv graphs NCHW => NCHW[b]c (or NHWC), transforms only at the ends."""

    name = "convert_layout"
    opt_level = 2
    options = {"layout": "NCHW", "block": 16}

    def rewrite(self, mod, report: PassReport, options: dict):
        layout, block = str(options["layout"]), int(options["block"])
        if layout not in LAYOUTS:
            raise PassConfigError(f"convert_layout: layout {layout!r} is not one of {LAYOUTS}")
        if block < 1:
            raise PassConfigError(f"convert_layout: block must be positive, got {block}")
        if layout == "NCHW" or not _wants_conversion(mod, layout, block):
            # no conv to convert: TVM's ConvertLayout is not even run (on graphs without
            # convs it rejected some reductions and crashed on others)
            return mod
        mod, sliced = _splits_as_slices(mod)
        if sliced:
            report.rewrites["4-D split => strided_slices"] = sliced
        unsafe = _unverified_op(mod, layout, block)
        if unsafe is not None:
            op, var = unsafe
            names = report.node_names or []
            report.rewrites[f"kept NCHW: {op} is not verified in {layout}"] = 1
            report.nodes = [names[k] if k < len(names) else f"#{k}" for k in nodes_of(var.name)]
            return mod
        padded = []
        if layout == "NCHWc":
            padder = _PadOutputChannels(mod, block)
            main = padder.visit_expr(mod["main"])
            if padder.padded:
                mod = padder.builder_.get()
                mod["main"] = main
                padded = padder.padded
        chosen = {}

        def decide_with(half):
            def decide(call):
                if getattr(call.op, "name", "") in _KEPT:
                    return _KEPT
                if getattr(call.op, "name", "") != "relax.nn.conv2d":
                    return {}
                want = _desired(call, layout, block, half)
                if want != ["NCHW", "OIHW"]:
                    chosen[_key(call)] = want
                return {"relax.nn.conv2d": want, **_KEPT}
            return decide

        before = _layout_transforms(mod)
        out, why = None, ""
        # half blocks first; TVM's concat cannot join two block sizes ("Invalid layout
        # axis 8b"): then full blocks only
        for half in ((True, False) if layout == "NCHWc" else (False,)):
            chosen.clear()
            try:
                out = relax.transform.ConvertLayout(
                    {"relax.nn.conv2d": ["NCHW", "OIHW"], **_KEPT},
                    layout_cb=decide_with(half))(mod)
                break
            except (tvm.error.InternalError, RuntimeError) as e:
                # TVM's layout inference of some ops fails even where no blocked tensor
                # reaches them (SwinV2-T's reductions: std::bad_alloc)
                why = str(e).strip().splitlines()[-1][:120] if str(e).strip() else \
                    type(e).__name__
                if half and any(_half(w, block) for w in chosen.values()):
                    report.rewrites[f"no half channel blocks: TVM's ConvertLayout failed "
                                    f"with them ({why})"] = 1
                    continue
                break
        if out is None:  # the graph stays as imported
            report.rewrites[f"kept NCHW: TVM's ConvertLayout failed ({why})"] = 1
            return mod
        if not chosen:
            return mod
        folder = _FoldConstTransforms(out)
        out["main"] = folder.visit_expr(out["main"])
        channels = _BlockedChannelOps(out)
        out["main"] = channels.visit_expr(out["main"])
        if channels.count:
            report.rewrites["channel slices / concats / upsamplings kept blocked"] = \
                channels.count
        # a tensor read by two blocked ops is transformed once, not once per reader
        out = relax.transform.EliminateCommonSubexpr()(out)
        out = relax.transform.DeadCodeElimination(["main"])(out)
        out["main"] = _NameTransforms(out).visit_expr(out["main"])
        convs = _converted_convs(out)
        report.rewrites[f"conv2d NCHW => {layout if layout == 'NHWC' else f'NCHW{block}c'}"] = \
            len(convs)
        if padded:
            report.rewrites[f"conv2d output channels padded to a multiple of {block}"] = \
                len(padded)
        halves = sum(1 for blk in out["main"].body.blocks for b in blk.bindings
                     if isinstance(b.value, relax.Call)
                     and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
                     and _half([str(b.value.attrs.data_layout), str(b.value.attrs.kernel_layout),
                                str(b.value.attrs.out_layout)], block))
        if halves:
            report.rewrites[f"conv2d in half channel blocks (NCHW{block // 2}c)"] = halves
        report.rewrites["weight/bias transforms folded"] = folder.folded
        report.rewrites["activation layout_transforms"] = _layout_transforms(out) - before
        names = report.node_names or []
        report.nodes = sorted({names[k] if k < len(names) else f"#{k}"
                               for v in convs for k in nodes_of(v.name)})
        return out


# Ops TVM's ConvertLayout carries through NCHW[b]c and NHWC correctly (checked against onnxruntime:
# tests/passes/test_convert_layout.py, the zoo).  Others exist whose layout inference is
# wrong in TVM 0.27 on a channel-blocked input: split segfaults, conv2d_transpose fails
# (and in NHWC is left unlowered), a mean over the channel axis fails to lower.  A graph with a 4-D op outside this list
# keeps NCHW, and the report says which op.
_VERIFIED = {
    "relax.nn.conv2d", "relax.add", "relax.subtract", "relax.multiply", "relax.divide",
    "relax.maximum", "relax.minimum", "relax.power", "relax.nn.relu", "relax.nn.leakyrelu",
    "relax.nn.prelu", "relax.sigmoid", "relax.tanh", "relax.exp", "relax.sqrt", "relax.rsqrt",
    "relax.negative", "relax.abs", "relax.clip", "relax.nn.silu", "relax.nn.gelu",
    "relax.erf", "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d",
    "relax.concat", "relax.reshape", "relax.permute_dims", "relax.image.resize2d",
    "relax.nn.pad", "relax.strided_slice", "relax.nn.softmax", "relax.nn.lrn",
    "relax.nn.instance_norm", "relax.layout_transform", "relax.astype", "relax.flatten",
    "relax.round",  # qdq_conv_integer's requantisation
    "relax.repeat",  # Resize / Upsample nearest by an integer factor (FPN, U-Net, YOLO necks)
}
# reductions: verified when they keep the channel axis (axis 1)
_REDUCTIONS = {"relax.mean", "relax.sum", "relax.max", "relax.min"}


# Ops asked for their own NCHW layout: ConvertLayout transforms a blocked input back in front
# of them (TVM's layout inference for conv2d_transpose fails on a channel-blocked input, and
# the ConvTranspose kernels (pack_conv_transpose) read NCHW).  DPT's reassemble stage feeds
# them from blocked 1x1 convs.
_KEPT = {"relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


# Ops whose layout inference fails even on an NCHW input (Split: "Invalid Call" inside
# ConvertLayout on a Split of the graph input, tests/passes/test_convert_layout.py)
_BROKEN = {"relax.split"}


def _unverified_op(mod, layout: str, block: int):
    """(op name, binding var) of the first call on a 4-D tensor that is not verified in the
    blocked layout and may receive a tensor in it, or None.

    A tensor may be blocked when it is a converted conv's output, or the output of an op
    with layout inference (``FRelaxInferLayout``) that reads one.  An op without layout
    inference (matmul, take) is handed its inputs in their NCHW layout by ConvertLayout,
    so its output is NCHW; so is a conv left NCHW's and a ``_KEPT`` op's.  A ``_BROKEN``
    op is refused wherever it is.  A vision transformer's attention matmuls or a Resize's
    gathers are thus no reason to keep a conv head in NCHW."""
    blocked = set()
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            v = b.value
            reads = {x.name for x in relax.analysis.free_vars(v)} & blocked
            if not isinstance(v, relax.Call) or not isinstance(v.op, tvm.ir.Op):
                if reads and not isinstance(v, relax.Call):  # tuples, items, aliases
                    blocked.add(b.var.name)
                continue
            name = v.op.name
            if name == "relax.nn.conv2d":
                if _desired(v, layout, block) != ["NCHW", "OIHW"] or (
                        layout == "NCHWc" and _PadOutputChannels.plan(v, block) is not None):
                    blocked.add(b.var.name)
                continue
            if name in _KEPT or v.op.get_attr("FRelaxInferLayout") is None:
                continue
            if not reads and name not in _BROKEN:
                continue
            if reads:
                blocked.add(b.var.name)
            if not any(getattr(getattr(a, "ty", None), "ndim", -1) == 4 for a in v.args
                       if isinstance(a, relax.Expr)):
                continue
            if name in _VERIFIED:
                continue
            if name in _REDUCTIONS and v.attrs.axis is not None and all(
                    int(ax) % 4 != 1 for ax in v.attrs.axis):
                continue
            return name, b.var
    return None


def _splits_as_slices(mod):
    """(module, splits rewritten): every ``relax.split`` of a 4-D tensor as a tuple of
    ``strided_slice`` s along its axis.  TVM's ConvertLayout fails on a split even of an
    NCHW tensor (``_BROKEN``), so one split kept a whole graph NCHW: YOLOv8's C2f blocks
    (a conv's channels split in two), MobileViTv2's separable attention (q, k, v split
    from one conv's channels); strided_slice carries the blocked layout (``_VERIFIED``)."""

    def slices(m, call):
        x = call.args[0]
        if getattr(x.ty, "ndim", -1) != 4 or x.ty.shape is None:
            return None
        axis = int(call.attrs.axis) % 4
        extent = x.ty.shape.values[axis]
        if not isinstance(extent, tirx.IntImm):
            return None
        n = int(extent)
        ind = call.attrs.indices_or_sections
        if isinstance(ind, (tirx.IntImm, int)):  # equal sections
            k = int(ind)
            if k <= 0 or n % k:
                return None
            cuts = [n // k * i for i in range(1, k)]
        else:
            cuts = [int(i) for i in ind]
        bounds = [0] + cuts + [n]
        src = m.visit_expr(x)
        parts = [m.builder_.emit(relax.op.strided_slice(src, axes=[axis], begin=[b], end=[e]),
                                 name_hint=f"{m.binding.var.name}_{j}")
                 for j, (b, e) in enumerate(zip(bounds, bounds[1:]))]
        # one section: TVM's split gives the tensor itself, not a tuple
        return relax.Tuple(parts) if isinstance(call.ty, relax.TupleType) else parts[0]

    mod, done = rewrite_calls(mod, "relax.split", slices)
    return mod, len(done)


def _wants_conversion(mod, layout: str, block: int) -> bool:
    """Some conv2d in main would change layout (or be padded to whole blocks)."""
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            v = b.value
            if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.nn.conv2d":
                if _desired(v, layout, block) != ["NCHW", "OIHW"]:
                    return True
                if layout == "NCHWc" and _PadOutputChannels.plan(v, block) is not None:
                    return True
    return False


def _key(call):
    return (tuple(str(d) for d in call.args[0].ty.shape), tuple(call.args[1].ty.shape))


def _desired(call, layout: str, block: int, half: bool = True) -> list:
    """[data layout, kernel layout(, output layout)] for one conv2d call; ``half``: channel
    counts that are a multiple of half a 16-lane block may take half blocks
    (``channel_block``)."""
    keep = ["NCHW", "OIHW"]
    a, (x, w) = call.attrs, call.args
    # float32 convs, and the int16 x int16 -> int32 convs of qdq_conv_integer (NCHW[b]c
    # only, not depthwise: pack_int_conv takes them onto the integer kernel)
    integer = (str(x.ty.dtype) == "int16" and str(w.ty.dtype) == "int16"
               and str(a.out_dtype) == "int32" and layout == "NCHWc")
    if (a.data_layout != "NCHW" or a.kernel_layout != "OIHW"
            or (a.out_layout or "NCHW") != "NCHW" or x.ty.ndim != 4
            or not _static_channels(x, w)
            or not (integer or (str(x.ty.dtype) == "float32" and str(w.ty.dtype) == "float32"
                                and (not a.out_dtype
                                     or str(a.out_dtype) in ("", "void", "float32"))))):
        return keep
    if layout == "NHWC":
        return ["NHWC", "HWIO"]  # output channels contiguous: the CPU NHWC kernel's vector
    c, f, g = int(x.ty.shape[1]), int(w.ty.shape[0]), int(a.groups)
    bi, bo = channel_block(c, block, half), channel_block(f, block, half)
    if g == 1 and not bi and bo:
        # an RGB stem: NCHW in, blocked out, so what follows is blocked without a
        # transform (measured: MobileNetV2 kernels 4.0 -> 3.2 ms of one core's time)
        return ["NCHW", f"OIHW{bo}o", f"NCHW{bo}c"]
    if not (bi and bo):
        return keep
    if g == 1:
        return [f"NCHW{bi}c", f"OIHW{bi}i{bo}o", f"NCHW{bo}c"]
    if g == c == f and not integer:
        return [f"NCHW{bi}c", f"OIHW1i{bo}o"]
    if (c // g) % bi == 0 and (f // g) % bo == 0:
        # grouped, whole channel blocks per group (RegNet's 64-wide groups, ResNeXt's
        # wide ones): the dense blocked kernel, each output block reading its group's
        # input blocks
        return [f"NCHW{bi}c", f"OIHW{bi}i{bo}o", f"NCHW{bo}c"]
    return keep


def _static_channels(x, w) -> bool:
    """True when a conv's shapes are static but for the input's batch, height and width
    (a symbolic image size: the blocked rules tile its output columns, padded to whole
    tiles, legalize_conv_nchwc)."""
    return (isinstance(x.ty.shape[1], tirx.IntImm)
            and all(isinstance(d, tirx.IntImm) for d in w.ty.shape))


def _half(want: list, block: int) -> bool:
    """True when a conv's chosen layouts use a half channel block."""
    return any(int(n) == block // 2 for lay in want for n in re.findall(r"(\d+)[cio]", lay))


def channel_block(channels: int, block: int, half: bool = True) -> int:
    """The channel block of a tensor of ``channels``: ``block`` (the target's lanes) when it
    divides them, else half of a 16-lane block (MobileNetV2's and EfficientNet's 24 and 40
    channels on AVX-512: one 8-lane vector a block, an AVX2 register's worth), else 0 (not
    blocked).  Without the half block a 144 -> 24 projection stayed NCHW, at a third of the
    blocked kernel's speed, with a transform on each side."""
    if channels % block == 0:
        return block
    if half and block >= 16 and block % 2 == 0 and channels % (block // 2) == 0:
        return block // 2
    return 0


def _layout_transforms(mod) -> int:
    """layout_transform calls on non-constants in main."""
    n = 0
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            v = b.value
            if (isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.layout_transform"
                    and not isinstance(v.args[0], GenericConst)):
                n += 1
    return n


def _converted_convs(mod) -> list:
    out = []
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            v = b.value
            if (isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.nn.conv2d"
                    and (v.attrs.out_layout or v.attrs.data_layout) != "NCHW"):
                out.append(b.var)
    return out


@mutator
class _PadOutputChannels(PyExprMutator):
    """conv2d(x, W) with F output channels, F not a multiple of ``block`` but large (the
    1000-class 1x1 conv that ends SqueezeNet) => strided_slice(conv2d(x, W padded with zero
    filters to F' = ceil(F / block) * block), channels [0, F)): the conv runs blocked,
    the slice (with the transform back to NCHW in front of it) is a cheap copy.  Only when
    the input channels are blockable and the padding adds at most 1/4 of the work."""

    def __init__(self, mod, block):
        super().__init__(mod)
        self.block = block
        self.padded = []
        self._used = {}
        for blk in mod["main"].body.blocks:
            for b in blk.bindings:
                if nodes_of(b.var.name):
                    base, _, j = b.var.name.partition("_")
                    self._used[base] = max(self._used.get(base, 0),
                                           int(j) if j.isdigit() else 0)

    def visit_var_binding_(self, binding):
        v = binding.value
        plan = self._plan(v)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        f, wp = plan
        nodes = nodes_of(binding.var.name)
        base = tag(nodes) if nodes else "conv"
        self._used[base] = self._used.get(base, 0) + 1
        conv = relax.Call(v.op, [self.visit_expr(v.args[0]), relax.const(wp, str(wp.dtype))],
                          v.attrs, v.ty_args)
        conv_var = self.builder_.emit(conv, name_hint=f"{base}_{self._used[base]}")
        rebind(self, binding, relax.op.strided_slice(conv_var, axes=[1], begin=[0], end=[f]))
        self.padded.append(binding.var)

    def _plan(self, v):
        return self.plan(v, self.block)

    @staticmethod
    def plan(v, block):
        """(F, zero-padded weight) when conv2d call ``v`` is padded; else None."""
        if not (isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.nn.conv2d"
                and isinstance(v.args[1], GenericConst)):
            return None
        xt, wt = v.args[0].ty, v.args[1].ty
        if (_desired(v, "NCHWc", block, half=False) != ["NCHW", "OIHW"]
                or int(v.attrs.groups) != 1
                or xt.ndim != 4 or wt.ndim != 4 or str(xt.dtype) != "float32"
                or str(wt.dtype) != "float32"
                or not all(isinstance(d, tirx.IntImm) for d in (xt.shape[1], wt.shape[0]))):
            return None
        f, c = int(wt.shape[0]), int(xt.shape[1])
        if c % block or not f % block or f < 4 * block:
            return None
        # the weight is copied only for a conv that is padded (this runs on every conv)
        w = v.args[1].value.numpy()
        fp = -(-f // block) * block
        wp = np.zeros((fp, *w.shape[1:]), dtype=w.dtype)
        wp[:f] = w
        return f, wp


@mutator
class _NameTransforms(PyExprMutator):
    """Name each activation layout_transform after the ONNX node whose output it converts
    (or, for a graph input, the node that reads it), so its kernel names a node too."""

    def __init__(self, mod):
        super().__init__(mod)
        binds = [b for blk in mod["main"].body.blocks for b in blk.bindings]
        used = {}
        for b in binds:
            m = nodes_of(b.var.name)
            if m:
                base, _, j = b.var.name.partition("_")
                used[base] = max(used.get(base, 0), int(j) if j.isdigit() else 0)
        readers = {}
        for b in binds:
            for v in relax.analysis.free_vars(b.value):
                readers.setdefault(v.name, b.var.name)
        self.names = {}
        for b in binds:
            v = b.value
            if not (isinstance(v, relax.Call) and getattr(v.op, "name", "") ==
                    "relax.layout_transform" and isinstance(v.args[0], relax.Var)):
                continue
            nodes = nodes_of(v.args[0].name) or nodes_of(readers.get(b.var.name, ""))
            if nodes:
                base = tag(nodes)
                used[base] = used.get(base, 0) + 1
                self.names[b.var.name] = f"{base}_{used[base]}"

    def visit_var_binding_(self, binding):
        name = self.names.get(binding.var.name)
        if name is None:
            super().visit_var_binding_(binding)
            return
        rebind(self, binding, self.visit_expr(binding.value), name)


def _map(index_map, idx: list) -> list | None:
    try:
        return [int(e) for e in index_map.map_indices([tirx.IntImm("int64", i) for i in idx])]
    except Exception:  # noqa: BLE001 - not a map of constants
        return None


def _is_unblocking(call, b: int) -> bool:
    """``call`` is layout_transform NCHW{b}c -> NCHW, no padding."""
    m = call.attrs.index_map
    return (call.attrs.pad_value is None and _map(m, [0, 1, 2, 3, 4]) == [0, b + 4, 2, 3]
            and _map(m, [1, 2, 3, 4, 5]) == [1, 2 * b + 5, 3, 4])


def _is_blocking(call, b: int) -> bool:
    """``call`` is layout_transform NCHW -> NCHW{b}c, no padding."""
    m = call.attrs.index_map
    return (call.attrs.pad_value is None and _map(m, [0, b + 3, 2, 1]) == [0, 1, 2, 1, 3]
            and _map(m, [1, 2 * b + 1, 3, 4]) == [1, 2, 3, 4, 1])


@mutator
class _BlockedChannelOps(PyExprMutator):
    """After TVM's ConvertLayout: a channel slice of a blocked tensor on block boundaries,
    a nearest upsampling (``repeat`` over H or W) of one, and a blocked copy of a channel
    concat of such tensors, computed in the blocked layout.  TVM's strided_slice layout
    inference does not slice the outer channel axis, so a split (``_splits_as_slices``:
    YOLOv8's C2f) went blocked -> NCHW, sliced, concatenated in NCHW and back to blocked;
    its repeat inference hands repeat NCHW, so an FPN's ``concat(upsample(a), b)`` did the
    same (a YOLOv5 neck: four transforms).  ``strided_slice(unblock(X), C[k:l])`` =>
    ``unblock(X[:, k/b:l/b])``, ``repeat(unblock(X), r, H | W)`` => ``unblock(repeat(X, r,
    H | W))``, ``block(unblock(X))`` => ``X``, ``block(concat(unblock(X_i)))`` =>
    ``concat(X_i)``."""

    def __init__(self, mod):
        super().__init__(mod)
        self.values = {b.var: b.value for blk in mod["main"].body.blocks for b in blk.bindings}
        self.blocked = {}   # original var -> (its blocked form, already visited; block)
        self.count = 0

    def _source(self, e):
        """``e`` through aliases and items of literal tuples, as an original var."""
        for _ in range(8):
            v = self.values.get(e) if isinstance(e, relax.Var) else None
            if isinstance(v, relax.Var):
                e = v
            elif isinstance(v, relax.TupleGetItem) and isinstance(v.tuple_value, relax.Var) \
                    and isinstance(self.values.get(v.tuple_value), relax.Tuple):
                e = self.values[v.tuple_value].fields[v.index]
            else:
                return e
        return e

    def _unblocked(self, e):
        """(the blocked tensor, visited; b) when ``e`` is an NCHW view of one, else None."""
        e = self._source(e)
        if e in self.blocked:
            return self.blocked[e]
        v = self.values.get(e) if isinstance(e, relax.Var) else None
        if not (isinstance(v, relax.Call) and getattr(v.op, "name", "") ==
                "relax.layout_transform") or getattr(v.args[0].ty, "ndim", -1) != 5:
            return None
        b = v.args[0].ty.shape[4]
        if not isinstance(b, tirx.IntImm) or not _is_unblocking(v, int(b)):
            return None
        return self.visit_expr(v.args[0]), int(b)

    def visit_var_binding_(self, binding):
        v = binding.value
        name = getattr(getattr(v, "op", None), "name", "") if isinstance(v, relax.Call) else ""
        new = None
        if name == "relax.strided_slice":
            new = self._slice(binding, v)
        elif name == "relax.repeat":
            new = self._repeat(binding, v)
        elif name == "relax.layout_transform" and getattr(v.ty, "ndim", -1) == 5:
            new = self._block(v)
        if new is None:
            super().visit_var_binding_(binding)
            return
        self.count += 1
        rebind(self, binding, new)

    def _slice(self, binding, v):
        ints = []  # axes, begin, end (strides): constant tuples of the call (TVM 0.27)
        for t in v.args[1:]:
            fields = getattr(t, "fields", None)
            if fields is None or not all(isinstance(f, tirx.IntImm) for f in fields):
                return None
            ints.append([int(f) for f in fields])
        if ints[0] != [1] or (len(ints) > 3 and ints[3] != [1]):
            return None
        src = self._unblocked(v.args[0])
        if src is None:
            return None
        x, b = src
        k, end = ints[1][0], ints[2][0]
        c = int(v.args[0].ty.shape[1])
        end = min(end, c)
        if k < 0 or k % b or end % b or end <= k:
            return None
        part = self.builder_.emit(relax.op.strided_slice(x, axes=[1], begin=[k // b],
                                                         end=[end // b]),
                                  name_hint=f"{binding.var.name}_blk")
        self.blocked[binding.var] = (part, b)
        unblock = self.values[self._source(v.args[0])]
        return relax.op.layout_transform(part, unblock.attrs.index_map)

    def _repeat(self, binding, v):
        axis = v.attrs.axis
        if axis is None or getattr(v.args[0].ty, "ndim", -1) != 4 or int(axis) % 4 not in (2, 3):
            return None
        src = self._unblocked(v.args[0])
        if src is None:
            return None
        x, b = src
        # named as the binding (its ONNX node: the kernel's name in reports)
        part = self.builder_.emit(relax.op.repeat(x, int(v.attrs.repeats), axis=int(axis) % 4),
                                  name_hint=binding.var.name)
        self.blocked[binding.var] = (part, b)
        return relax.op.layout_transform(part, lambda n, c, h, w, i: (n, c * b + i, h, w))

    def _block(self, v):
        b = int(v.ty.shape[4]) if isinstance(v.ty.shape[4], tirx.IntImm) else 0
        if not b or not _is_blocking(v, b):
            return None
        src = self._unblocked(v.args[0])
        if src is not None:
            return src[0] if src[1] == b else None
        cat = self.values.get(self._source(v.args[0]))
        if not (isinstance(cat, relax.Call) and getattr(cat.op, "name", "") == "relax.concat"
                and int(cat.attrs.axis) % 4 == 1):
            return None
        fields = cat.args[0]
        if isinstance(fields, relax.Var) and isinstance(self.values.get(fields), relax.Tuple):
            fields = self.values[fields]
        if not isinstance(fields, relax.Tuple):
            return None
        parts = [self._unblocked(f) for f in fields.fields]
        if any(p is None or p[1] != b for p in parts):
            return None
        return relax.op.concat([p[0] for p in parts], axis=1)


@mutator
class _FoldConstTransforms(PyExprMutator):
    """layout_transform(constant) => the transformed constant."""

    def __init__(self, mod):
        super().__init__(mod)
        self.folded = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if (getattr(call.op, "name", "") == "relax.layout_transform"
                and isinstance(call.args[0], GenericConst) and call.attrs.pad_value is None):
            try:
                value = apply_index_map(call.attrs.index_map, call.args[0].value.numpy())
            except ValueError:
                return call
            self.folded += 1
            return relax.const(value, str(call.args[0].ty.dtype))
        return call
