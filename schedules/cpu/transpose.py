"""Transposes that move the innermost dim on CPUs (NCHW -> NHWC, ...): square tiles.

``out[.., x, c] = in[.., c, .., x]``: the output's innermost dim ``c`` is an outer dim
of the input and the input's innermost dim ``x`` an outer dim of the output.  The
fallback vectorises ``c``: every vector gathers from ``lanes`` rows a whole plane apart,
and the rows it touches are evicted before their neighbouring ``x`` is read (the
[1, 64, 112, 112] NCHW -> NHWC transpose 0.69 ms on znver3, one core).  Here ``c`` and
``x`` are split into ``lanes``-wide tiles, ``x`` tiles outside the ``c`` lanes: a tile
reads ``lanes`` short contiguous runs of the input and writes whole vectors of the
output, every cache line used while hot (0.19-0.21 ms).  The loops outside the tile are
fused and parallel.  The input's innermost index may be an output iter modulo a block
(NCHW16c -> NCHW reads ``x[n, c // 16, h, w, c % 16]``): the same tiles.
"""

from __future__ import annotations

from tvm import tirx

from ..base import MatchingCPURule
from . import common


def match_transpose(sch):
    """(output block rv, position of ``x`` among its iters) when every block is spatial,
    the last block writes a float32 buffer at exactly its iters and reads one buffer
    whose last index is one of its iters ``x`` (not the last, ``c``) and which reads
    ``c`` in another dim; else None."""
    blks = common.blocks(sch)
    if not blks:
        return None
    kinds = [common.iter_kinds(sch.get(b)) for b in blks]
    if any(k is None or not k or "R" in k for k in kinds):
        return None
    last = blks[-1]
    block = sch.get(last)
    ivs = [iv.var for iv in block.iter_vars]
    if len(ivs) < 2 or len(block.writes) != 1:
        return None
    out = block.writes[0]
    if out.source.dtype != "float32" or not common.same_vars(common.region_vars(out), ivs):
        return None
    ins = [r for r in block.reads if not r.source.same_as(out.source)]
    if len(ins) != 1:
        return None
    idx = common.region_vars(ins[0])
    c = ivs[-1]
    inner = idx[-1] if idx else None
    # NCHWc -> NCHW reads ``x[n, c // 16, h, w, c % 16]``: the innermost input dim is the
    # output's ``c`` modulo its block
    if (isinstance(inner, tirx.FloorMod) and isinstance(inner.b, tirx.IntImm)
            and isinstance(inner.a, tirx.Var)):
        inner = inner.a
    if not isinstance(inner, tirx.Var) or inner.same_as(c):
        return None
    pos = next((i for i, v in enumerate(ivs[:-1]) if v.same_as(inner)), None)
    # c read in an outer dim, alone or in a channel-block index (NCHW -> NCHWc:
    # ``x[n, C * 16 + c, h, w]``)
    if pos is None or not any(any(v.same_as(c) for v in tirx.analysis.undefined_vars(e))
                              for e in idx[:-1]):
        return None
    return last, pos


class TransposeTiled(MatchingCPURule):
    """``out[.., x, c] = in[.., c, .., x]``: lanes x lanes tiles, ``c`` vectorised."""

    name = "cpu.transpose_tiled"

    def match(self, sch):
        return match_transpose(sch)

    def schedule(self, sch, m, target):
        last, pos = m
        last = common.inline_producers(sch, last)
        if last is None:
            return None
        again = match_transpose(sch)
        if again is None or again[1] != pos:
            return None  # inlining changed the access: not a plain transpose any more
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        loops = sch.get_loops(last)
        ext = [common.const_extent(sch, lp) for lp in loops]
        if any(e is None for e in ext):
            return None
        ct, xt = common.vector_tile(ext[-1], lanes, 1), common.vector_tile(ext[pos], lanes, 1)
        if ct < 4 or xt < 4:  # too narrow to tile: the fallback's loop
            return None
        co, ci = sch.split(loops[-1], [None, ct])
        xo, xi = sch.split(loops[pos], [None, xt])
        outer = [lp for i, lp in enumerate(loops[:-1]) if i != pos]
        sch.reorder(*outer, co, xo, xi, ci)
        sch.vectorize(ci)
        # the loops outside the tiles in parallel (x tiles stay inside a task: their
        # input rows share cache lines); with none, the channel tiles
        common.parallel(sch, outer or [co], ncores)
        return sch
