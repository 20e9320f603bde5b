"""Nearest upsampling by an integer factor on CPUs: the repeated lanes unrolled, the row
left to LLVM's loop vectoriser.

``out[.., x] = in[.., x // s]`` (ONNX Resize nearest x2 in FPN / U-Net decoders, which the
Resize converter writes as ``repeat``; Upsample; ``repeat`` itself), possibly with the rows
repeated too (``in[.., y // s, x // s]``, inlined from the first ``repeat``).  The
fallback vectorises ``x`` in TIR, where ``x // s`` is no ramp: every lane becomes its own
scalar load (FPN's [256, 32, 32] x2: 0.46 ms).  Here ``x`` is split ``(xo, xi)`` with
``xi`` of extent ``s`` unrolled, so one input element is loaded per ``xo`` and stored
``s`` times: a plain loop over ``xo`` whose stores LLVM's loop vectoriser recognises as
an interleaved group (0.12 ms measured on znver3, one core; onnxruntime 0.15-0.19 ms).
The outer loops are fused and parallel.
"""

from __future__ import annotations

from tvm import tirx

from ..base import MatchingCPURule
from . import common


def _repeat_factor(expr, x) -> int | None:
    """``s`` when ``expr`` is ``x // s`` (floor division by a constant >= 2), else None."""
    if isinstance(expr, (tirx.FloorDiv, tirx.Div)) and expr.a.same_as(x) and isinstance(
            expr.b, tirx.IntImm) and int(expr.b) >= 2:
        return int(expr.b)
    return None


def _input_factor(block) -> int | None:
    """The factor ``s`` when ``block`` reads one buffer other than its output, with the
    last index ``x // s`` of its innermost iter ``x``; else None."""
    out = block.writes[0].source if len(block.writes) == 1 else None
    ins = [r for r in block.reads if out is None or not r.source.same_as(out)]
    if out is None or len(ins) != 1 or not block.iter_vars:
        return None
    idx = common.region_vars(ins[0])
    return _repeat_factor(idx[-1], block.iter_vars[-1].var) if idx else None


def match_upsample(sch):
    """(output block rv, factor) when every block is spatial and the block writing the
    output reads one buffer at ``[.., x // s]`` (``x`` its innermost iter, ``s >= 2``
    dividing its extent); else None."""
    blks = common.blocks(sch)
    if not blks:
        return None
    kinds = [common.iter_kinds(sch.get(b)) for b in blks]
    if any(k is None or not k or "R" in k for k in kinds):
        return None
    last = blks[-1]
    s = _input_factor(sch.get(last))
    if s is None:
        return None
    ext = sch.get(last).iter_vars[-1].dom.extent
    if not isinstance(ext, tirx.IntImm) or int(ext) % s:
        return None
    return last, s


class UpsampleNearest(MatchingCPURule):
    """``out[.., x] = in[.., x // s]``: ``xi`` of extent ``s`` unrolled, rows in parallel."""

    name = "cpu.upsample_nearest"

    def match(self, sch):
        return match_upsample(sch)

    def schedule(self, sch, m, target):
        last, s = m
        last = common.inline_producers(sch, last)
        if last is None:  # a producer that could not be inlined: not this kernel
            return None
        if _input_factor(sch.get(last)) != s:  # inlining changed the last index
            return None
        loops = sch.get_loops(last)
        if any(common.const_extent(sch, lp) is None for lp in loops):
            return None
        _, xi = sch.split(loops[-1], [None, s])
        sch.unroll(xi)
        outer = loops[:-1]
        if outer and common.cores(target) > 1:
            fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
            sch.parallel(fused)
        return sch
