"""Transposed convs per output phase (passes/pack_conv_transpose.py) on CPUs.

``out[n, f, y, x] += pad[n, c, (y+p)//s - ty, (x+p)//s - tx] *
wp[f // b, c, ty, tx, (y+p) % s, (x+p) % s, f % b]`` (2-D; 1-D has no y, 3-D an outer z
whose tile is one plane).  As in conv2d_packed, the channel block ``b`` (contiguous in
``wp``) is the vector and a ``yt x xt`` tile of output pixels x ``b`` channels stays in
registers; here the pixels of a tile span the phases: the ``P`` phases of the tile load
``P`` weight vectors per tap, each input value of the ``Q`` the tile reads is broadcast
once into ``P`` accumulators, so the tile is chosen for the fewest loads per FMA,
``1/Q + 1/(P*vectors)``, with tile sides multiples of the stride (every pixel's phase a
constant once unrolled).  Write-back NCHW with the epilogue (bias, ReLU) inlined; the input copied channels-last
(padded) in its own parallel stage; parallel over (n, channel block, row block or plane).
"""

from __future__ import annotations

from tvm import tirx

from ..base import MatchingCPURule
from . import common


def match_conv_transpose(sch):
    """(block rv, channel block b, spatial dims, strides) of a reduction reading
    ``wp[f // b, rc, *t, *phase, f % b]`` and ``pad[n, rc, ...]``, writing ``out[n, f, *o]``
    (1 to 3 spatial dims), with only spatial blocks around it; else None."""
    for nd in (2, 1, 3):
        m = common.single_reduction(sch, "SS" + "S" * nd + "R" * (nd + 1))
        if m is not None:
            break
    else:
        return None
    rv, block, ivs = m
    n, f, rc = ivs[0], ivs[1], ivs[2 + nd]
    o = common.fp32_output(block, ivs[:2 + nd])
    if o is None or len(o[1]) != 2:
        return None
    b = strides = data_ok = None
    for r in o[1]:
        idx = common.region_vars(r)
        if len(idx) == 2 * nd + 3:
            bb = r.source.shape[-1]
            if (isinstance(bb, tirx.IntImm) and _is(idx[0], tirx.FloorDiv, f, bb)
                    and _is(idx[-1], tirx.FloorMod, f, bb)
                    and common.same_vars(idx[1:2 + nd], ivs[2 + nd:])):
                b = int(bb)
                # the phase of each spatial dim: floormod(o + p, s), or 0 when s == 1
                strides = [int(e.b) if isinstance(e, tirx.FloorMod) and isinstance(
                    e.b, tirx.IntImm) else 1 for e in idx[2 + nd:2 + 2 * nd]]
        elif len(idx) == nd + 2 and idx[0].same_as(n) and idx[1].same_as(rc):
            data_ok = True
    if b is None or not data_ok:
        return None
    return rv, b, nd, strides


def _is(e, op, var, const) -> bool:
    return (isinstance(e, op) and e.a.same_as(var) and isinstance(e.b, tirx.IntImm)
            and int(e.b) == int(const))


