"""conv2d NCHW with weights pre-packed OIHW[b]o (passes/pack_conv_weights.py) on CPUs.

``out[n, f, y, x] += pad[n, c, y*s + ry, x*s + rx] * wp[f // b, c, ry, rx, f % b]``.
The channel block ``b`` (contiguous in ``wp``) is the vector: the micro-kernel keeps a
``yt x xt`` tile of output pixels x ``b`` channels of accumulators in registers, loads the
``b / lanes`` weight vectors of a tap once and broadcasts each input value into them, so
the FMAs per load no longer depend on the output width (NeoCPU's inner kernel with NCHW
activations).  The accumulator tile is stored [y][x][f] (f contiguous) and transposed to
NCHW in its write-back, where the elementwise epilogue (bias, ReLU, residual add) is
applied.  Padding stays its own parallel stage.  Parallel over (n, channel block, row
block).  Tiles are divisors of the output height and width, so every shape is exact.
"""

from __future__ import annotations

from tvm import tirx

from ..base import MatchingCPURule
from . import common


def match_packed_conv(sch):
    """(conv block rv, channel block b) of a conv reading ``wp[f // b, rc, ry, rx, f % b]``
    and ``data[n, rc, ., .]``, writing ``out[n, f, y, x]``, with only spatial blocks
    around it; else None."""
    m = common.single_reduction(sch, "SSSSRRR")
    if m is None:
        return None
    rv, block, (n, f, y, x, rc, ry, rx) = m
    o = common.fp32_output(block, [n, f, y, x])
    if o is None:
        return None
    out, ins = o
    if len(ins) != 2:
        return None
    b = data_ok = None
    for r in ins:
        idx = common.region_vars(r)
        if len(idx) == 5:
            bb = r.source.shape[4]
            if (isinstance(bb, tirx.IntImm) and _is(idx[0], tirx.FloorDiv, f, bb)
                    and _is(idx[4], tirx.FloorMod, f, bb)
                    and common.same_vars(idx[1:4], [rc, ry, rx])):
                b = int(bb)
        elif len(idx) == 4 and idx[0].same_as(n) and idx[1].same_as(rc):
            data_ok = True
    if b is None or not data_ok:
        return None
    return rv, b


def _is(e, op, var, const) -> bool:
    return (isinstance(e, op) and e.a.same_as(var) and isinstance(e.b, tirx.IntImm)
            and int(e.b) == int(const))


def tile(oh: int, ow: int, vectors: int, width: int = 1, budget: int = 20) -> tuple:
    """(yt, xt, vt): pixel tile x ``vt`` of the block's ``vectors`` channel vectors (a ragged
    block is one vector of ``width`` = ceil(b / lanes) registers); see common.pixel_tile."""
    return common.pixel_tile(oh, ow, vectors, width, budget=budget)


class Conv2dPacked(MatchingCPURule):
    """conv2d NCHW x OIHW[b]o weights (any kernel, stride, padding, dilation) + epilogue."""

    name = "cpu.conv2d_packed"

    def match(self, sch):
        return match_packed_conv(sch)

    def schedule(self, sch, m, target):
        conv, b = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, conv)
        loops = sch.get_loops(conv)
        ext = [common.const_extent(sch, lp) for lp in loops]
        if any(e is None for e in ext) or ext[1] % b:
            return None
        n, f, y, x, rc, ry, rx = loops
        # whole vectors of the block can be split into register tiles; a ragged block
        # (b = 24 on 16 lanes) is one tile
        vectors = b // lanes if b % lanes == 0 else 1
        yt, xt, vt = tile(ext[2], ext[3], vectors, 1 if b % lanes == 0 else -(-b // lanes),
                          common.acc_budget(target))
        fo, fi = sch.split(f, [None, b])
        yo, yi = sch.split(y, [None, yt])
        xo, xi = sch.split(x, [None, xt])
        fm, fi = sch.split(fi, [None, b // vectors * vt])
        sch.reorder(n, fo, yo, xo, fm, rc, ry, rx, yi, xi, fi)
        # channels innermost in the register tile: one vector register per (y, x) pixel
        wb, pads = common.write_back_at(sch, conv, fm, tail, pads, after,
                                        write_layout=lambda a, c, h, w: (a, h, w, c))
        common.parallel(sch, [n, fo, yo], ncores)
        sch.unroll(rx)
        sch.unroll(yi)
        sch.unroll(xi)
        sch.vectorize(fi)
        init = sch.decompose_reduction(conv, rc)
        sch.vectorize(sch.get_loops(init)[-1])
        *_, w_f, w_y, w_x = sch.get_loops(wb)
        sch.unroll(w_x)
        sch.unroll(w_y)
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
