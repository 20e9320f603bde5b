"""Integer conv in NCHW[b]c with the weight pre-packed [F/b, CO, KH, KW, CP, b, 2]
(passes/pack_int_conv.py), or by fours [F/b, CO, KH, KW, CQ, b, 4] for an 8-bit activation
by s8 weights (``a8`` the activation padded with its zero point, no widening, its sign bit
flipped where the dot takes the other 8-bit type): there the step is ``cpu.matmul_int8``'s
byte intrinsic (``vpdpbusd`` on VNNI, ``vpmaddubsw`` + ``vpmaddwd`` by ones on AVX2 /
AVX-512BW, for 8-channel blocks on AVX-512 targets, convert_layout's half blocks, the
256-bit form of the same instruction; ``usdot`` / ``sdot`` on aarch64) and the zero point's
correction, a constant per output channel, is part of the epilogue.  The rest of
this docstring describes the pairs.

``out[n, fo, y, x, v] += int32(a16[n, co, y*s + ry, x*s + rx, cp, k]) * int32(wp[fo, co, ry,
rx, cp, v, k])``, ``a16`` the 8-bit activation widened to int16 minus its zero point and
padded (a stage of the same kernel, computed per task: the rows one row tile reads, a few
KB private to the task and still in cache when the tile reads them; the next row tile
recomputes the halo rows), ``wp`` int8 / int16, ``out`` int32.  The tile is conv2d_nchwc's (NeoCPU):
``ft`` output channel blocks x ``yt x xt`` pixels of i32 accumulators; per input-channel pair
``cp`` it loads ``ft`` weight vectors and broadcasts each pixel's i16 pair.  On x86 the step
over (``lanes`` output channels, the pair) is ``cpu.matmul_int8``'s tensor intrinsic, one
``vpmaddwd`` (AVX2 ymm / AVX-512BW zmm; LLVM fuses it with the add into ``vpdpwssd`` on
AVX512-VNNI targets): exact for every u8 / s8 combination.  Other targets get the same tile
as plain vectorised i32 code.  The epilogue (int32 -> float, scale, bias, requantisation,
residual add: what FuseOps fused after it) is applied in the tile's write-back, so the next
conv reads 8-bit NCHW[b]c.  One parallel loop over (n, row tile, chunk of channel-block
tiles), the chunks as few as give every core four tasks (one unless the rows are few).
"""

from __future__ import annotations

from tvm import tirx

from ..base import MatchingCPURule
from . import common
from .conv2d_nchwc import tile
from .matmul_int8 import dot_intrin, dot_lanes, quad_intrin, quad_lanes


def match_int_conv(sch):
    """(block rv, vector block, activation dtype, wp dtype, k group) of the only reduction
    block when it is ``out[n, f, y, x, v]`` (int32) reduced over (co, ry, rx, cp, k) from a
    6-D ``a[n, co, .., .., cp, k]`` and a 7-D ``wp[f, co, ry, rx, cp, v, k]``: int16 ``a``
    by int8 / int16 ``wp`` in pairs (k < 2), or uint8 / int8 ``a`` by int8 ``wp`` in fours
    (k < 4, pack_int_conv's form by fours); else None."""
    m = common.single_reduction(sch, "SSSSSRRRRR")
    if m is None:
        return None
    rv, block, ivs = m
    n, f, y, x, v, co, ry, rx, cp, k = ivs
    if len(block.writes) != 1:
        return None
    out = block.writes[0]
    if (str(out.source.dtype) != "int32" or len(out.source.shape) != 5
            or not common.same_vars(common.region_vars(out), [n, f, y, x, v])):
        return None
    ins = {len(r.source.shape): r for r in block.reads if not r.source.same_as(out.source)}
    a16, wp = ins.get(6), ins.get(7)
    if a16 is None or wp is None or len(ins) != 2:
        return None
    ai, wi = common.region_vars(a16), common.region_vars(wp)
    if not (common.same_vars([ai[0], ai[4], ai[5]], [n, cp, k]) and _block_of(ai[1], co, f)
            and common.same_vars(wi, [f, co, ry, rx, cp, v, k])):
        return None
    group = int(wp.source.shape[6])
    forms = {2: (("int16",), ("int8", "int16")), 4: (("uint8", "int8"), ("int8",))}
    if (group not in forms or int(a16.source.shape[5]) != group
            or str(a16.source.dtype) not in forms[group][0]
            or str(wp.source.dtype) not in forms[group][1]):
        return None
    return rv, int(out.source.shape[4]), str(a16.source.dtype), str(wp.source.dtype), group


