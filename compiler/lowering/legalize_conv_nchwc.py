"""Legalization of ``relax.nn.conv2d`` in NCHW[b]c, which TVM 0.27 cannot lower.

``passes/convert_layout.py`` rewrites conv graphs to ``data_layout="NCHW{b}c"`` with
kernels ``OIHW{b}i{b}o`` (or ``OIHW1i{b}o`` for depthwise convs).  TVM 0.27's own
legalization of conv2d only knows plain layouts ("channel chunk cannot be legalized") and
leaves the call as it is, so nothing would be built.  This module registers, on the op
itself (``FLegalize``, as ``legalize_reductions`` does for max/min), a TE compute for the
two blocked forms; every other conv2d keeps TVM's legalization:

* dense (``groups == 1``)::

    out[n, fo, y, x, fi] = sum_{co, ry, rx, ci} pad[n, co, y*sh + ry*dh, x*sw + rx*dw, ci]
                                                * w[fo, co, ry, rx, ci, fi]

* NCHW input, blocked output (a 3-channel stem: ``data_layout="NCHW"``, kernel
  ``OIHW{b}o``, ``out_layout="NCHW{b}c"``), so the whole network after the stem is
  blocked::

    out[n, fo, y, x, v] = sum_{c, ry, rx} pad[n, c, y*sh + ry*dh, x*sw + rx*dw]
                                          * w[fo, c, ry, rx, v]

* grouped (``groups == g``, whole blocks per group: ``fpg`` output and ``cpg`` input
  blocks per group), the dense form reading the output block's group::

    out[n, fo, y, x, fi] = sum_{co, ry, rx, ci} pad[n, fo // fpg * cpg + co, ..., ci]
                                                * w[fo, co, ry, rx, ci, fi]

* depthwise (``groups == C``, kernel block ``1i``)::

    out[n, c, y, x, v] = sum_{ry, rx} pad[n, c, y*sh + ry*dh, x*sw + rx*dw, v]
                                      * w[c, 0, ry, rx, 0, v]

A dense or grouped 1x1 conv with a stride and no padding (ResNet's downsampling shortcuts)
first copies the pixels it reads into a ``subsample`` stage and then runs with stride 1::

    sub[n, c, y, x, ci] = data[n, c, y*sh, x*sw, ci]

Every output channel block re-reads the whole input; read in place, each block's pixels
are ``sw`` blocks apart (half of every cache line unused at stride 2, twice the lines),
so the input a pass walks no longer fits L2 (ResNet-50's 1024 -> 2048 at 14 x 14: 400 KB
of lines per block, against 200 KB contiguous after the copy).

Output widths with no good register tile (a prime: Inception-v3's 71 / 73-wide maps leave
1-pixel tiles of 4 loads per 4 FMAs) are computed over a few more columns
(``padded_width``: when the target's register tile over the wider row does at least 15%
less work per output pixel), the extra columns reading in bounds (the right padding grows,
or the index is clamped to the last column) and a ``conv_columns`` stage dropping them,
which the rule folds into its write-back.  The target's tile parameters come from
``register_tiles`` (set by the driver around lowering; none: no padding).

A symbolic image size (a model exported with dynamic height and width, channels static)
gives symbolic output rows and columns.  The columns are then always computed over whole
register tiles: ``ceil(ow / xt) * xt`` of them (``symbolic_columns``: the tile that wastes
least at the width the dims' ``opt`` values give, or at ``NOMINAL_WIDTH``), the extra ones
reading zeros (or clamped) and dropped by ``conv_columns`` as above, so the rule's split of
the columns is exact and its tile keeps every static rule's shape.

The CPU rule ``schedules/cpu/conv2d_nchwc.py`` schedules both.

Plain NCHW convs over a symbolic image (channels no block divides: ShuffleNetV2's 58 /
116, RegNet-Y's and ResNeXt's narrow groups, depthwise convs among them) stay NCHW, where
the columns are the vector lanes.  Their output width is padded the same way
(``conv2d_nchw_columns``: ``symbolic_nchw_columns`` picks whole vectors of columns), the
extra columns reading zeros from a right padding that always exists (a clamped column
index would be a gather in a vectorised load), and ``conv_columns`` drops them:
``schedules/cpu/conv2d.py`` and ``depthwise.py`` read the tile back.  A static plain NCHW
conv (groups 1) whose output width no vector divides is padded to whole vectors too when
that uses the lanes better (``static_nchw_columns``: a 129-wide row ran 3-lane tiles, its
only divisor under 16).  Every other conv2d
keeps TVM's legalization.  Imported for its side effect by ``compiler/pipeline.py``.
"""

