"""conv(x, W[F, C, *K]) => conv_packed(x, Wp[F/b, C, *K, b]), Wp packed at compile time
(OIHW -> OIHW[b]o; conv1d OIW -> OIW[b]o and conv3d OIDHW -> OIDHW[b]o likewise).

Activations stay NCHW; only the constant weight changes layout, once, here.  With ``b``
output channels contiguous, the CPU rule ``conv2d_packed`` keeps an ``(output pixels x
b)`` tile of accumulators in registers, loads ``b / lanes`` weight vectors per tap and
broadcasts each input value into them: the channel block is the vector, so odd output
widths (SqueezeNet's 55/27/13, the 111- and 112-wide stems) no longer give short vectors.
Runs after the passes that change conv weights (fold_batchnorm) and needs the weights as
constants (fold_constants).  Fires on 1-, 2- and 3-D float32 convs in
NCW/NCHW/NCDHW (Whisper's and wav2vec2's conv1d stems, video conv3d: TVM's own conv1d
kernel ran at 0.3 GFLOP/s under dlight's reduction rule), channels first, grouped convs
whose groups have a whole number of channel blocks (wav2vec2's positional conv: 16 groups
of 48),
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

# Channel blocks, best first: two AVX-512 vectors, one, three (the CPU rule also takes
# ragged blocks such as 24 or 40, through the ``blocks`` option)
BLOCKS = (32, 16, 48)


class PackConvWeights(GraphPass):
    """conv(x, W) => conv_packed(x, pack(W)) for 1/2/3-D spatial convs with constant W."""

    name = "pack_conv_weights"
    opt_level = 2
    # blocks, lanes and accumulators: compile_static sets them from the target
    # (compiler/driver.py _conv_tiles: blocks of two fp32 vectors first, the target's fp32
    # lanes and the accumulator registers of the CPU rule's tile); these are AVX-512's
    options = {"min_taps": 1, "blocks": BLOCKS, "lanes": 16, "accumulators": 20}

    def rewrite(self, mod, report: PassReport, options: dict):
        min_taps, blocks = int(options["min_taps"]), tuple(options["blocks"])
        tiles = (int(options["lanes"]), int(options["accumulators"]))
        rewritten, padded = [], []
        for nd, layouts in _LAYOUTS.items():
            mod, done = rewrite_calls(
                mod, f"relax.nn.conv{nd}d",
                lambda m, call, L=layouts: _packed(m, call, min_taps, blocks, L, tiles,
                                                   padded))
            if done:
                w = layouts[1]
                report.rewrites[f"conv{nd}d(x, W) => conv_packed(x, {w}[b]o(W))"] = len(done)
            rewritten += done
        if padded:
            report.rewrites["output width padded to whole register tiles"] = len(padded)
        if rewritten:
            names = getattr(report, "node_names", None) or []
            report.nodes = [_node_name(v, names) for v in rewritten]
        return mod


# spatial dims -> (data layout, kernel layout) the packed conv takes
_LAYOUTS = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


def conv_packed(data, wp, strides, padding, dilation, groups=1, width_tile=1, channels=None):
    """TE compute of a 1-, 2- or 3-D conv: ``out[n, f, *p] = sum_{c, *r} pad(data)[n,
    g(f) + c, *(p * s + r * d)] * wp[f // b, c, *r, f % b]`` with ``wp`` of shape
    [F/b, C/groups, *K, b] and ``g(f)`` the first input channel of f's group (0 without
    groups; ``b`` divides the group's output channels, so a vector stays in one group).
    ``padding`` is the padding before each spatial dim, then after each (2-D: top, left,
    bottom, right).  With ``width_tile`` > 1 not dividing the output width, the sum runs
    over the width rounded up to a multiple of it (input columns past the end read the
    last one: no branch, no padded copy) and a second stage drops the extra columns; it
    also drops the output channels past ``channels`` (those of zero weights that pad the
    last block)."""
    n, _, *size = (_dim(d) for d in data.shape)
    fo, c, *ks, b = (int(d) for d in wp.shape)
    per_group = fo * b // groups
    nd = len(size)
    before, after = list(padding[:nd]), list(padding[nd:])
    out = [(size[i] + before[i] + after[i] - (ks[i] - 1) * dilation[i] - 1) // strides[i] + 1
           for i in range(nd)]
    full = list(out)
    symbolic = not isinstance(out[-1], int)
    if symbolic:  # a symbolic length: whole tiles, at least one (the tile then compacts
        # to a static buffer, in registers), in the simplifier's form of the output
        from tvm.sym.analyzer import Analyzer

        out[-1] = Analyzer().simplify(out[-1])
        full[-1] = te.max((out[-1] + width_tile - 1) // width_tile, 1) * width_tile
    else:
        full[-1] = -(-out[-1] // width_tile) * width_tile
    if any(before) or any(after):
        data = topi.nn.pad(data, [0, 0, *before], [0, 0, *after], name="pad_temp")
    last = _dim(data.shape[-1]) - 1
    rc = te.reduce_axis((0, c), "rc")
    rs = [te.reduce_axis((0, k), "r" + "zyx"[3 - nd + i]) for i, k in enumerate(ks)]

    def body(i, f, *p):
        src = [p[d] * strides[d] + rs[d] * dilation[d] for d in range(nd)]
        if symbolic or (full[-1] - 1) * strides[-1] + (ks[-1] - 1) * dilation[-1] > last:
            src[-1] = te.min(src[-1], last)  # padded columns: read in bounds, dropped
        ch = rc if groups == 1 else te.indexdiv(f, per_group) * c + rc
        return te.sum(data[(i, ch, *src)] * wp[(te.indexdiv(f, b), rc, *rs, te.indexmod(f, b))],
                      axis=[rc, *rs])

    # the 2-D block keeps the name its schedules and tuning records were made under
    # named spatial vars (y, x): te names iter vars after the lambda's parameters
    named = {1: lambda i, f, x: body(i, f, x), 2: lambda i, f, y, x: body(i, f, y, x),
             3: lambda i, f, z, y, x: body(i, f, z, y, x)}[nd]
    conv = te.compute((n, fo * b, *full), named,
                      name="conv2d_nchw_packed" if nd == 2 else f"conv{nd}d_packed")
    channels = fo * b if channels is None else int(channels)
    if not symbolic and full == out and channels == fo * b:
        return conv
    return te.compute((n, channels, *out), lambda *idx: conv[idx], name="conv_columns")


def _dim(d):
    """A shape entry: an int when static, else the expression."""
    return int(d) if isinstance(d, (int, tvm.tirx.IntImm)) else d


def symbolic_tile(lanes: int, accumulators: int, vectors: int) -> int:
    """Output columns of a register tile over a symbolic conv1d length: as many as the
    accumulators hold beside the block's ``vectors`` registers each, within TVM's stack
    buffer (a larger tile is heap-allocated, where LLVM kept the accumulators in memory:
    schedules/cpu/conv2d_nchwc.symbolic_budget)."""
    from schedules.cpu.conv2d_nchwc import symbolic_budget

    return max(1, min(16, symbolic_budget(lanes, accumulators) // vectors))


def pad_width(width: int, pixels: int, vectors: int = 2) -> int:
    """The tile ``conv_packed`` should round the output ``width`` up to: ``pixels`` (the
    register tile's pixels on the target with ``vectors``-register channel blocks:
    compiler/driver.py _conv_tiles) when the padded columns cost less than the thin tile
    the divisors of ``width`` leave (1599 = 3 x 13 x 41: 3-pixel tiles), else 1.  A tile
    of ``x`` pixels takes ``max(x * vectors / 2, 4, (x + vectors) / 2)`` cycles per tap
    and input channel (two FMA pipes of latency 4; ``x`` broadcasts and ``vectors`` loads
    on two load ports), as common.gemm_tile counts for matmuls."""
    pixels = max(int(pixels), 1)

    def per_column(x):
        return max(x * vectors / 2, 4, (x + vectors) / 2) / x

    tile = max(d for d in range(1, min(width, pixels) + 1) if width % d == 0)
    padded = -(-width // pixels) * pixels
    if tile < pixels and padded * per_column(pixels) < width * per_column(tile):
        return pixels
    return 1


def pack_oihw(w: np.ndarray, b: int) -> np.ndarray:
    """OI* -> OI*[b]o: ``wp[fo, c, *k, fi] = w[fo * b + fi, c, *k]`` (any number of spatial
    dims)."""
    f, c, *ks = w.shape
    nd = len(ks)
    return np.ascontiguousarray(
        w.reshape(f // b, b, c, *ks).transpose(0, *range(2, 3 + nd), 1))


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


# A conv1d / conv3d whose output channels no block divides (R(2+1)D's 45 / 230 / 460 / 921
# "midplanes") gets zero output channels up to the block that pads least, when that adds
# at most this fraction of the work: such convs had no rule but dlight's reduction (40-76x
# onnxruntime's time at stride 2); 2-D ones have convert_layout's NCHW[b]c and conv2d_nchw
MAX_PAD_FRACTION = 0.125


def padded_block(f: int, blocks) -> tuple:
    """(block, channels padded to whole blocks) for ``f`` output channels: the block of
    ``blocks`` that pads least (the first of equals), if within ``MAX_PAD_FRACTION``;
    else (0, f)."""
    best = min(blocks, key=lambda b: -(-f // b) * b)
    padded = -(-f // best) * best
    return (best, padded) if padded - f <= MAX_PAD_FRACTION * f else (0, f)


def _packed(m, call, min_taps: int, blocks, layouts, tiles: tuple, padded: list):
    """``call`` (a relax.nn.conv1d/2d/3d) as conv_packed on W packed in channel blocks,
    emitted through ``m`` (rewrite_calls' mutator); None when it does not qualify."""
    a = call.attrs
    data, weight = call.args
    if not isinstance(weight, GenericConst):
        return None
    dl, kl = layouts
    groups = int(a.groups)
    if (a.data_layout != dl or a.kernel_layout != kl
            or a.out_layout != dl
            or (str(a.out_dtype) if a.out_dtype is not None else "") not in (
                "", "void", "float32")):
        return None
    dty = data.ty
    w = weight.value.numpy()
    if (str(dty.dtype) != "float32" or w.dtype != np.float32 or dty.ndim != len(dl)
            or w.ndim != len(kl)):
        return None
    if dty.shape is None or not isinstance(dty.shape[1], tvm.tirx.IntImm):
        return None
    # a conv1d may take a symbolic length (and batch): a sequence model exported with a
    # dynamic axis (SqueezeBERT's grouped 1x1s, wav2vec2's feature encoder); others need
    # static shapes
    symbolic = any(not isinstance(d, tvm.tirx.IntImm) for d in dty.shape.values)
    if symbolic and (len(dl) != 3 or not all(
            isinstance(d, tvm.tirx.IntImm) for d in list(dty.shape.values)[1:-1])):
        return None
    f = w.shape[0]
    # grouped: a block must not straddle two groups (depthwise, 1 channel a group, never
    # packs; its own rules take it)
    b = _block(f // groups, blocks) if f % groups == 0 else 0
    channels = f
    if not b and groups == 1 and len(dl) != 4:  # conv1d / conv3d: zero channels padded
        b, channels = padded_block(f, blocks)
        if b:
            w = np.concatenate([w, np.zeros((channels - f, *w.shape[1:]), w.dtype)])
    if int(np.prod(w.shape[2:])) < min_taps or not b:
        return None
    data = m.visit_expr(data)
    wp = relax.const(pack_oihw(w, b))
    tile = 1
    if len(dl) == 3:  # 1-D: the register tile is a run of output columns
        lanes, accumulators = tiles
        vectors = -(-b // lanes)
        if symbolic:  # always whole tiles, in registers (a tile within TVM's stack buffer)
            tile = symbolic_tile(lanes, accumulators, vectors)
        else:
            tile = pad_width(int(call.ty.shape[-1]),
                             min(16, accumulators // vectors), vectors)
        if tile > 1:
            padded.append(call)
    return m.builder_.call_te(
        conv_packed, data, wp, [int(s) for s in a.strides],
        [int(p) for p in a.padding], [int(d) for d in a.dilation], groups, tile, f,
        primfunc_name_hint=f"conv{len(dl) - 2}d")