def _block_of(e, co, f) -> bool:
    """The activation's channel-block index is ``co``, or ``base(f) + co`` (a grouped
    conv: output block ``f`` reads its group's blocks, pack_int_conv's ``_group_base``)."""
    if e.same_as(co):
        return True
    return (isinstance(e, tirx.Add) and e.b.same_as(co)
            and not common.uses_var(e.a, co) and common.uses_var(e.a, f))


class Conv2dInt8(MatchingCPURule):
    """u8 / s8 NCHW[b]c activations x packed int8 weights -> int32 (+ fused epilogue)."""

    name = "cpu.conv2d_int8"

    def match(self, sch):
        return match_int_conv(sch)

    def schedule(self, sch, m, target):
        conv, b, a_dtype, w_dtype, group = m
        chosen = dot_lanes(target, b) if group == 2 else quad_lanes(target, b, a_dtype)
        if chosen is None:
            return None
        (kind, lanes), ncores = chosen, common.cores(target)
        stage = "_a16" if group == 2 else "_a8"
        a16 = [blk for blk in sch.get_producers(conv)
               if sch.get(blk).name_hint.endswith(stage)]
        if len(a16) != 1:
            return None
        pads, after, tail = common.inline_around(sch, conv, keep_pads=False,
                                                 keep=(sch.get(a16[0]).name_hint,))
        loops = sch.get_loops(conv)
        ext = [common.const_extent(sch, lp) for lp in loops]
        if any(e is None for e in ext[1:]):
            return None  # a symbolic batch is fine (a QDQ export's dynamic batch), not more
        n, f, y, x, v, co, ry, rx, cp, k = loops
        width = b // lanes  # accumulator registers per channel block
        yt, xt, ft = tile(ext[2], ext[3], ext[1], width, common.acc_budget(target))
        fo, fi = sch.split(f, [None, ft])
        yo, yi = sch.split(y, [None, yt])
        xo, xi = sch.split(x, [None, xt])
        vo, vl = sch.split(v, [None, lanes])
        # rows outer, and the channel-block tiles in as few chunks as give every core
        # four row tiles or more: the widened activation rows a chunk reads are computed
        # inside it (a few KB per task, its halo rows recomputed by the next), so the
        # kernel is one parallel loop, not two with a barrier between
        rows, ftiles = (ext[0] or 1) * (ext[2] // yt), ext[1] // ft
        want = -(-4 * max(ncores, 1) // rows)
        chunks = min(d for d in common.divisors(ftiles) if d >= min(want, ftiles))
        fc, fo = sch.split(fo, [chunks, None])
        # tensorized: (lanes, pair) is the intrinsic's block; else the pair outside the lanes
        inner = (vl, k) if kind is not None else (k, vl)
        sch.reorder(n, yo, fc, fo, xo, co, ry, rx, cp, fi, yi, xi, vo, *inner)
        wb, rest = common.write_back_at(sch, conv, xo, tail, pads, after)
        outer = sch.fuse(n, yo, fc)
        if ncores > 1:
            sch.parallel(outer)
        sch.compute_at(a16[0], outer, preserve_unit_loops=True)
        if kind is None:
            sch.unroll(k)
            sch.vectorize(vl)
        init = sch.decompose_reduction(conv, co)
        if kind is not None:
            sch.tensorize(vl, dot_intrin(kind, a_dtype, w_dtype)[0] if group == 2
                          else quad_intrin(kind)[0])
        for lp in (fi, yi, xi, vo):
            sch.unroll(lp)
        _vectorize_tile(sch, init, lanes)
        _vectorize_tile(sch, wb, lanes)
        a16_loops = sch.get_loops(a16[0])
        if common.const_extent(sch, a16_loops[-1]) == group:
            sch.vectorize(sch.fuse(*a16_loops[-2:]) if common.const_extent(
                sch, a16_loops[-2]) * group <= 4 * lanes else a16_loops[-1])
        a16_name = sch.get(a16[0]).name_hint
        for p in rest:
            if sch.get(p).name_hint != a16_name:
                common.schedule_elementwise(sch, p, lanes, ncores)
        return sch


def _vectorize_tile(sch, blk, lanes):
    """The init / write-back tile's channel loop (``b``): whole vectors, unrolled."""
    loop = sch.get_loops(blk)[-1]
    n = common.const_extent(sch, loop)
    if n is None or n % lanes:
        return
    if n > lanes:
        vo, loop = sch.split(loop, [None, lanes])
        sch.unroll(vo)
    sch.vectorize(loop)