from __future__ import annotations

import contextlib
import contextvars
import re

import tvm
from tvm import te, topi

from schedules.cpu.conv2d_nchwc import SUBSAMPLE

_ATTR = "FLegalize"
# (fp32 lanes, accumulator registers) of the target's conv register tile, while lowering
# for a CPU (``register_tiles``); None: widths are never padded
_TILES: contextvars.ContextVar = contextvars.ContextVar("nchwc_tiles", default=None)
# {dim name: opt} of the symbolic dims, while lowering (``register_tiles``)
_DIM_OPT: contextvars.ContextVar = contextvars.ContextVar("nchwc_dim_opt", default={})
# A padded row must save this share of the work per output pixel (loads per FMA x columns)
PAD_GAIN = 0.85
# Extra columns tried at most, and the narrowest row padded: Inception-v3's 80 -> 192 3x3
# over 73 columns (71 out) ran 15.8 -> 10.5 ms single thread over 72, its 17-wide 1x7 /
# 7x1 convs the same padded or not (Xeon 6 model 207, one thread)
MAX_PAD = 8
MIN_WIDTH = 32
# A symbolic output width no dim's opt value gives is tiled as if this wide (ResNet's
# 56-wide maps at 224 x 224)
NOMINAL_WIDTH = 56


@contextlib.contextmanager
def register_tiles(lanes: int, accumulators: int, dim_opt: dict | None = None):
    """Lower NCHW[b]c convs for a CPU whose conv tile has ``accumulators`` registers of
    ``lanes`` fp32 lanes (cpu.conv2d_nchwc's ``tile`` on that target); ``dim_opt``:
    ``{dim: opt}`` of symbolic dims, the sizes symbolic widths are tiled for."""
    token = _TILES.set((int(lanes), int(accumulators)))
    opt = _DIM_OPT.set(dict(dim_opt or {}))
    try:
        yield
    finally:
        _TILES.reset(token)
        _DIM_OPT.reset(opt)


def _at_opt(expr) -> int:
    """``expr`` (a symbolic width) at the dims' opt values, or ``NOMINAL_WIDTH``."""
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    opt, ana = _DIM_OPT.get(), Analyzer()
    for v in tirx.analysis.undefined_vars(expr):
        if v.name in opt:
            ana.bind(v, tirx.const(int(opt[v.name]), "int64"))
    value = ana.simplify(expr)
    return int(value) if isinstance(value, tirx.IntImm) and int(value) > 0 else NOMINAL_WIDTH


