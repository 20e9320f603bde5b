"""conv2d and depthwise conv2d in NCHW[b]c (passes/convert_layout.py) on CPUs.

Dense (``compiler/legalize_conv_nchwc.py``)::

    out[n, fo, y, x, v] += pad[n, co, y*s + ry, x*s + rx, ci] * w[fo, co, ry, rx, ci, v]

NeoCPU's kernel: the channel block ``v`` is the vector.  A register tile of ``ft`` output
channel blocks x ``yt x xt`` output pixels stays in registers; per input channel ``ci`` it
loads ``ft`` weight vectors (contiguous) and broadcasts each input value into them, so a
tile does ``ft * yt * xt`` FMAs per ``ft`` loads and ``yt * xt`` broadcasts.  The tile is
written back as whole vectors (NCHW[b]c is the output layout too: no transpose), with the
elementwise epilogue (bias, ReLU, residual add) applied there.  Parallel over
(n, channel-block tile, row tile).  When a tile's weights outgrow L1
(``conv2d_packed.channel_chunk``), input channel blocks run in chunks outside the row's
pixel tiles, which accumulate in a global row cache written back once.

A stem reading NCHW (``pad[n, c, y*s + ry, x*s + rx] * w[fo, c, ry, rx, v]``, RGB input)
is the same kernel without the ``ci`` loop.

Depthwise (``w[c, 0, ry, rx, 0, v]``): per channel block, a row of ``xt`` output pixels
accumulates ``KH x KW`` taps as vector FMAs; parallel over (n, channel block, row).

Padding stays its own parallel, vectorised stage for dense convs, as does the copy of the
pixels a strided 1x1 conv reads (``SUBSAMPLE``, made by the legalization); depthwise convs read the
unpadded input with the bounds test inlined.  Tiles are divisors of the output
height, width and channel blocks, so every shape is exact.  A symbolic image size (height
and width symbolic, channels static) has one-row tiles over columns the legalization
padded to whole tiles (``common.tile_columns`` reads the tile back off the padded extent).
"""

from __future__ import annotations

from tvm import tirx

from ..base import MatchingCPURule
from . import common
from .conv2d_packed import channel_chunk

# The stage compiler/lowering/legalize_conv_nchwc.py puts before a strided 1x1 conv: the
# pixels it reads, copied contiguous (kept: inlined back, the conv would read strided again)
SUBSAMPLE = "subsample"


def match_nchwc_conv(sch):
    """(block rv, "dense" | "nchw_in" | "depthwise" | ("grouped", output blocks per group),
    vector block) of a blocked conv reading a 5-D input (4-D: nchw_in) and a 6-D weight
    (5-D) and writing ``out[n, f, y, x, v]``, with only spatial blocks around it; else
    None."""
    for kinds, kind in (("SSSSSRRRR", "dense"), ("SSSSSRRR", "nchw_in"),
                        ("SSSSSRR", "depthwise")):
        m = common.single_reduction(sch, kinds)
        if m is not None:
            break
    else:
        return None
    rv, block, ivs = m
    n, f, y, x, v = ivs[:5]
    if len(block.writes) != 1:
        return None
    out = block.writes[0]
    if (out.source.dtype != "float32" or len(out.source.shape) != 5
            or not common.same_vars(common.region_vars(out), [n, f, y, x, v])):
        return None
    ins = [r for r in block.reads if not r.source.same_as(out.source)]
    if len(ins) != 2:
        return None
    by_rank = {len(r.source.shape): common.region_vars(r) for r in ins}
    if kind == "nchw_in":
        data, weight = by_rank.get(4), by_rank.get(5)
    else:
        data, weight = by_rank.get(5), by_rank.get(6)
    if data is None or weight is None:
        return None
    if kind == "nchw_in":
        c, ry, rx = ivs[5:]
        ok = (data[0].same_as(n) and data[1].same_as(c)
              and common.same_vars(weight, [f, c, ry, rx, v]))
    elif kind == "dense":
        co, ry, rx, ci = ivs[5:]
        fpg = _group_blocks(data[1], f, co)
        ok = (data[0].same_as(n) and fpg is not None and data[4].same_as(ci)
              and common.same_vars(weight, [f, co, ry, rx, ci, v]))
        if ok and fpg:
            kind = ("grouped", fpg)
    else:
        ry, rx = ivs[5:]
        ok = (data[0].same_as(n) and data[1].same_as(f) and data[4].same_as(v)
              and common.same_vars([weight[0], weight[2], weight[3], weight[5]], [f, ry, rx, v]))
    if not ok:
        return None
    return rv, kind, int(out.source.shape[4])


