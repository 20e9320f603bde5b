"""conv2d NCHW/OIHW on CPUs: a register-blocked GEMM over (output channels x output width).

``out[n, f, y, x] += data[n, c, y*s + ry, x*s + rx] * w[f, c, ry, rx]`` is, per image, the
GEMM ``W[F, C*KH*KW] x im2col[C*KH*KW, H*W]``.  With OIHW weights that we may not repack,
the contiguous dimension of both the output and (for stride 1) the input is the output
width, so the micro-kernel keeps an ``nf x xt`` tile of outputs in registers
(``nf`` output channels, ``xt`` output columns as vectors), broadcasts one weight per row
and does ``nf`` FMAs per input vector.  A 1x1 stride-1 unpadded conv fuses (y, x) into one
contiguous axis first, which is exactly a GEMM.  Padding stays its own parallel,
vectorised stage.  A 1x1 conv whose input outgrows ``PANEL_BYTES`` runs panel by panel:
a run of output pixels, all input channels copied contiguous, then every output-channel
block over it (parallel over the panels).  The elementwise epilogue (bias, relu, residual
add) is inlined into the write-back of the register tile.  Parallel over (n, output-channel block, y).
"""

from __future__ import annotations

import math

from tvm.sym.analyzer import Analyzer

from ..base import MatchingCPURule
from . import common


def _reads_at(region, want, zero) -> bool:
    """``region`` starts at exactly ``want`` once the vars in ``zero`` are set to 0."""
    ana = Analyzer()
    for v, c in zero.items():
        ana.bind(v, c)
    idx = common.region_vars(region)
    return len(idx) == len(want) and all(
        ana.can_prove(e == w) for e, w in zip(idx, want))


def match_conv(sch, kinds: str):
    """The single conv block (iter kinds ``kinds``) whose output is indexed by its four
    spatial iters and whose weight read is indexed by (f, reduce iters...), as
    (block rv, weight buffer); None when the function is not one such conv with only
    spatial blocks around it."""
    m = common.single_reduction(sch, kinds)
    if m is None:
        return None
    rv, block, ivs = m
    if len(block.reads) < 2 or common.fp32_output(block, ivs[:4]) is None:
        return None
    out = block.writes[0]
    want_w = [ivs[1]] + ivs[4:]
    if len(want_w) < 4:  # depthwise: w[f, 0, ry, rx]
        want_w = [ivs[1], None] + ivs[4:]
    weights = [
        r for r in block.reads
        if r.source != out.source and len(r.region) == 4 and all(
            w is None or a.same_as(w) for a, w in zip(common.region_vars(r), want_w))
    ]
    if len(weights) != 1:
        return None
    return rv, weights[0].source


# Bytes of the input panel (all input channels x a run of output pixels) that every output
# channel block re-reads: half of the smallest L2 of current x86 and Arm cores (256 KB),
# so the panel and the blocks' weights stay in it
PANEL_BYTES = 1 << 17


def _panel(pixels: int, width: int, xt: int, channels: int) -> int:
    """Output pixels per input panel of a 1x1 conv (a multiple of the tile ``xt``, whole
    rows or part of one, dividing ``pixels``), or 0 when the whole input fits
    ``PANEL_BYTES`` (it stays in cache across the channel blocks as it is)."""
    if channels * pixels * 4 <= PANEL_BYTES:
        return 0
    fits = [d for d in common.divisors(pixels) if d % xt == 0 and d < pixels
            and (d % width == 0 or width % d == 0) and channels * d * 4 <= PANEL_BYTES]
    return max(fits, default=0)


# Widest pixel tile of a 1x1 conv's GEMM, in vectors (the tile takes ``rows`` output
# channels of as many accumulators each)
MAX_TILE_VECTORS = 8


def _pixel_tile(ny: int, nx: int, lanes: int) -> int:
    """Output pixels per register tile of a 1x1 stride-1 conv's GEMM over its flattened
    (y, x) axis, or 0 when none fits: whole vectors that are whole rows or part of one (a
    tile crossing a row boundary part-way has its write-back computed over its bounding
    box), else the fewest whole rows that are whole vectors (28-pixel rows under 16 lanes:
    112 pixels, 7 vectors; ShuffleNetV2's 58-channel 1x1 convs ran 14-lane row tiles of 2
    channels at a third of onnxruntime's speed)."""
    xt = common.vector_tile(ny * nx, lanes)
    if xt % nx == 0 or nx % xt == 0:
        return xt
    rows = lanes // math.gcd(nx, lanes)  # lcm(nx, lanes) = rows * nx
    if rows * nx <= MAX_TILE_VECTORS * lanes and ny % rows == 0:
        return rows * nx
    return 0


def _vectorize(sch, loop, lanes: int) -> None:
    """Vectorise a pixel loop: more than two whole vectors as unrolled single vectors (LLVM
    splits a 112-lane vector badly), else the loop as it is."""
    n = common.const_extent(sch, loop)
    if n is not None and n > 2 * lanes and n % lanes == 0:
        vo, loop = sch.split(loop, [None, lanes])
        sch.unroll(vo)
    sch.vectorize(loop)