def symbolic_columns(ow, fblocks: int, block: int, depthwise: bool = False) -> int:
    """Output columns a register tile covers over a symbolic output width ``ow`` (an
    expression): the tile of ``columns_group`` channel blocks (dense) with the fewest
    loads per output pixel over the columns padded to whole tiles at the width ``ow`` has
    at the dims' opt values; depthwise: the widest row within ``depthwise_tile``'s budget
    that pads least.  The rule reads it back off the padded extent.  1 when no CPU tile is
    registered."""
    tiles = _TILES.get()
    if tiles is None:
        return 1
    from schedules.cpu.conv2d_nchwc import columns_group, max_columns, symbolic_budget

    lanes, budget = tiles
    budget = symbolic_budget(lanes, budget)
    width = -(-block // lanes)
    at = _at_opt(ow)
    widths = range(1, max_columns(budget, width) + 1)
    if depthwise:
        return min(widths, key=lambda x: (-(-at // x) * x, -x))

    def cost(x):
        ft = columns_group(x, fblocks, width, budget)
        return (-(-at // x) * x * (1 / ft + 1 / x), -x)

    return min(widths, key=cost)


def symbolic_nchw_columns(ow, channels: int, depthwise: bool) -> int:
    """Output columns a register tile of a plain NCHW conv covers over a symbolic width
    ``ow``: whole vectors (1, 2 or 4), the fewest loads per output over the columns padded
    to whole tiles at the width ``ow`` has at the dims' opt values (a tile of ``nv``
    vectors x ``reg_rows`` of the ``channels`` output channels per group: ``nv`` loads and
    as many broadcasts per row); depthwise (a row of vectors, no channel rows): the
    fewest padded columns, ties to the wider.  1 when no CPU tile is registered."""
    tiles = _TILES.get()
    if tiles is None:
        return 1
    from schedules.cpu.common import reg_rows
    from schedules.cpu.conv2d_nchwc import symbolic_budget

    lanes, budget = tiles
    budget = symbolic_budget(lanes, budget)
    at = _at_opt(ow)

    def cost(nv):
        x = nv * lanes
        padded = -(-at // x) * x
        if depthwise:
            return padded, -nv
        rows = reg_rows(channels, nv, budget)
        return padded * (1 / rows + 1 / nv), -nv

    return lanes * min((nv for nv in (1, 2, 4) if nv <= budget), key=cost)


def padded_width(oh: int, ow: int, fblocks: int, block: int) -> int:
    """The output width the register tile should run over: ``ow``, or up to ``MAX_PAD``
    more columns where cpu.conv2d_nchwc's tile over them costs ``PAD_GAIN`` or less of the
    loads per output pixel (a weight vector serves ``yt * xt`` FMAs, a broadcast ``ft``).
    ``fblocks``: the output channel blocks a tile may group; ``block``: channels a block."""
    tiles = _TILES.get()
    if tiles is None or ow < MIN_WIDTH:
        return ow
    from schedules.cpu.conv2d_nchwc import tile

    lanes, budget = tiles
    width = -(-block // lanes)
    oh = oh if isinstance(oh, int) else 1  # symbolic rows: tiles of one row

    def cost(w):
        yt, xt, ft = tile(oh, w, fblocks, width, budget)
        return w * (1 / ft + 1 / (yt * xt))

    best = min(range(ow, ow + MAX_PAD + 1), key=lambda w: (cost(w), w))
    return best if cost(best) <= PAD_GAIN * cost(ow) else ow


_DATA = re.compile(r"^NCHW(\d+)c$")
_KERNEL = re.compile(r"^OIHW(\d+)i(\d+)o$")
_KERNEL_OUT = re.compile(r"^OIHW(\d+)o$")


def blocked_layouts(attrs):
    """(data block, kernel in-block, kernel out-block) of a blocked conv's attrs (data
    block 0 and kernel in-block 0 for an NCHW input), or None for any other layout
    combination."""
    o = _DATA.match(str(attrs.out_layout or attrs.data_layout))
    if str(attrs.data_layout) == "NCHW":
        k = _KERNEL_OUT.match(str(attrs.kernel_layout))
        if not (k and o) or int(o.group(1)) != int(k.group(1)):
            return None
        return 0, 0, int(k.group(1))
    d, k = _DATA.match(str(attrs.data_layout)), _KERNEL.match(str(attrs.kernel_layout))
    if not (d and k and o) or int(o.group(1)) != int(k.group(2)):
        return None
    return int(d.group(1)), int(k.group(1)), int(k.group(2))


def conv2d_nchwc(data, kernel, strides, padding, dilation, depthwise: bool, groups: int = 1):
    """TE compute of a blocked conv (the four forms above; a 4-D ``data`` is the NCHW
    input form); ``padding`` is (top, left, bottom, right)."""
    rank = len(data.shape)
    n, h, w = (_dim(data.shape[k]) for k in (0, 2, 3))
    fo, kh, kw, ob = (int(kernel.shape[k]) for k in (0, 2, 3, -1))
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    pt, pl, pb, pr = (int(p) for p in padding)
    oh = _out_extent(h, pt, pb, kh, dh, sh)
    ow = _out_extent(w, pl, pr, kw, dw, sw)
    subsample = (rank == 5 and kh == kw == 1 and (sh, sw) != (1, 1) and not depthwise
                 and not (pt or pl or pb or pr))
    full = ow
    if not isinstance(ow, int):  # symbolic: whole register tiles of columns, always
        xt = symbolic_columns(ow, fo // groups, ob, depthwise)
        # at least one tile, provably: TVM then compacts a tile's accumulators to a static
        # buffer, which LLVM keeps in registers (with a tile count that may be 0 it was
        # min(tiles, 1) * xt long, in memory: a store per FMA, 3x slower)
        full = tvm.te.max((ow + xt - 1) // xt, 1) * xt
    elif not depthwise and not subsample:
        full = padded_width(oh, ow, fo // groups, ob)  # the tile groups a group's blocks
    widened = not (isinstance(full, int) and full == ow)
    clamp = widened and not (pt or pl or pb or pr)
    if pt or pl or pb or pr:
        tail = [0] * (rank - 4)
        if widened:  # the extra columns read zeros; the width the conv reads, written
            # so that the simplifier sees the pad's extent cover the conv's reads
            pr = _right_pad(full, w, pl, kw, dw, sw)
        data = topi.nn.pad(data, [0, 0, pt, pl, *tail], [0, 0, pb, pr, *tail],
                           name="pad_temp")
    if subsample:
        src = data
        data = te.compute((n, int(data.shape[1]), oh, ow, int(data.shape[4])),
                          lambda i, c, y, x, v: src[i, c, y * sh, x * sw, v], name=SUBSAMPLE)
        sh = sw = 1
    conv = _conv(data, kernel, (n, fo, oh, full, ob), (sh, sw), (dh, dw), depthwise, groups,
                 _dim(data.shape[3]) - 1 if clamp else None)  # after a subsample: its width
    if not widened:
        return conv
    # the extra columns dropped (cpu.conv2d_nchwc folds this into its write-back)
    return te.compute((n, fo, oh, ow, ob), lambda *i: conv[i], name="conv_columns")


def conv2d_nchw_columns(data, kernel, strides, padding, dilation, groups: int):
    """TE compute of a plain NCHW x OIHW float conv over a symbolic output width, its
    columns padded to whole register tiles (``symbolic_nchw_columns``), or over a static
    width ``static_nchw_columns`` pads, the extra columns dropped by a ``conv_columns``
    stage; ``padding`` is (top, left, bottom, right)."""
    n, c, h, w = (_dim(d) for d in data.shape)
    f, cpg, kh, kw = (int(kernel.shape[k]) for k in range(4))
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    pt, pl, pb, pr = (int(p) for p in padding)
    oh = _out_extent(h, pt, pb, kh, dh, sh)
    ow = _out_extent(w, pl, pr, kw, dw, sw)
    depthwise = groups == c == f and cpg == 1
    if isinstance(ow, int):  # a static width with no good tile: whole vectors
        full = static_nchw_columns(ow)
    else:
        xt = symbolic_nchw_columns(ow, f // groups, depthwise)
        full = tvm.te.max((ow + xt - 1) // xt, 1) * xt  # provably one tile or more
    # the extra columns read zeros: the width they read, as in conv2d_nchwc
    pr = _right_pad(full, w, pl, kw, dw, sw)
    pad = topi.nn.pad(data, [0, 0, pt, pl], [0, 0, pb, pr], name="pad_temp")
    rc = te.reduce_axis((0, cpg), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    fpg = f // groups

    def channel(o):
        if groups == 1:
            return rc
        if depthwise:
            return o + rc
        return o // fpg * cpg + rc

    conv = te.compute(
        (n, f, oh, full),
        lambda i, o, y, x: te.sum(
            pad[i, channel(o), y * sh + ry * dh, x * sw + rx * dw] * kernel[o, rc, ry, rx],
            axis=[rc, ry, rx]),
        name="conv2d_nchw")
    return te.compute((n, f, oh, ow), lambda *i: conv[i], name="conv_columns")


def static_nchw_columns(ow: int) -> int:
    """The columns a plain NCHW conv of static output width ``ow`` (groups 1) is computed
    over: ``ow``, or ``ow`` rounded up to whole vectors when that uses the lanes at least
    ``1 / PAD_GAIN`` times better than cpu.conv2d_nchw's tile over ``ow`` (``vector_tile``:
    a divisor of ``ow`` of at most one vector when no vector divides it, 3 of 16 lanes
    for pix2pix's 129-wide phase conv).  ``ow`` when no CPU tile is registered."""
    tiles = _TILES.get()
    if tiles is None or ow < MIN_WIDTH:
        return ow
    from schedules.cpu.common import vector_tile

    lanes = tiles[0]
    xt = vector_tile(ow, lanes)
    full = -(-ow // lanes) * lanes
    used = xt / (-(-xt // lanes) * lanes)
    return full if ow / full * PAD_GAIN >= used else ow


def _padded_nchw(call) -> bool:
    """True when ``call`` is a plain NCHW x OIHW float32 conv2d whose output width is
    symbolic (or static, groups 1, and ``static_nchw_columns`` pads it), channels and
    kernel static, while a CPU tile is registered."""
    a = call.attrs
    if _TILES.get() is None or str(a.data_layout) != "NCHW" or str(
            a.kernel_layout) != "OIHW" or str(a.out_layout or "NCHW") != "NCHW":
        return False
    x, k = call.args
    if str(x.ty.dtype) != "float32" or str(k.ty.dtype) != "float32" or (
            a.out_dtype and str(a.out_dtype) not in ("", "float32")):
        return False
    xs, ks, out = x.ty.shape, k.ty.shape, call.ty.shape
    if xs is None or ks is None or out is None or len(xs) != 4:
        return False
    static = all(isinstance(d, tvm.tirx.IntImm) for d in (xs[1], *ks))
    if static and isinstance(out[3], tvm.tirx.IntImm):
        return (int(a.groups) == 1 and all(isinstance(d, tvm.tirx.IntImm) for d in out)
                and static_nchw_columns(int(out[3])) != int(out[3]))
    return static


def _out_extent(n, before: int, after: int, k: int, d: int, s: int):
    """A conv's output extent along one axis of input extent ``n`` (simplified)."""
    return _simplified((n + before + after - (k - 1) * d - 1) // s + 1)


def _right_pad(full, w, left: int, k: int, d: int, s: int):
    """The right padding under which ``full`` output columns read only the padded input
    (the extra columns of a widened row read zeros), written so that the simplifier sees
    the pad's extent cover the conv's reads."""
    return (full - 1) * s + (k - 1) * d + 1 - left - w


def _simplified(e):
    """A symbolic output extent in the simplifier's form, the form Relax's shape inference
    gives the conv's result (FuseTIR refuses a tensor two kernels declare with different
    expressions: EfficientNet's squeeze-and-excitation over a symbolic image)."""
    if isinstance(e, int):
        return e
    from tvm.sym.analyzer import Analyzer

    return Analyzer().simplify(e)


def _dim(d):
    """A shape entry: an int when static, else the expression."""
    from tvm import tirx

    return int(d) if isinstance(d, (int, tirx.IntImm)) else d


def _conv(data, kernel, shape, strides, dilation, depthwise: bool, groups: int, last):
    """The reduction of ``conv2d_nchwc`` over an output of ``shape`` (its width maybe
    padded); ``last``: clamp input columns to it (no padding stage to read past)."""
    rank = len(data.shape)
    n, fo, oh, ow, ob = shape
    (sh, sw), (dh, dw) = strides, dilation
    kh, kw = (int(kernel.shape[k]) for k in (2, 3))

    def col(x, rx):
        return x * sw + rx * dw if last is None else te.min(x * sw + rx * dw, last)

    if rank == 4:
        rc = te.reduce_axis((0, int(data.shape[1])), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    if rank == 4:
        return te.compute(
            (n, fo, oh, ow, ob),
            lambda i, f, y, x, v: te.sum(
                data[i, rc, y * sh + ry * dh, col(x, rx)] * kernel[f, rc, ry, rx, v],
                axis=[rc, ry, rx]),
            name="conv2d_NCHWc_from_NCHW")
    if depthwise:
        return te.compute(
            (n, fo, oh, ow, ob),
            lambda i, c, y, x, v: te.sum(
                data[i, c, y * sh + ry * dh, col(x, rx), v] * kernel[c, 0, ry, rx, 0, v],
                axis=[ry, rx]),
            name="depthwise_conv2d_NCHWc")
    co = te.reduce_axis((0, int(kernel.shape[1])), "rco")
    ci = te.reduce_axis((0, int(kernel.shape[4])), "rci")
    if groups > 1:
        fpg, cpg = fo // groups, int(kernel.shape[1])
        return te.compute(
            (n, fo, oh, ow, ob),
            lambda i, f, y, x, v: te.sum(
                data[i, f // fpg * cpg + co, y * sh + ry * dh, col(x, rx), ci]
                * kernel[f, co, ry, rx, ci, v], axis=[co, ry, rx, ci]),
            name="group_conv2d_NCHWc")
    return te.compute(
        (n, fo, oh, ow, ob),
        lambda i, f, y, x, v: te.sum(
            data[i, co, y * sh + ry * dh, col(x, rx), ci] * kernel[f, co, ry, rx, ci, v],
            axis=[co, ry, rx, ci]),
        name="conv2d_NCHWc")


def _supported(call):
    """True when ``call`` is a float32 conv2d in one of the three blocked forms above."""
    a = call.attrs
    blocks = blocked_layouts(a)
    if blocks is None:
        return False
    x, k = call.args
    dtype = str(x.ty.dtype)
    if dtype != "float32" or str(k.ty.dtype) != dtype or (a.out_dtype and str(a.out_dtype)
                                                           not in ("", dtype)):
        return False
    db, ib, ob = blocks
    if db == 0:
        return int(a.groups) == 1
    channels = int(x.ty.shape[1]) * db
    g = int(a.groups)
    if g == 1:
        return ib == db
    if g == channels:
        return ib == 1 and ob == db
    # grouped: whole input and output blocks per group
    return (ib == db and int(x.ty.shape[1]) % g == 0 and int(k.ty.shape[0]) % g == 0)


def install() -> None:
    """Register the NCHW[b]c legalization on ``relax.nn.conv2d`` (once)."""
    op = tvm.ir.Op.get("relax.nn.conv2d")
    default = op.get_attr(_ATTR)
    if getattr(default, "__onnxc_nchwc__", False):
        return  # already installed (module reloaded)

    def legalize(bb, call):
        if not _supported(call):
            if _padded_nchw(call):
                a = call.attrs
                return bb.call_te(conv2d_nchw_columns, call.args[0], call.args[1], a.strides,
                                  a.padding, a.dilation, int(a.groups),
                                  primfunc_name_hint="conv2d")
            return default(bb, call)
        a = call.attrs
        g = int(a.groups)
        depthwise = g != 1 and blocked_layouts(a)[1] == 1  # kernel OIHW1i{b}o
        return bb.call_te(conv2d_nchwc, call.args[0], call.args[1], a.strides, a.padding,
                          a.dilation, depthwise, 1 if depthwise else g,
                          primfunc_name_hint="conv2d")

    legalize.__onnxc_nchwc__ = True
    tvm.ir.register_op_attr("relax.nn.conv2d", _ATTR, legalize, level=11)

