"""max / average pooling on CPUs: NCHW (the depthwise schedule without weights) and NCHW[b]c.

``out[n, c, y, x] = max|sum over (ry, rx) of pad[n, c, y*s + ry, x*s + rx]`` is a
sliding-window reduction per channel, exactly the depthwise conv's loop nest, so it gets
the same schedule (``depthwise.schedule_window``): parallel over channels, the padded
plane built per channel, a register tile of output rows vectorised over the width, taps
unrolled; average pooling's division (by a count that depends on the position) is
applied in the write-back.  Global pooling (a whole-plane reduction) is not matched.

NCHW[b]c (``out[n, C, y, x, c]``, the layout convert_layout gives ResNet's stem pool): the
channel block ``c`` is the vector; parallel over (n, C, a few output rows: ``task_rows``),
a row of ``xt`` output pixels per register tile, each pixel's taps unrolled inside it, the
padded input rows a task needs built inside it.  Before this rule the fallback fused every spatial loop (block
lane included) and left the kernel scalar: ResNet-50's 3x3/2 stem pool took 630 us alone,
cold.  Taps innermost per pixel, not pixels innermost per tap: the NaN-skipping max
(``legalize_pool``) starts from a NaN that LLVM folds into the first tap (a copy), and with
the pixels inside the taps it then kept the tile in stack memory, stored and reloaded at
odd offsets every tap (stem pool [1, 8, 112, 112, 8], one Zen 3 core: 1140 us; taps inside
each pixel: 175 us, the accumulator in a register; average pooling unchanged).
"""

from __future__ import annotations

from ..base import MatchingCPURule
from . import common
from .depthwise import schedule_window


def match_pool(sch, blocked: bool = False):
    """(pool block rv, pad block rv or None) of a 2-D window pooling kernel, else None: one
    reduction block writing a float32 (or 8-bit) ``out[n, c, y, x]`` (``blocked``: NCHW[b]c,
    ``out[n, C, y, x, c]``) from one input read at ``[n, c, ., .]`` (``[n, C, ., ., c]``),
    every other block spatial.  Global pooling (one window) is a plain reduction: not
    matched."""
    m = common.single_reduction(sch, "SSSSSRR" if blocked else "SSSSRR")
    if m is None:
        return None
    rv, block, ivs = m
    spatial = ivs[:-2]
    # (8-bit: QOperator ResNet-50's uint8 stem MaxPool ran 1.96 ms on the fallback, ORT 0.07)
    o = common.fp32_output(block, spatial, common.POOLED)
    if o is None:
        return None
    out, ins = o
    if len(ins) != 1 or len(ins[0].region) != len(spatial):
        return None
    idx = common.region_vars(ins[0])
    same = (0, 1, 4) if blocked else (0, 1)  # image, channel (block), lane of the block
    if not all(idx[k].same_as(spatial[k]) for k in same):
        return None
    if all(_extent(iv) == 1 for iv in block.iter_vars[2:4]):
        return None
    pad = next((p for p in sch.get_producers(rv)
                if sch.get(p).writes[0].source.same_as(ins[0].source)), None)
    return rv, pad


def _extent(iv):
    return getattr(iv.dom.extent, "value", None)


class Pool2dNCHW(MatchingCPURule):
    """max_pool2d / avg_pool2d NCHW (any window, stride, padding, ceil mode) + epilogue."""

    name = "cpu.pool2d_nchw"

    def match(self, sch):
        return match_pool(sch)

    def schedule(self, sch, m, target):
        return schedule_window(sch, m[0], m[1], target)


def schedule_window_nchwc(sch, pool, pad, target):
    """Schedule a blocked-layout window reduction (see the module docstring); None when a
    loop extent but the batch and the output rows and columns is symbolic, or the channel
    block is wider than 4 vectors.  A symbolic image (rows, columns) gets tiles of one
    pixel and tasks of one row."""
    lanes, ncores = common.lanes_fp32(target), common.cores(target)
    pad_name = sch.get(pad).name_hint if pad is not None else None
    pads, after, tail = common.inline_around(sch, pool)
    loops = sch.get_loops(pool)
    ext = [common.const_extent(sch, lp) for lp in loops]
    if any(e is None for e in ext[4:]) or ext[4] > 4 * lanes:
        return None
    n, cb, y, x, c, ry, rx = loops
    nv = -(-ext[4] // lanes)                      # vectors per output pixel
    symbolic = None in ext[:4]
    xt = 1 if symbolic else max(d for d in common.divisors(ext[3]) if d * nv <= 8)
    xo, xi = sch.split(x, [None, xt])
    sch.reorder(n, cb, y, xo, xi, ry, rx, c)    # a pixel's taps inside it (module docstring)
    # the tile's accumulators in a "global" (per-task stack) buffer, not "local": TVM
    # serves a local buffer by a workspace call per task, an opaque pointer LLVM cannot
    # keep in registers (GoogLeNet's 3x3/1 pool on [192, 28, 28], znver4: 105 -> 97 us)
    wb, pads = common.write_back_at(sch, pool, xo, tail, pads, after, scope="global")
    # tasks of several output rows, whose padded input rows are built once for the task
    # (one row per task copied each input row `kernel / stride` times): 97 -> 79 us
    stride = _window_stride(sch, pool)
    rows = 1 if symbolic else task_rows(ext[0] * ext[1], ext[2], ext[3] * stride + ext[6],
                                        ext[5], ext[4], stride, ncores)
    yo, _ = sch.split(y, [None, rows])
    row = sch.fuse(n, cb, yo)
    if ncores > 1:
        sch.parallel(row)
    sch.unroll(ry)
    sch.unroll(rx)
    sch.unroll(xi)
    sch.vectorize(c)
    init = sch.decompose_reduction(pool, ry)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(wb)[-1])
    # the padded input rows of a task's output rows, built inside it
    common.schedule_pads(sch, pads, pad_name, row, lanes, ncores)
    return sch


# The padded input rows a task of the blocked pool builds (in L1 with its tile): at most
PAD_ROWS_BYTES = 32768


def task_rows(planes: int, oh: int, in_w: int, kh: int, block: int, stride: int,
              ncores: int) -> int:
    """Output rows per task of the blocked pool: the largest divisor of ``oh`` that leaves
    at least 4 tasks per core over the ``planes`` (n x channel blocks) and whose padded
    input rows (``(rows - 1) * stride + kh`` of ``in_w`` pixels of ``block`` floats) stay
    within ``PAD_ROWS_BYTES``; 1 at least."""
    best = 1
    for r in common.divisors(oh):
        rows_bytes = ((r - 1) * stride + kh) * in_w * block * 4
        if planes * (oh // r) >= 4 * ncores and rows_bytes <= PAD_ROWS_BYTES:
            best = r
    return best


def _window_stride(sch, pool) -> int:
    """The row stride of a blocked pool's window: the coefficient of its output row in
    the input row it reads (1 when not a plain ``y * s + ry``)."""
    block = sch.get(pool)
    src = [r for r in block.reads if not r.source.same_as(block.writes[0].source)][0]
    return common.stride(src.region[2].min, block.iter_vars[2].var) or 1


class Pool2dNCHWc(MatchingCPURule):
    """max_pool2d / avg_pool2d in NCHW[b]c (any window, stride, padding) + epilogue."""

    name = "cpu.pool2d_nchwc"

    def match(self, sch):
        return match_pool(sch, blocked=True)

    def schedule(self, sch, m, target):
        return schedule_window_nchwc(sch, m[0], m[1], target)