def _group_blocks(e, f, co):
    """0 when the input channel block ``e`` is ``co`` (dense), ``fpg`` when it is
    ``f // fpg * cpg + co`` (grouped: ``fpg`` output blocks per group), else None."""
    if e.same_as(co):
        return 0
    if not (isinstance(e, tirx.Add) and e.b.same_as(co)):
        return None
    group = e.a  # f // fpg * cpg, with "* 1" and "// 1" simplified away
    if isinstance(group, tirx.Mul) and isinstance(group.b, tirx.IntImm):
        group = group.a
    if group.same_as(f):
        return 1
    if (isinstance(group, tirx.FloorDiv) and group.a.same_as(f)
            and isinstance(group.b, tirx.IntImm)):
        return int(group.b)
    return None


def tile(oh: int, ow: int, fblocks: int, width: int = 1, budget: int = 20) -> tuple:
    """(yt, xt, ft): up to 4 of the ``fblocks`` output channel blocks (each ``width``
    registers) x a pixel tile; see common.pixel_tile."""
    return common.pixel_tile(oh, ow, fblocks, width, max_group=4, budget=budget)


def columns_group(xt: int, fblocks: int, width: int = 1, budget: int = 20) -> int:
    """Output channel blocks (a divisor of ``fblocks``, at most 4) beside a one-row tile
    of ``xt`` columns within ``budget`` accumulators: a symbolic image's tile
    (``legalize_conv_nchwc.symbolic_columns``)."""
    return max(g for g in common.divisors(fblocks) if g <= 4 and g * xt * width <= budget
               or g == 1)


# TVM allocates a register tile's buffer of more bytes than this (its kMaxStackAlloca) on
# the heap, where LLVM may fail to keep the accumulators in registers: a symbolic image's
# 4 x 5-vector tile (1280 bytes) stored every accumulator after each FMA, 3x slower
STACK_BYTES = 1024


