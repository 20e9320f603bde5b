"""conv1d/2d/3d, channels first, with weights pre-packed OI*[b]o (passes/pack_conv_weights.py)
on CPUs.

``out[n, f, y, x] += pad[n, c, y*s + ry, x*s + rx] * wp[f // b, c, ry, rx, f % b]`` (2-D;
conv1d has no y, conv3d an outer z whose tile is one plane).
The channel block ``b`` (contiguous in ``wp``) is the vector: the micro-kernel keeps a
``yt x xt`` tile of output pixels x ``b`` channels of accumulators in registers, loads the
``b / lanes`` weight vectors of a tap once and broadcasts each input value into them, so
the FMAs per load no longer depend on the output width (NeoCPU's inner kernel with NCHW
activations).  Taps run outside the input-channel loop (inside it, LLVM kept the
broadcasts two taps share live and spilled the tile).  The accumulator tile is stored
[y][x][f] (f contiguous) and transposed to NCHW in its write-back, where the elementwise
epilogue (bias, ReLU, residual add, GELU) is applied.  When a block's weights outgrow
L1 (``channel_chunk``), the input channels run in chunks outside the row's pixel tiles and
the tiles accumulate in a [pixels][channels] row cache written back once; input planes a
multiple of ``ALIAS_BYTES`` apart (which share L1/L2 sets) are copied contiguous per chunk
(a conv reading more such planes than ``L1_WAYS`` is chunked for it even when its weights
fit L1).  Padding stays
its own parallel stage.  Parallel over (n, channel block, row block (and plane)); rows
outside the channel blocks when the input outweighs the weights; a conv1d of too few
channel blocks for the cores also over chunks of output positions, each building its part
of the padded input (``common.position_chunks``).  Tiles are divisors of
the output height and width, so every shape is exact (pack_conv_weights pads a 1-D width
whose divisors are thin to whole tiles).
"""

from __future__ import annotations

from tvm import tirx
from tvm.sym.pattern import detect_linear_equation

from ..base import MatchingCPURule
from . import common


def match_packed_conv(sch):
    """(conv block rv, channel block b, spatial dims) of a conv reading
    ``wp[f // b, rc, *r, f % b]`` and ``data[n, rc, ...]``, writing ``out[n, f, *p]`` (1 to 3
    spatial dims), with only spatial blocks around it; else None."""
    for nd in (2, 1, 3):
        m = common.single_reduction(sch, "SS" + "S" * nd + "R" * (nd + 1))
        if m is not None:
            break
    else:
        return None
    rv, block, ivs = m
    n, f, rc = ivs[0], ivs[1], ivs[2 + nd]
    o = common.fp32_output(block, ivs[:2 + nd])
    if o is None:
        return None
    out, ins = o
    if len(ins) != 2:
        return None
    b = data_ok = None
    for r in ins:
        idx = common.region_vars(r)
        if len(idx) == nd + 3:
            bb = r.source.shape[-1]
            if (isinstance(bb, tirx.IntImm) and _is(idx[0], tirx.FloorDiv, f, bb)
                    and _is(idx[-1], tirx.FloorMod, f, bb)
                    and common.same_vars(idx[1:-1], ivs[2 + nd:])):
                b = int(bb)
        elif len(idx) == nd + 2 and idx[0].same_as(n) and _channel(idx[1], rc, f):
            data_ok = True
    if b is None or not data_ok:
        return None
    return rv, b, nd


def _channel(e, rc, f) -> bool:
    """``e`` is ``rc``, or ``rc`` plus an offset of ``f``'s group (grouped convs:
    ``f // (F/G) * C/G + rc``)."""
    if e.same_as(rc):
        return True
    coef = detect_linear_equation(e, [rc])
    if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm) or int(coef[0]) != 1:
        return False
    return all(v.same_as(f) for v in tirx.analysis.undefined_vars(coef[1]))


def _is(e, op, var, const) -> bool:
    return (isinstance(e, op) and e.a.same_as(var) and isinstance(e.b, tirx.IntImm)
            and int(e.b) == int(const))


def tile(oh: int, ow: int, vectors: int, width: int = 1, budget: int = 20) -> tuple:
    """(yt, xt, vt): pixel tile x ``vt`` of the block's ``vectors`` channel vectors (a ragged
    block is one vector of ``width`` = ceil(b / lanes) registers); see common.pixel_tile."""
    return common.pixel_tile(oh, ow, vectors, width, budget=budget)


