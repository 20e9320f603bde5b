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

LLVM's interleaved groups are a per-CPU cost-model decision, though: for ``znver4`` it
vectorised the 3x3/2 pool 8 lanes wide with shuffles per tap, one accumulator chain and a
scalar remainder of 8 of each row's 56 outputs, 0.60 ms against onnxruntime's 0.17 (one
thread).  So where a row of outputs has a tile of whole vectors, each task instead copies
its (padded) input plane split into ``s`` phases, ``phase[r][.., j] = in[.., j*s + r]``
(one pass, a deinterleaving load LLVM vectorises without gaps), and a tap ``rx = q*s + r``
reads ``phase[r][.., x + q]``: contiguous, so the ``x`` tile (up to 64 outputs: 4 AVX-512 vectors,
independent accumulator chains in registers) is vectorised in TIR: 0.60 -> 0.21 ms on znver4.

So each (image, channel[, output plane]) is a parallel task that builds its padded input
(if any) and computes its outputs with the taps unrolled, the average's division in the
write-back (phases) or a per-task write-out.  Stride-1 windows keep the TIR-vectorised
rules (``cpu.pool2d_nchw``, ``cpu.tiled_reduction``: contiguous vector loads there).
"""

from __future__ import annotations

from ..base import MatchingCPURule
from . import common


def match_strided_pool(sch):
    """(pool block rv, number of window dims, innermost stride) of a 1-, 2- or 3-D window
    pooling kernel
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
    o = common.fp32_output(block, spatial, common.FLOAT_OR_KEYS)
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
    stride = common.stride(idx[-1], spatial[-1])
    if stride is None or stride < 2:
        return None
    return rv, d, stride


class PoolStrided(MatchingCPURule):
    """max / average pooling 1-D, 2-D, 3-D NCHW with an innermost stride > 1."""

    name = "cpu.pool_strided"

    def match(self, sch):
        return match_strided_pool(sch)

    def schedule(self, sch, m, target):
        rv, d, stride = m
        ncores = common.cores(target)
        pads, after, tail = common.inline_around(sch, rv)
        loops = sch.get_loops(rv)
        if any(common.const_extent(sch, lp) is None for lp in loops):
            return None
        n, c, *sp = loops[:2 + d]
        taps = loops[2 + d:]
        # one task per (image, channel), and per output plane of a 3-D window
        task = sch.fuse(n, c, *sp[:-2]) if d == 3 else sch.fuse(n, c)
        lanes = common.lanes_fp32(target)
        xt = x_tile(common.const_extent(sch, sp[-1]), lanes)
        if xt:
            _phases(sch, rv, stride, task, sp, taps, pads, after, tail, xt, lanes, ncores)
            return sch
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
        for a in after:
            common.schedule_elementwise(sch, a, lanes, ncores)
        return sch


# Outputs of a row in one register tile of the phase-split schedule at most: 4 AVX-512
# vectors, 8 AVX2 ones (of 16 registers), 16 NEON ones (of 32)
X_TILE = 64


def x_tile(ow: int, lanes: int) -> int:
    """Outputs of a row per register tile of the phase-split schedule: the row itself up to
    ``X_TILE``, else its largest divisor within that which is whole vectors of ``lanes``
    (an ``ow`` with none, a prime, keeps LLVM's loop vectoriser: 0)."""
    if ow <= X_TILE:
        return ow
    fits = [t for t in common.divisors(ow) if t <= X_TILE and t % lanes == 0]
    return max(fits) if fits else 0


def _phases(sch, rv, s, task, sp, taps, pads, after, tail, xt, lanes, ncores):
    """The phase-split schedule (module docstring): the task's input plane copied as ``s``
    phases, taps ``rx = q*s + r`` reading phase ``r`` at ``x + q``, ``xt`` outputs of a
    row accumulated in registers over the unrolled taps, written back once."""
    src = common.input_producer(sch, rv, pads, len(sp) + 2)
    if src is None:  # unpadded: a copy of the input
        src = sch.cache_read(rv, 0, "global")
    pads = [p for p in pads if not sch.get(p).same_as(sch.get(src))]
    buf = sch.get(src).writes[0].source
    width, zero = int(buf.shape[-1]), 0.0 if "float" in str(buf.dtype) else 0
    # [.., w] -> [.., w % s, .., w // s] (the phase outermost of the plane); a width that
    # is no multiple of s leaves the last phase a column short (never read: padded)
    sch.transform_layout(src, ("write", 0), lambda *i: (*i[:2], i[-1] % s, *i[2:-1], i[-1] // s),
                         pad_value=None if width % s == 0 else zero)
    q, r = sch.split(taps[-1], [None, s])
    xo, xi = sch.split(sp[-1], [None, xt])
    sch.reorder(task, *sp[-2:-1], xo, *taps[:-1], q, r, xi)  # (task, y, xo, taps, x)
    sch.compute_at(src, task)
    if width % s == 0:  # the copy's column loop by phases: a deinterleaving load, no gaps
        _, wr = sch.split(sch.get_loops(src)[-1], [None, s])
        sch.unroll(wr)
    wb, rest = common.write_back_at(sch, rv, xo, tail, pads, after)
    if ncores > 1:
        sch.parallel(task)
    for t in (*taps[:-1], q, r):
        sch.unroll(t)
    sch.vectorize(xi)  # before decompose_reduction: the update alone is no reduction
    init = sch.decompose_reduction(rv, taps[0] if len(taps) > 1 else q)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(wb)[-1])
    for p in rest:
        common.schedule_elementwise(sch, p, lanes, ncores)