def symbolic_budget(lanes: int, budget: int) -> int:
    """Accumulator registers of a symbolic image's tile: ``budget``, within STACK_BYTES."""
    return max(1, min(budget, STACK_BYTES // (4 * lanes)))


def max_columns(budget: int, width: int) -> int:
    """The widest one-row tile over a symbolic image: columns of ``width`` registers each
    within ``budget`` (``symbolic_budget``) accumulators, at most 16.  The legalization
    chooses within it, the rule reads the tile back within it."""
    return max(1, min(16, budget // width))


# _row_tasks: over symbolic rows the tasks are the rows alone (the channel tiles a serial
# loop inside each): a row index split off a fused (channel tile, row) loop is a modulo by
# the symbolic row count, which TVM cannot prove non-negative, so it compacted the register
# tile at a computed offset and LLVM kept it in memory, a store per FMA (MobileNetV2's
# 96 -> 576 1x1 over 14 x 14: 0.57 ms, 0.23 with the rows alone parallel)

# The row cache of a chunked conv's task (its rows' accumulators, in memory) stays within
# this many bytes (a part of L1, next to the chunk's weights and the input rows)
ROW_CACHE_BYTES = 24576


def chunk_rows(row_tiles: int, tasks: int, row_bytes: int, ncores: int) -> int:
    """Row tiles per task of a chunked conv (a divisor of ``row_tiles``): each input
    channel chunk's weights, loaded into L1 once per task, then serve that many row tiles
    instead of one.  A whole fo tile's weights outgrow L2 (960 -> 256 3x3: 2.2 MB per 4
    output blocks), so each row re-streamed them from L3.  At most ``ROW_CACHE_BYTES`` of
    row cache (``row_bytes`` a row tile), and at least 4 tasks per core left (``tasks``:
    the tasks of one row tile each, over the batch and output channel tiles)."""
    best = 1
    for r in common.divisors(row_tiles):
        if r * row_bytes <= ROW_CACHE_BYTES and tasks * (row_tiles // r) >= 4 * ncores:
            best = max(best, r)
    return best


def depthwise_tile(ow: int, width: int = 1, budget: int = 16) -> int:
    """Output pixels per register row: the largest divisor of ``ow`` within ``budget``
    vectors (16 of 32 registers; ``acc_budget`` on 16)."""
    return max(d for d in common.divisors(ow) if d * width <= budget)


class Conv2dNCHWc(MatchingCPURule):
    """conv2d / depthwise conv2d NCHW[b]c x OIHW[b]i[b]o (or 1i[b]o) + epilogue."""

    name = "cpu.conv2d_nchwc"

    def match(self, sch):
        return match_nchwc_conv(sch)

    def schedule(self, sch, m, target):
        conv, kind, b = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        # depthwise convs are memory-bound: reading the input once, with the padding test
        # inlined, beats writing and re-reading a padded copy (MobileNetV2's depthwise
        # kernels: 25-70% less time, measured single-core on znver5); the dense kernels keep
        # the copy (a branch per tap in their inner loop: ResNet-50's 3x3 convs took 2.1x
        # as long)
        pads, after, tail = common.inline_around(sch, conv, keep_pads=kind != "depthwise",
                                                 keep=(SUBSAMPLE,))
        loops = sch.get_loops(conv)
        ext = [common.const_extent(sch, lp) for lp in loops]
        # a symbolic image (legalize_conv_nchwc): rows and batch symbolic, the columns
        # padded to whole tiles; everything else static
        width = -(-b // lanes)  # registers per channel block
        columns = None
        budget = common.acc_budget(target)
        if ext[3] is None:
            budget = symbolic_budget(lanes, budget)
            columns = common.tile_columns(sch.get(loops[3]).extent, max_columns(budget, width))
        if any(e is None for k, e in enumerate(ext) if k not in (0, 2, 3)) or (
                ext[3] is None and columns is None):
            return None
        chunk = 0
        if kind in ("dense", "nchw_in") or kind[0] == "grouped":
            n, f, y, x, v, co, ry, rx, *ci = loops
            # a grouped conv's channel tile stays in one group (one input block range)
            fblocks = kind[1] if kind[0] == "grouped" else ext[1]
            if columns is None and ext[2] is not None:
                yt, xt, ft = tile(ext[2], ext[3], fblocks, width, budget)
            else:  # symbolic rows or columns: one-row tiles
                xt = columns or common.pixel_tile(1, ext[3], fblocks, width, 4, budget)[1]
                yt, ft = 1, columns_group(xt, fblocks, width, budget)
            fo, fi = sch.split(f, [None, ft])
            yo, yi = sch.split(y, [None, yt])
            xo, xi = sch.split(x, [None, xt])
            # input channel blocks in chunks when a tile's weights outgrow L1 (see
            # conv2d_packed.channel_chunk): a chunk's weights stay in L1 across the row's
            # pixel tiles, which accumulate in a global row cache
            # (not over a symbolic image: LLVM keeps a symbolic row cache's accumulators
            # in memory, a load and a store per FMA: 64 -> 64 3x3 over 28 x 28 2.5x slower)
            chunk = channel_chunk(ext[5], ext[6] * ext[7] * (ext[8] if ci else 1), ft * b) \
                if None not in ext else 0
            if chunk:
                coo, coi = sch.split(co, [None, chunk])
                tasks = (ext[0] or 1) * (ext[1] // ft)
                rows = 1 if None in ext[:4] else chunk_rows(
                    ext[2] // yt, tasks, yt * ext[3] * ft * b * 4, ncores)
                yoo, yoi = sch.split(yo, [None, rows])
                sch.reorder(n, fo, yoo, coo, yoi, xo, coi, ry, rx, *ci, fi, yi, xi, v)
                outer, first_red, unrolled = (n, fo, yoo), coo, (fi, yi, xi)
            elif ext[2] is None:  # symbolic rows: see _row_tasks
                sch.reorder(n, yo, fo, xo, co, ry, rx, *ci, fi, yi, xi, v)
                outer, first_red, unrolled = (n, yo), co, (rx, fi, yi, xi)
            else:
                sch.reorder(n, fo, yo, xo, co, ry, rx, *ci, fi, yi, xi, v)
                outer, first_red, unrolled = (n, fo, yo), co, (rx, fi, yi, xi)
        else:
            n, f, y, x, v, ry, rx = loops
            xt = columns or depthwise_tile(ext[3], width, min(16, budget))
            xo, xi = sch.split(x, [None, xt])
            if ext[2] is None:  # symbolic rows: see _row_tasks
                sch.reorder(n, y, f, xo, ry, rx, xi, v)
                outer = (n, y)
            else:
                sch.reorder(n, f, y, xo, ry, rx, xi, v)
                outer = (n, f, y)
            first_red, unrolled = ry, (ry, rx, xi)
        # chunked: the row tile's cache (NCHW[b]c already has the vector innermost)
        wb, pads = common.write_back_at(sch, conv, outer[-1] if chunk else xo, tail, pads,
                                        after, scope="global" if chunk else "local")
        common.parallel(sch, outer, ncores)
        for lp in unrolled:
            sch.unroll(lp)
        sch.vectorize(v)
        init = sch.decompose_reduction(conv, first_red)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(wb)[-1])
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