class Conv2dPacked(MatchingCPURule):
    """conv1d/2d/3d channels first x OI*[b]o weights (any kernel, stride, padding,
    dilation) + elementwise epilogue."""

    name = "cpu.conv2d_packed"

    def match(self, sch):
        return match_packed_conv(sch)

    def schedule(self, sch, m, target):
        conv, b, nd = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, conv)
        geometry = common.conv_loops(sch, conv, b, nd)
        if geometry is None:
            return _schedule_symbolic(sch, conv, b, nd, (pads, after, tail), target)
        n, f, planes, y, x, reductions, oh, ow = geometry
        rc, *rs = reductions
        # whole vectors of the block can be split into register tiles; a ragged block
        # (b = 24 on 16 lanes) is one tile
        vectors = b // lanes if b % lanes == 0 else 1
        yt, xt, vt = tile(oh, ow, vectors, 1 if b % lanes == 0 else -(-b // lanes),
                          common.acc_budget(target))
        fo, fi = sch.split(f, [None, b])
        yo, yi = sch.split(y, [None, yt]) if y is not None else (None, None)
        xo, xi = sch.split(x, [None, xt])
        fm, fi = sch.split(fi, [None, b // vectors * vt])
        rows = [l for l in (yo,) if l is not None]
        inner = [l for l in (yi, xi) if l is not None]
        taps = 1
        for r in rs:
            taps *= common.const_extent(sch, r)
        channels = common.const_extent(sch, rc)
        chunk = channel_chunk(channels, taps, b)
        if not chunk and channels > L1_WAYS and _aliasing_input(sch, conv, nd + 2) is not None:
            # a tile reads a pixel of every channel plane; planes a multiple of ALIAS_BYTES
            # apart fall into one L1 set, which holds L1_WAYS of them: more thrash it.  The
            # chunked kernel copies a chunk's rows contiguous (below), so chunk these too
            # (MobileViT-S's 64 -> 256 1x1 at 64 x 64, Zen 3, single thread: 1.6 -> 1.1x
            # onnxruntime; 32 -> 128 at 128 x 128: 1.3 -> 0.8x)
            chunk = channel_chunk(channels, taps, b, always=True)
        if chunk:
            rc, rci = sch.split(rc, [None, chunk])
        # channel blocks inside the rows when the input outweighs the weights: a row's
        # input is read by every block while it is in cache, not once per block (R(2+1)D's
        # 3x1x1 conv, 18 MB of input and 110 KB of weights: 1.7x faster)
        outer = [n, fo, *planes, *rows]
        if (planes or rows) and (_read_elements(sch, conv, nd + 2)
                                 > _read_elements(sch, conv, nd + 3)):
            outer = [n, *planes, *rows, fo]
        # a conv1d of fewer channel blocks than tasks the cores want: chunks of output
        # positions too, each building its own part of the padded input (see common.position_chunks);
        # also with channel chunks, where each task keeps its own row cache (a TCN's k3
        # 64 -> 64 conv over 4000 samples, two threads: 0.49 -> 0.34 ms on Emerald Rapids)
        spans = 0 if planes or rows else common.position_chunks(
            common.const_extent(sch, n) * common.const_extent(sch, fo),
            common.const_extent(sch, xo), ncores)
        if spans:
            xs, xo = sch.split(xo, [spans, None])
            outer = [n, xs, fo]
        # taps outside the channel loop: with a tap loop inside it (unrolled by LLVM), the
        # broadcasts two taps share (pixel x at tap r + s = pixel x + 1 at tap r) stayed
        # live across taps and spilled the tile's registers (wav2vec2's 512 -> 512 k3 s2
        # conv1d: 26 -> 54-63 GFLOP/s single-thread on Zen 3)
        if chunk:
            # input channels in chunks outside the pixel tiles: a chunk's weights
            # (channel_chunk) stay in L1 across the tiles of a row, which accumulate in
            # a [pixels][channels] cache (L2) kept in registers within a chunk (LLVM
            # promotes the tile); the whole row's cache is written back at the end
            sch.reorder(*outer, rc, xo, fm, *rs, rci, *inner, fi)
            wb, pads = common.write_back_at(sch, conv, outer[-1], tail, pads, after,
                                            write_layout=lambda a, c, *p: (a, *p, c),
                                            scope="global")
            data = _aliasing_input(sch, conv, nd + 2)
            if data is not None:
                # the chunk's channel rows copied contiguous: rows a multiple of
                # ALIAS_BYTES apart fall into the same L1 (and L2) sets, so the tile's
                # broadcasts missed to L3 (Segformer's 1024 -> 256 1x1 at 128x128:
                # channel planes 64 KB apart)
                packed = sch.cache_read(conv, data, "global")
                sch.compute_at(packed, rc)
                common.vectorize_row(sch, packed, lanes)
        else:
            sch.reorder(*outer, xo, fm, *rs, rc, *inner, fi)
            # channels innermost in the register tile: one vector register per pixel
            wb, pads = common.write_back_at(sch, conv, fm, tail, pads, after,
                                            write_layout=lambda a, c, *p: (a, *p, c))
        common.parallel(sch, outer, ncores)
        for lp in inner:
            sch.unroll(lp)
        sch.vectorize(fi)
        init = sch.decompose_reduction(conv, rc if chunk else (rs[0] if rs else rc))
        sch.vectorize(sch.get_loops(init)[-1])
        if chunk:
            _vectorize_write_back(sch, wb, lanes, nd, _padded_columns(sch, conv, wb, nd))
        else:
            for lp in reversed(sch.get_loops(wb)[-len(inner):]):
                sch.unroll(lp)
        data = common.input_producer(sch, conv, pads, nd + 2) if spans else None
        if data is not None:
            # the padded input of each chunk's positions (all channels, the taps' halo
            # included) is built inside the chunk's task, in its core's cache
            pads = [p for p in pads if sch.get(p).name_hint != sch.get(data).name_hint]
            sch.compute_at(data, sch.get_loops(conv)[0], preserve_unit_loops=True)
            common.vectorize_row(sch, data, lanes)
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch


# Bytes of weights a chunk of input channels may take (all taps, one channel block), and
# the weights of a block (all input channels) past which the channels are chunked: 16
# channels of a 3-tap 16-channel block (3 KB) ran 76-80 GFLOP/s where all 512 channels
# (96 KB, streamed from L2 for every pixel tile) ran 25-45 (Zen 3, single thread,
# wav2vec2's 512 -> 512 k3 s2 conv1d; onnxruntime 68).  Blocks whose weights fit in half
# an L1 (32-48 KB on current x86 and Arm cores) stay in it unchunked.
CHUNK_BYTES = 4096
SLAB_BYTES = 16384


def channel_chunk(channels: int, taps: int, b: int, cap: int = 32, always: bool = False) -> int:
    """Input channels per chunk (a divisor of ``channels``, at most ``cap``, whose weights
    fit ``CHUNK_BYTES``), or 0 when the block's weights for all channels fit
    ``SLAB_BYTES`` (no chunks); ``always``: chunks regardless (one chunk of all channels
    when they fit)."""
    if channels * taps * b * 4 <= SLAB_BYTES and not always:
        return 0
    fits = [d for d in common.divisors(channels)
            if d <= cap and d * taps * b * 4 <= CHUNK_BYTES]
    best = max(fits) if fits else 1
    return best if best < channels or always else 0


# The span of one way of an L1 data cache (size / ways: 32 KB / 8 on x86 since Nehalem,
# 64 KB / 16 on Zen 5's and Neoverse's 64 KB L1s): rows this many bytes apart share sets.
ALIAS_BYTES = 4096
# The fewest ways of a current L1 data cache (8: 32 KB L1s; 12 and 16 on 48 / 64 KB ones):
# that many rows ALIAS_BYTES apart still fit one set.
L1_WAYS = 8


def _aliasing_input(sch, conv, rank: int):
    """Index of ``conv``'s input read (the buffer of rank ``rank``) when its channel planes
    are a whole multiple of ``ALIAS_BYTES`` apart, else None."""
    for i, r in enumerate(sch.get(conv).reads):
        if len(r.source.shape) == rank:
            plane = common.elements(r.source)
            channels = r.source.shape[1]
            if plane is None or not isinstance(channels, tirx.IntImm):
                return None
            return i if (plane // int(channels) * 4) % ALIAS_BYTES == 0 else None
    return None


def _read_elements(sch, conv, rank: int) -> int:
    """Elements of the buffer of rank ``rank`` that ``conv`` reads (the input: nd + 2,
    the packed weight: nd + 3)."""
    return next((common.elements(r.source) or 0 for r in sch.get(conv).reads
                 if len(r.source.shape) == rank), 0)


def _padded_columns(sch, conv, wb, nd: int) -> bool:
    """Whether the conv computes more columns than its output has (``conv_packed``'s
    width tile padding, dropped in the write-back): its last pixel iterator's extent
    against the written buffer's width."""
    computed = sch.get(conv).iter_vars[1 + nd].dom.extent
    return int(computed) != int(sch.get(wb).writes[0].source.shape[-1])


def _vectorize_write_back(sch, wb, lanes, pixel_loops: int, padded: bool):
    """The row write-back [n, channels, *pixels]: output columns (contiguous in NC*W) in
    whole vectors where they divide, read across the cache's channels; else (padded or
    odd widths) the channels, contiguous in the cache, so that the epilogue (GELU's erf)
    still runs on vectors.  (A task's chunk of positions is narrower than the output
    without being padded: the columns' test was the output's width against the loop's,
    which sent HiFi-GAN's 32-channel convs over 25600 samples, two chunks a core, to
    per-channel stores 100 KB apart: the residual add's kernel 2.1x the one without.)"""
    loops = sch.get_loops(wb)
    inner = common.const_extent(sch, loops[-1])
    if inner is not None and inner % lanes == 0 and not padded:
        _, v = sch.split(loops[-1], [None, lanes])
        sch.vectorize(v)
        return
    # the wb's own loops: n (unit), the channel block, ``pixel_loops`` pixel loops
    channels = loops[-1 - pixel_loops]
    if common.const_extent(sch, channels) % lanes:
        return
    own = loops[-2 - pixel_loops:]
    sch.reorder(*[lp for lp in own if not lp.same_as(channels)], channels)
    vo, v = sch.split(channels, [None, lanes])
    sch.unroll(vo)
    sch.vectorize(v)


# Output columns a task of a conv1d over a symbolic length covers, about: tasks of whole
# register tiles, enough of them for the cores at the lengths models see (hundreds to
# thousands of positions)
TASK_COLUMNS = 64


def _schedule_symbolic(sch, conv, b: int, nd: int, around, target):
    """A conv1d over a symbolic length (``pack_conv_weights`` padded it to whole tiles of
    ``symbolic_tile`` columns, read back here off the padded extent; the batch may be
    symbolic too): register tiles of those columns x the channel block, channels inside
    the taps as in the static kernel, no channel chunks (a symbolic row cache stayed in
    memory: ``conv2d_nchwc``), tasks of about ``TASK_COLUMNS`` columns x one channel
    block, the symbolic loop outermost in the parallel fusion (a static extent's modulo,
    never a symbolic one's: ``conv2d_nchwc._row_tasks``)."""
    pads, after, tail = around
    lanes, ncores = common.lanes_fp32(target), common.cores(target)
    loops = sch.get_loops(conv)
    ext = [common.const_extent(sch, lp) for lp in loops]
    if nd != 1 or ext[2] is not None or any(e is None for e in ext[1:2] + ext[3:]) \
            or ext[1] % b:
        return None
    n, f, x, rc, *rs = loops
    vectors = b // lanes if b % lanes == 0 else 1
    xt = common.tile_columns(sch.get(x).extent, 16)
    if xt is None:
        return None  # not padded by pack_conv_weights
    fo, fi = sch.split(f, [None, b])
    xo, xi = sch.split(x, [None, xt])
    xs, xo = sch.split(xo, [None, max(1, TASK_COLUMNS // xt)])
    sch.reorder(n, xs, fo, xo, *rs, rc, xi, fi)
    wb, pads = common.write_back_at(sch, conv, xo, tail, pads, after,
                                    write_layout=lambda a, c, p: (a, p, c))
    common.parallel(sch, [xs, fo], ncores)
    sch.unroll(xi)
    if vectors > 1:  # a block of several vectors: one register each
        fv, fi = sch.split(fi, [None, lanes])
        sch.unroll(fv)
    sch.vectorize(fi)
    init = sch.decompose_reduction(conv, rs[0] if rs else rc)
    sch.vectorize(sch.get_loops(init)[-1])
    # the tile's write-back over its channels as vectors (contiguous in the tile), the
    # columns unrolled: an epilogue's GELU (erf's polynomial) ran a scalar per output,
    # SqueezeBERT's 768 -> 3072 g4 1x1 + GELU 2.3 ms against 0.9 in the static build
    _vectorize_write_back(sch, wb, lanes, 1, True)
    for p in pads:
        common.schedule_elementwise(sch, p, lanes, ncores)
    return sch