class Conv2dNCHW(MatchingCPURule):
    """conv2d NCHW (any stride, padding, dilation; groups == 1) + elementwise epilogue."""

    name = "cpu.conv2d_nchw"

    def match(self, sch):
        return match_conv(sch, "SSSSRRR")

    def schedule(self, sch, m, target):
        conv, _ = m
        lanes = common.lanes_fp32(target)
        pads, after, tail = common.inline_around(sch, conv)

        n, f, y, x, rc, ry, rx = sch.get_loops(conv)
        ext = [common.const_extent(sch, l) for l in (n, f, y, x, rc, ry, rx)]
        if ext[2] is None or ext[3] is None:  # a symbolic image
            return _schedule_symbolic(sch, conv, ext, (pads, after, tail), target)
        if any(e is None for e in ext):
            return None
        _, nf_, ny, nx, _, kh, kw = ext
        block = sch.get(conv)
        ivs = [iv.var for iv in block.iter_vars]
        data = [r for r in block.reads if r.source != block.writes[0].source]
        contiguous = kh == kw == 1 and any(
            _reads_at(r, [ivs[0], ivs[4], ivs[2], ivs[3]], {iv.var: iv.dom.min for iv in block.iter_vars[5:]})
            and list(r.source.shape)[2:] == list(block.writes[0].source.shape)[2:]
            for r in data)
        data_read = next(i for i, r in enumerate(block.reads)
                         if r.source.same_as(data[0].source)) if data else None
        xt = _pixel_tile(ny, nx, lanes) if contiguous else 0
        contiguous = contiguous and xt > 0
        if contiguous:  # 1x1, stride 1, no padding: (y, x) is one contiguous GEMM axis
            s = sch.fuse(y, x)
            so, xi = sch.split(s, [None, xt])
        else:
            xt = common.vector_tile(nx, lanes)
            so, xi = sch.split(x, [None, xt])
        nv = -(-xt // lanes)
        nr = common.reg_rows(nf_, nv, common.acc_budget(target, "matmul"))
        fo, fi = sch.split(f, [None, nr])
        panel = _panel(ny * nx, nx, xt, ext[4]) if contiguous else 0
        if panel:
            # input panels outside the channel blocks, copied contiguous: every block
            # reads the panel from L2, not the whole input from memory (channel rows
            # H*W*4 bytes apart also share cache sets; Segformer's 256 -> 150 classifier
            # at 128x128 ran 16 GFLOP/s single-thread, onnxruntime 30)
            sp, so = sch.split(so, [None, panel // xt])
            sch.reorder(n, sp, fo, so, rc, ry, rx, fi, xi)
            par = [n, sp]
        elif contiguous:
            sch.reorder(n, fo, so, rc, ry, rx, fi, xi)
            par = [n, fo]
        else:
            sch.reorder(n, fo, y, so, rc, ry, rx, fi, xi)
            par = [n, fo, y]
        wb, pads = common.write_back_at(sch, conv, so, tail, pads, after)
        if panel:
            packed = sch.cache_read(conv, data_read, "global")
            sch.compute_at(packed, sp)
            common.vectorize_row(sch, packed, lanes)
        return _finish(sch, conv, wb, pads, par, (fi, xi, rx, rc), target)


def _schedule_symbolic(sch, conv, ext, around, target):
    """The conv over a symbolic image (``legalize_conv_nchwc.conv2d_nchw_columns``: the
    columns padded to whole tiles of ``xt``, read back off the padded extent; or static
    columns under symbolic rows): one-row tiles of ``nr`` output channels x ``xt``
    columns within a tile of ``STACK_BYTES`` (in registers), the rows alone parallel
    (``conv2d_nchwc``'s ``_row_tasks``), the channel tiles a serial loop in each."""
    from .conv2d_nchwc import symbolic_budget

    pads, after, tail = around
    lanes = common.lanes_fp32(target)
    if any(e is None for e in (ext[1], *ext[4:])):
        return None
    n, f, y, x, rc, ry, rx = sch.get_loops(conv)
    if ext[3] is None:
        xt = common.tile_columns(sch.get(x).extent, 4 * lanes)
        if xt is None or xt % lanes:
            return None  # not padded by the legalization (no CPU tile registered)
    else:
        xt = common.vector_tile(ext[3], lanes)
    nv = -(-xt // lanes)
    budget = symbolic_budget(lanes, common.acc_budget(target, "matmul"))
    nr = common.reg_rows(ext[1], nv, budget)
    fo, fi = sch.split(f, [None, nr])
    so, xi = sch.split(x, [None, xt])
    sch.reorder(n, y, fo, so, rc, ry, rx, fi, xi)
    wb, pads = common.write_back_at(sch, conv, so, tail, pads, after)
    return _finish(sch, conv, wb, pads, [n, y], (fi, xi, rx, rc), target)


def _finish(sch, conv, wb, pads, par, loops, target):
    """The common end of both schedules: ``par`` parallel, the tile's channel rows
    unrolled and columns vectorised (``loops``: fi, xi, rx, rc), the reduction's init
    and the write-back vectorised, the pads as elementwise stages."""
    lanes, ncores = common.lanes_fp32(target), common.cores(target)
    fi, xi, rx, rc = loops
    common.parallel(sch, par, ncores)
    sch.unroll(fi)
    _vectorize(sch, xi, lanes)
    sch.unroll(rx)
    init = sch.decompose_reduction(conv, rc)
    _vectorize(sch, sch.get_loops(wb)[-1], lanes)
    _vectorize(sch, sch.get_loops(init)[-1], lanes)
    for p in pads:
        common.schedule_elementwise(sch, p, lanes, ncores)
    return sch