def _span(t: int, s: int) -> tuple:
    """(phases, inputs) of ``t`` consecutive output pixels at stride ``s``: distinct weight
    phases and distinct input positions per tap."""
    return min(t, s), -(-t // s)


def tile(oh: int, ow: int, sy: int, sx: int, vectors: int, width: int = 1,
         budget: int = 20) -> tuple:
    """(yt, xt, vt, px): a ``yt x xt`` pixel tile x ``vt`` of the block's ``vectors``
    channel vectors (each ``width`` registers) within ``budget`` accumulators, with the
    fewest loads per FMA: ``P * vt`` weight vectors and ``Q`` broadcasts per tap for
    ``yt * xt * vt`` FMAs.  ``px == 0``: ``xt`` consecutive pixels (a divisor of ``ow``);
    sides that are neither multiples nor divisors of the stride would make each pixel's
    phase a run-time value, taken only when nothing else fits.  ``px > 0`` (``ow`` a
    multiple of ``sx``): ``xt // px`` inputs x ``px`` of the ``sx`` phases, the pixels
    ``q * sx + r`` (a large stride: the vocoders' s8 tile reads one input per 8
    consecutive pixels, one FMA per weight load).  Ties go to wider rows."""
    xs = [(xt, 0) + _span(xt, sx) for xt in common.divisors(ow) if xt <= 16]
    if ow % sx == 0:
        xs += [(q * p, p, p, q) for p in common.divisors(sx) if p < sx
               for q in common.divisors(ow // sx) if q * p <= 16 and q > 1]
    best, best_cost = (1, 1, 1, 0), None
    for vt in common.divisors(vectors):
        for xt, px, phx, inx in xs:
            for yt in common.divisors(oh):
                if yt * xt * vt * width > budget:
                    continue
                phy, iny = _span(yt, sy)
                ragged = (yt % sy and sy % yt) or (not px and xt % sx and sx % xt)
                cost = (bool(ragged), 1 / (iny * inx) + 1 / (phy * phx * vt), -xt)
                if best_cost is None or cost < best_cost:
                    best, best_cost = (yt, xt, vt, px), cost
    return best


def _channels_last_input(sch, conv, pads, nd, ncores):
    """Read the input from a channels-last copy: the padded input (``pad_temp``) written
    [n, *q, c], or, without padding, a copy made so.  In NCHW the channels a tile reads
    one after the other lie H*W floats apart, a power of two in a decoder: every one maps
    to the same L1 set and missed (4 cache lines per 8 FMAs); channels-last, a cache line
    serves 16 of them.  The copy transposes in 16 x 16 blocks (read rows, write columns,
    both in L1).  Returns the other blocks to schedule as elementwise stages."""
    blk = sch.get(conv)
    data = next(i for i, r in enumerate(blk.reads) if len(r.source.shape) == nd + 2)
    src = blk.reads[data].source
    pad = next((p for p in pads if sch.get(p).writes[0].source.same_as(src)), None)
    if pad is None:
        pad = sch.cache_read(conv, data, "global")
    else:
        pads = [p for p in pads if p != pad]
    sch.transform_layout(pad, ("write", 0), lambda n, c, *q: (n, *q, c))
    n, c, *q = sch.get_loops(pad)
    ext = [common.const_extent(sch, lp) for lp in (c, q[-1])]
    ci = max(d for d in common.divisors(ext[0]) if d <= 16)
    wi = max(d for d in common.divisors(ext[1]) if d <= 16)
    co, ci = sch.split(c, [None, ci])
    wo, wi = sch.split(q[-1], [None, wi])
    sch.reorder(n, *q[:-1], co, wo, ci, wi)
    sch.vectorize(wi)
    common.parallel(sch, [n, *q[:-1], co], ncores)
    return pads


class ConvTranspose(MatchingCPURule):
    """conv{1,2,3}d_transpose per phase x [F/b, C, *T, *S, b] weights + elementwise
    epilogue."""

    name = "cpu.conv_transpose"

    def match(self, sch):
        return match_conv_transpose(sch)

    def schedule(self, sch, m, target):
        conv, b, nd, strides = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        pads, after, tail = common.inline_around(sch, conv)
        geometry = common.conv_loops(sch, conv, b, nd)
        if geometry is None:
            return None
        n, f, planes, y, x, reductions, oh, ow = geometry
        rc, *rt = reductions
        sy, sx = (strides[-2] if nd >= 2 else 1), strides[-1]
        # whole vectors of the block split into register tiles; a ragged block is one
        vectors = b // lanes if b % lanes == 0 else 1
        yt, xt, vt, px = tile(oh, ow, sy, sx, vectors,
                              1 if b % lanes == 0 else -(-b // lanes), common.acc_budget(target))
        pads = _channels_last_input(sch, conv, pads, nd, ncores)
        fo, fi = sch.split(f, [None, b])
        yo, yi = sch.split(y, [None, yt]) if y is not None else (None, None)
        layout = lambda a, c, *p: (a, *p, c)  # noqa: E731
        at = None
        if px:
            # x = (xo * q + xq) * s + xro * px + xri: q inputs x px phases in registers
            xq, xr = sch.split(x, [None, sx])
            xo, xq = sch.split(xq, [None, xt // px])
            xro, xri = sch.split(xr, [None, px])
            outer, inner_x = [xo, xro], [xq, xri]
            # a phase tile's pixels are not a box: write back all phases of xo at once
            at = xo
        else:
            xo, xi = sch.split(x, [None, xt])
            outer, inner_x = [xo], [xi]
        fm, fi = sch.split(fi, [None, b // vectors * vt])
        rows = [lp for lp in (yo,) if lp is not None]
        inner = [lp for lp in (yi,) if lp is not None] + inner_x
        # 1-D with fewer channel blocks than the cores want tasks: chunks of output
        # positions too (HiFi-GAN's 64 -> 32 upsampler, one block: one task ran on one of
        # the two cores, 2.2x onnxruntime's time)
        spans = 0 if planes or rows else common.position_chunks(
            common.const_extent(sch, n) * common.const_extent(sch, fo),
            common.const_extent(sch, outer[0]), ncores)
        if spans:
            xs, outer[0] = sch.split(outer[0], [spans, None])
            at = outer[0] if at is not None else None
            rows = [xs]
        sch.reorder(n, fo, *planes, *rows, *outer, fm, rc, *rt, *inner, fi)
        # channels innermost in the register tile: one vector register per pixel
        wb, pads = common.write_back_at(sch, conv, at or fm, tail, pads, after,
                                        write_layout=layout)
        # 3-D: planes only; fused with the row blocks too, 3-D k3 s2 p1 output_padding 1
        # computed wrong on 2 threads (right on one; TVM 0.27, cause not found)
        common.parallel(sch, [n, fo, *planes] if planes else [n, fo, *rows], ncores)
        for lp in inner:
            sch.unroll(lp)
        sch.vectorize(fi)
        init = sch.decompose_reduction(conv, rc)
        sch.vectorize(sch.get_loops(init)[-1])
        for lp in reversed(sch.get_loops(wb)[-len(inner):] if not px else []):
            sch.unroll(lp)
        for p in pads:
            common.schedule_elementwise(sch, p, lanes, ncores)
        return sch
