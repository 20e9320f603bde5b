"""Strided window pooling, 1-D / 2-D / 3-D NCHW, on CPUs: per channel, taps unrolled,
the output row left to LLVM's loop vectoriser.

``out[n, c, (z,) (y,) x] = max|sum over taps of pad[n, c, .., x*s + rx]`` with ``s > 1``:
MaxPool k3/s2 over audio frames, ResNet's 3x3/2 stem pool, C3D's 2x2x2/2 average pool.
Vectorising ``x`` in TIR makes every vector load a stride-``s`` read, which TVM emits as
one scalar load and insert per lane; LLVM's loop vectoriser instead recognises the
stride-``s`` accesses of a plain ``x`` loop as an interleaved group (wide loads and
shuffles).  Measured on znver3, one core: MaxPool1d k3/s2 on [64, 4000] 0.037 ms with
the ``x`` loop left to LLVM against 0.143 ms TIR-vectorised; MaxPool2d 3x3/2 on
[64, 112, 112] 0.24 ms against 0.72 ms (``cpu.pool2d_nchw``'s vectorised window);
AvgPool3d 2/2 on [64, 8, 56, 56] 0.22 ms against 8.6 ms (dlight's reduction rule).

So each (image, channel[, output plane]) is a parallel task that builds its padded input
(if any) and computes its outputs with the taps unrolled inside the ``x`` loop (the
accumulator stays in a register), the average's division in a per-task write-out.
Stride-1 windows keep the TIR-vectorised rules (``cpu.pool2d_nchw``,
``cpu.tiled_reduction``: contiguous vector loads there).
"""

from __future__ import annotations

from tvm import tirx
from tvm.sym.pattern import detect_linear_equation

from ..base import MatchingCPURule
from . import common


def _stride(expr, var) -> int | None:
    """The constant coefficient of ``var`` in ``expr`` (``x * s + r``), else None."""
    coef = detect_linear_equation(expr, [var])
    if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm):
        return None
    return int(coef[0])


def match_strided_pool(sch):
    """(pool block rv, number of window dims) of a 1-, 2- or 3-D window pooling kernel
    whose innermost window has stride > 1, else None: one reduction block with iters
    ``S * (2 + d)`` then ``R * d``, writing a float32 ``out[n, c, ..]`` at its spatial iters
    from one input read at ``[n, c, .., x*s + rx]``, every other block spatial."""
    found = common.only_reduction(sch)
    if found is None:
        return None
    rv, kinds = found
    d = kinds.count("R")
    if d not in (1, 2, 3) or kinds != "S" * (2 + d) + "R" * d:
        return None
    block = sch.get(rv)
    ivs = [iv.var for iv in block.iter_vars]
    spatial = ivs[:2 + d]
    o = common.fp32_output(block, spatial)
    if o is None:
        return None
    _, ins = o
    if len(ins) != 1 or len(ins[0].region) != len(spatial):
        return None
    idx = common.region_vars(ins[0])
    if not (idx[0].same_as(spatial[0]) and idx[1].same_as(spatial[1])):
        return None
    if not common.uses_var(idx[-1], ivs[-1]):  # the innermost tap walks the last dim
        return None
    stride = _stride(idx[-1], spatial[-1])
    if stride is None or stride < 2:
        return None
    return rv, d


class PoolStrided(MatchingCPURule):
    """max / average pooling 1-D, 2-D, 3-D NCHW with an innermost stride > 1."""

    name = "cpu.pool_strided"

    def match(self, sch):
        return match_strided_pool(sch)

    def schedule(self, sch, m, target):
        rv, d = m
        ncores = common.cores(target)
        pads, after, tail = common.inline_around(sch, rv)
        loops = sch.get_loops(rv)
        if any(common.const_extent(sch, lp) is None for lp in loops):
            return None
        n, c, *sp = loops[:2 + d]
        taps = loops[2 + d:]
        # one task per (image, channel), and per output plane of a 3-D window
        task = sch.fuse(n, c, *sp[:-2]) if d == 3 else sch.fuse(n, c)
        sch.reorder(task, *(sp[-2:] if d >= 2 else sp), *taps)
        if tail is not None:  # the average's division: per task, after its window sums
            sch.reverse_compute_at(tail, task)
            after = [a for a in after if not sch.get(a).same_as(sch.get(tail))]
        for p in pads:  # the padded input of one task, built inside it
            sch.compute_at(p, task)
        if ncores > 1:  # before decompose_reduction (common.parallel)
            sch.parallel(task)
        for t in taps:
            sch.unroll(t)
        sch.decompose_reduction(rv, taps[0])
        lanes = common.lanes_fp32(target)
        for a in after:
            common.schedule_elementwise(sch, a, lanes, ncores)
        return sch
