"""Depthwise conv2d NCHW on CPUs: per channel, output rows vectorised over the width.

``out[n, c, y, x] += pad[n, c, y*s + ry, x*s + rx] * w[c, 0, ry, rx]`` has no channel
reduction, so the GEMM micro-kernel of ``conv2d.py`` degenerates (one FMA per loaded
vector, a 1-wide channel block).  Here each (image, channel) is one parallel task: its
padded plane is built inside the task (it stays in L1/L2 instead of making one extra pass
over the whole tensor), then every output row is computed as ``yt`` rows x ``xt`` columns
of accumulators in registers (``xt`` a divisor of the width of at most two vectors), the
``KH x KW`` taps unrolled, each weight broadcast once per tap and reused by every row of
the tile.  The elementwise epilogue (bias, ReLU6, residual add) is applied in the write-back
of the register tile.  Matches channel multiplier 1 only (``groups == C == F``).
"""

from __future__ import annotations


from ..base import MatchingCPURule
from . import common


def match_depthwise(sch):
    """(conv block rv, pad block rv or None) of a depthwise conv kernel, else None.

    The one reduction block must read its data at channel ``f + rc`` (``rc`` of extent
    1) and its weight at ``[f, rc, ry, rx]``, and write ``out[n, f, y, x]``; every other
    block must be spatial."""
    m = common.single_reduction(sch, "SSSSRRR")
    if m is None:
        return None
    rv, block, ivs = m
    n, f, y, x, rc, ry, rx = ivs
    rc_dom = block.iter_vars[4].dom
    if not (_int(rc_dom.extent) == 1 and _int(rc_dom.min) == 0):
        return None
    o = common.fp32_output(block, [n, f, y, x])
    if o is None:
        return None
    out, ins = o
    if len(ins) != 2:
        return None
    weight = data = None
    for r in ins:
        idx = common.region_vars(r)
        if len(idx) != 4:
            return None
        if common.same_vars(idx, [f, rc, ry, rx]):
            weight = r
        elif idx[0].same_as(n) and _is_sum(idx[1], f, rc):
            data = r
    if weight is None or data is None:
        return None
    # the data buffer is produced by a padding block in this function, or is the input
    pad = None
    for p in sch.get_producers(rv):
        if sch.get(p).writes[0].source.same_as(data.source):
            pad = p
    return rv, pad


def _int(e):
    return getattr(e, "value", None)


def _is_sum(e, a, b) -> bool:
    """``e`` is ``a + b`` (either order)."""
    from tvm import tirx

    return isinstance(e, tirx.Add) and (
        (e.a.same_as(a) and e.b.same_as(b)) or (e.a.same_as(b) and e.b.same_as(a)))


class DepthwiseConv2dNCHW(MatchingCPURule):
    """Depthwise conv2d NCHW (any kernel, stride, padding, dilation) + elementwise epilogue."""

    name = "cpu.depthwise_conv2d_nchw"

    def match(self, sch):
        return match_depthwise(sch)

    def schedule(self, sch, m, target):
        conv, pad = m
        return schedule_window(sch, conv, pad, target)


# Vector FMAs of one register tile's taps unrolled, at most, where the window is strided
# (a strided tap reads its lanes by a gather): PNASNet-5-large's 7 x 7 stride-2 depthwise
# conv over 83 x 83 (7 x 7 taps x 7 rows of 14-lane gathers) took LLVM 5.6-6.8 s to build,
# 0.2 s with the window's rows a loop, and ran 5.0 -> 2.7 ms (5 x 5: 1.84 -> 1.54 ms, one
# thread, znver4).  Stride 1 keeps every tap unrolled (5 x 5 over 42 x 42 as a loop:
# 0.27 -> 0.33 ms).
MAX_UNROLLED_STRIDED = 128


def _x_stride(sch, conv) -> int | None:
    """The window's stride along x: the coefficient of the block's x axis in the index
    of its data read (``x * s + rx``), or None when it is not linear."""
    from tvm import sym, tirx

    block = sch.get(conv)
    x_var = block.iter_vars[3].var
    for r in block.reads:
        index = r.region[-1].min
        if any(v.same_as(x_var) for v in tirx.analysis.undefined_vars(index)):
            coef = sym.detect_linear_equation(index, [x_var])
            return int(coef[0]) if len(coef) == 2 and isinstance(coef[0], tirx.IntImm) \
                else None
    return None


def schedule_window(sch, conv, pad, target):
    """Schedule a sliding-window reduction ``out[n, c, y, x] = R over taps`` (depthwise
    conv, pooling): parallel over (n, c), the padded plane built inside each channel's
    task, a ``yt x xt`` register tile of outputs (``xt`` vectorised, a divisor of the
    width) with the taps unrolled, the elementwise epilogue in the tile's write-back.
    ``pad`` is the block producing the window's input, or None.  Returns ``sch``, or
    None when a loop extent other than the batch and a symbolic image's rows and padded
    columns is symbolic."""
    lanes, ncores = common.lanes_fp32(target), common.cores(target)
    pad_name = sch.get(pad).name_hint if pad is not None else None
    pads, after, tail = common.inline_around(sch, conv)
    loops = sch.get_loops(conv)
    ext = [common.const_extent(sch, lp) for lp in loops]
    n, f, y, x, *red = loops
    if any(e is None for k, e in enumerate(ext) if k not in (0, 2, 3)):
        return None
    ny, nx = ext[2], ext[3]
    if nx is None:  # a symbolic image: columns padded to whole vectors (legalize_conv_nchwc)
        xt = common.tile_columns(sch.get(x).extent, 4 * lanes)
        if xt is None or xt % lanes:
            return None
    else:
        xt = common.vector_tile(nx, lanes)
    nv = -(-xt // lanes)
    # rows per register tile: each broadcast weight feeds yt * nv FMAs (one row over
    # symbolic rows)
    yt = 1 if ny is None else max(d for d in common.divisors(ny) if d * nv <= 8)
    yo, yi = sch.split(y, [None, yt])
    xo, xi = sch.split(x, [None, xt])
    sch.reorder(n, f, yo, xo, *red, yi, xi)
    wb, pads = common.write_back_at(sch, conv, xo, tail, pads, after)
    nf = sch.fuse(n, f)
    if ncores > 1:
        sch.parallel(nf)
    taps = [common.const_extent(sch, r) for r in red[-2:]]
    stride = _x_stride(sch, conv)
    rows_loop = stride is not None and stride > 1 and None not in taps and \
        taps[0] * taps[1] * yt * nv > MAX_UNROLLED_STRIDED
    for r in red[-1:] if rows_loop else red[-2:]:  # the window taps
        sch.unroll(r)
    sch.unroll(yi)
    sch.vectorize(xi)
    init = sch.decompose_reduction(conv, red[0])
    sch.vectorize(sch.get_loops(init)[-1])
    *_, w_y, w_x = sch.get_loops(wb)
    sch.vectorize(w_x)
    # one channel's padded plane, built inside the channel's task
    common.schedule_pads(sch, pads, pad_name, nf, lanes, ncores)
    return sch
