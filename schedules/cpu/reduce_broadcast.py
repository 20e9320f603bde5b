"""A reduction whose small result is broadcast into a larger elementwise output, on CPUs.

Squeeze-and-excitation blocks (RegNet-Y, EfficientNet, MobileNetV3) fuse into one kernel:
``s = sigmoid(W @ pooled + b)`` (a 1x1 conv on a [1, C, 1, 1] tensor: the reduction) and
``out = x * s`` over the whole [1, C, H, W] feature map.  dlight's reduction rule put the
reduction inside the multiply's parallel loop over (channel block, row): the excitation
was recomputed for every row (RegNet-Y-4GF: 14x, 6% of its single-thread time at 0.4
GFLOP/s).  Here every block runs once, at the root: the reduction parallel over its
outputs (vectorised over the channel block where the weight is read along it, see
``_vector_reduction``), the small elementwise stages after it (bias, sigmoid) and the
broadcast consumer each as a parallel, vectorised elementwise loop.  Nothing small is
inlined into the large consumer, so nothing small is recomputed per element; the large
stages before it are (``_inline_large_stages``), so the map is read once.
"""

from __future__ import annotations

import math

from ..base import MatchingCPURule
from . import common

# the final output must be this many times larger than the reduction's result
BROADCAST = 4
# loop nests with fewer iterations than this run on one core: a parallel launch costs
# more than such a stage (the excitation's bias and sigmoid over C values)
SERIAL_BELOW = 1 << 15


def match_reduce_broadcast(sch):
    """(reduction block rv, its spatial iter count) when the function's only reduction
    block (every other block spatial, its extents static) writes a result at least
    ``BROADCAST`` times smaller than the last block's output (a symbolic output, a
    symbolic image's map, counts as larger); else None."""
    found = common.only_reduction(sch)
    if found is None:
        return None
    rv, kinds = found
    if kinds.rstrip("R") != kinds[:kinds.index("R")] or "S" not in kinds:
        return None  # spatial iters first, then the reduction ones
    red = sch.get(rv)
    if len(red.writes) != 1:
        return None
    small = common.elements(red.writes[0].source)
    last = sch.get(common.blocks(sch)[-1])
    if last.same_as(red) or len(last.writes) != 1:
        return None
    large = common.elements(last.writes[0].source)  # None: a symbolic image's map
    if small is None or (large is not None and large < BROADCAST * small):
        return None
    if any(common.const_extent(sch, lp) is None for lp in sch.get_loops(rv)):
        return None
    return rv, kinds.index("R")


class ReduceBroadcast(MatchingCPURule):
    """reduction -> small elementwise stages -> broadcast into a large elementwise output."""

    name = "cpu.reduce_broadcast"

    def match(self, sch):
        return match_reduce_broadcast(sch)

    def schedule(self, sch, m, target):
        red, spatial = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        _inline_large_stages(sch, red)
        for blk in common.blocks(sch):
            loops = sch.get_loops(blk)
            ext = [common.const_extent(sch, lp) for lp in loops]
            work = math.prod(ext) if None not in ext else SERIAL_BELOW  # symbolic: large
            cores = ncores if work >= SERIAL_BELOW else 1
            if sch.get(blk).same_as(sch.get(red)):
                if _lanes_innermost(sch, red, spatial):
                    _vector_reduction(sch, red, spatial, lanes, cores)
                else:
                    common.parallel(sch, loops[:spatial], cores)
            else:
                common.schedule_elementwise(sch, blk, lanes, cores)
        return sch


def _inline_large_stages(sch, red) -> None:
    """Inline every stage before the last whose output is larger than the reduction's
    into its consumers: the broadcast side is then one pass over the map.  A QDQ
    excitation (EfficientNet-B0 quantized by onnxruntime) has a dozen such stages (the
    map's dequantize, the multiply, its requantisation) that ran as a dozen passes over
    a 1.8 MB map, each into a buffer of its own: 775 us against onnxruntime's 159."""
    small = common.elements(sch.get(red).writes[0].source)
    for blk in common.blocks(sch)[:-1]:
        block = sch.get(blk)
        if block.same_as(sch.get(red)) or len(block.writes) != 1:
            continue
        size = common.elements(block.writes[0].source)  # None: symbolic, a large map
        if size is not None and size <= small:
            continue
        try:
            sch.compute_inline(blk)
        except Exception:  # not inlinable (e.g. read at other indices): keep the stage
            pass


def _lanes_innermost(sch, red, spatial: int) -> bool:
    """True when the reduction's innermost spatial iter ``v`` (over more than one value) is
    read by some input, and by each input only as its last index, with stride 1: a 1x1
    conv on a [1, C, 1, 1] NCHW[b]c tensor reads its weight at ``[f, co, 0, 0, ci, v]``,
    the pooled input not at ``v`` at all."""
    block = sch.get(red)
    if common.const_extent(sch, sch.get_loops(red)[spatial - 1]) in (None, 1):
        return False
    written = block.writes[0].source
    ins = [r for r in block.reads if not r.source.same_as(written)]
    return common.lane_reads(ins, block.iter_vars[spatial - 1].var) is True


def _vector_reduction(sch, red, spatial: int, lanes: int, cores: int) -> None:
    """The reduction with ``v`` innermost and vectorised (a vector FMA per reduction step,
    contiguous weight rows, the input broadcast), the other spatial loops parallel.  The
    scalar form ran one dependent chain per output over strided weights: RegNet-Y-4GF's
    excitation 1x1 conv [272 -> 1088] 372 us against onnxruntime's 107, one thread."""
    loops = sch.get_loops(red)
    sp, rd = loops[:spatial], loops[spatial:]
    inner = sp[-1]
    n = common.const_extent(sch, inner)
    tile = common.vector_tile(n, lanes)
    outer = list(sp[:-1])
    if tile != n:
        vo, inner = sch.split(inner, [None, tile])
        outer.append(vo)
    sch.reorder(*outer, *rd, inner)
    common.parallel(sch, outer, cores)
    sch.vectorize(inner)
    init = sch.decompose_reduction(red, rd[0])
    sch.vectorize(sch.get_loops(init)[-1])
