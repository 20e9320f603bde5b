"""conv1d/2d/3d, channels first, with weights pre-packed OI*[b]o (passes/pack_conv_weights.py)
on CPUs.

``out[n, f, y, x] += pad[n, c, y*s + ry, x*s + rx] * wp[f // b, c, ry, rx, f % b]`` (2-D;
conv1d has no y, conv3d an outer z whose tile is one plane).
The channel block ``b`` (contiguous in ``wp``) is the vector: the micro-kernel keeps a
``yt x xt`` tile of output pixels x ``b`` channels of accumulators in registers, loads the
``b / lanes`` weight vectors of a tap once and broadcasts each input value into them, so
the FMAs per load no longer depend on the output width (NeoCPU's inner kernel with NCHW
activations).  The accumulator tile is stored [y][x][f] (f contiguous) and transposed to
NCHW in its write-back, where the elementwise epilogue (bias, ReLU, residual add) is
applied.  Padding stays its own parallel stage.  Parallel over (n, channel block, row
block (and plane)).  Tiles are divisors of the output height and width, so every shape is
exact.
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
            return None
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
        sch.reorder(n, fo, *planes, *rows, xo, fm, rc, *rs, *inner, fi)
        # channels innermost in the register tile: one vector register per pixel
        wb, pads = common.write_back_at(sch, conv, fm, tail, pads, after,
                                        write_layout=lambda a, c, *p: (a, *p, c))
        common.parallel(sch, [n, fo, *planes, *rows], ncores)
        sch.unroll(rs[-1])
        for lp in inner:
            sch.unroll(lp)
        sch.vectorize(fi)
        init = sch.decompose_reduction(conv, rc)
        sch.vectorize(sch.get_loops(init)[-1])
        for lp in reversed(sch.get_loops(wb)[-len(inner):]):
            sch.unroll(lp)
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
