"""Concatenation along an outer axis on CPUs: whole rows copied, the select out of the loop.

``out[.., s, x] = if_then_else(s < n0, a[.., s, x], b[.., s - n0, x])`` (topi's concatenate;
nested for more inputs), over an axis ``s`` before the innermost: a decoder's key/value
cache ``Concat(past, new)`` on ``[batch, heads, past + 1, head_dim]``, every step, over a
symbolic ``past``.  The elementwise schedule fuses ``heads x (past + 1)`` into its parallel
loop (a division and a modulo by ``past + 1`` per row) and tests the select per row.  Here
the loops before ``s`` are fused and parallel, ``s`` is left whole with TVM's loop
partition hint, so each input's rows become a loop of their own (the select resolved at
compile time, contiguous rows: a copy), and the loops after ``s`` are vectorised.  GPT-2's
cache concat at past 1023 ([1, 12, 1024, 64], 3 MB, buffers out of cache), the kernel
alone, median of 200: 0.99 -> 0.54 ms a call on 2 threads (numpy's single-threaded copy of
the past 0.84 ms); on one thread both schedules run at copy speed (0.53 / 0.56 ms in the
decode attention block): the gain is the second core's share of memory bandwidth.
(znver3, host shared with other jobs.)  TVM keeps the select in the past's loop (it does
not know ``past >= 0``): a predictable branch per row.

Taken only when the loops before ``s`` give every core a share (attention's heads); a
concatenation over the leading axis, or with too few outer rows, stays elementwise.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx

from ..base import MatchingCPURule
from . import common



def _select_axis(value, ivs) -> int | None:
    """The position in ``ivs`` of the one iter var every ``if_then_else`` condition of
    the (nested) select ``value`` tests, its leaves buffer loads; else None."""
    axes = set()

    def walk(e) -> bool:
        if isinstance(e, tvm.ir.expr.TensorLoad):  # a buffer load (tirx.BufferLoad builds one)
            return True
        if isinstance(e, tvm.ir.expr.Call) and e.op.same_as(common.SELECT):
            cond, then, other = e.args
            used = [n for n, v in enumerate(ivs) if common.uses_var(cond, v)]
            if len(used) != 1:
                return False
            axes.add(used[0])
            return walk(then) and walk(other)
        return False

    if not walk(value) or len(axes) != 1:
        return None
    return axes.pop()


def match_concat(sch):
    """(block rv, axis, the elementwise blocks after it) of a function whose first block
    is a spatial block storing a select between loads on one iter var ``s`` at exactly its
    iter vars, ``s`` not the innermost, and whose other blocks (a concat's fused epilogue:
    DenseNet's BatchNorm + ReLU after its channel concat) are spatial blocks over the same
    iteration space, each writing at exactly its iter vars; else None."""
    blks = common.blocks(sch)
    if not blks:
        return None
    block = sch.get(blks[0])
    kinds = common.iter_kinds(block)
    if not kinds or set(kinds) != {"S"} or not isinstance(block.body, tirx.BufferStore):
        return None
    ivs = [iv.var for iv in block.iter_vars]
    if not common.same_vars(list(block.body.indices), ivs):
        return None
    axis = _select_axis(block.body.value, ivs)
    if axis is None or axis == len(ivs) - 1:
        return None
    extents = [iv.dom.extent for iv in block.iter_vars]
    for rv in blks[1:]:
        b = sch.get(rv)
        if (common.iter_kinds(b) != kinds or not isinstance(b.body, tirx.BufferStore)
                or not common.same_vars(list(b.body.indices), [iv.var for iv in b.iter_vars])
                or not all(tvm_ffi.structural_equal(iv.dom.extent, e)
                           for iv, e in zip(b.iter_vars, extents))):
            return None
    return blks[0], axis, blks[1:]


class Concat(MatchingCPURule):
    """Concatenation on an outer axis (and its fused elementwise epilogue): outer loops
    parallel, the axis partitioned per input, the inner loops vectorised."""

    name = "cpu.concat"

    def match(self, sch):
        return match_concat(sch)

    def schedule(self, sch, m, target):
        blk, axis, after = m
        lanes, ncores = common.lanes_fp32(target), common.cores(target)
        if after:  # the epilogue reads the concat at its own indices: one block
            for b in [blk] + list(after[:-1]):
                sch.compute_inline(b)
            blk = after[-1]
        loops = sch.get_loops(blk)
        outer, s, inner = loops[:axis], loops[axis], loops[axis + 1:]
        shares = 1
        for lp in outer:
            shares *= common.const_extent(sch, lp) or 1
        if shares < ncores and len(inner) > 1:
            plane = math.prod(common.const_extent(sch, lp) or 0 for lp in inner)
            if plane and plane % (ncores * lanes) == 0:
                # too few rows before the axis (a channel concat of one NCHW image): each
                # core takes a contiguous share of every input's planes, copied as whole
                # vectors (with the image rows outside the channels, each task copied a
                # 56-wide row per channel, strided by the plane: 1.7x onnxruntime's time
                # for 37 + 27 channels of [56, 56])
                part, rest = sch.split(sch.fuse(*inner), [ncores, None])
                sch.reorder(*outer, part, s, rest)
                common.parallel(sch, outer + [part], ncores)
                sch.annotate(s, "pragma_loop_partition_hint", 1)
                _, v = sch.split(rest, [None, lanes])
                sch.vectorize(v)
                return sch
            # too few rows before the axis (a channel concat of one image, NCHW[b]c): the
            # next axis (the image rows) goes outside it, each task's rows partitioned
            sch.reorder(*outer, inner[0], s)
            outer, inner = outer + [inner[0]], inner[1:]
            shares *= common.const_extent(sch, outer[-1]) or ncores
        if shares < ncores:  # the rows of s would have to be split between cores
            return None
        common.parallel(sch, outer, ncores)
        sch.annotate(s, "pragma_loop_partition_hint", 1)
        last = common.const_extent(sch, inner[-1])
        if last is not None and last % lanes == 0 and len(inner) > 1 and \
                common.const_extent(sch, inner[-2]) is None:
            _, v = sch.split(inner[-1], [None, lanes])  # a symbolic row of whole vectors
            sch.vectorize(v)
            return sch
        row = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        ext = common.const_extent(sch, row)
        if ext is not None and ext % lanes == 0:
            _, v = sch.split(row, [None, lanes])
            sch.vectorize(v)
        elif ext is not None:
            # a row of no whole vectors (a channel concat of 56-wide image rows): whole
            # vectors and a short one.  Left a plain loop, LLVM unrolled it and vectorised
            # the channel loop around it into gathers (37 + 27 channels of [56, 56]: 2.7x
            # onnxruntime's time)
            common.vectorize_row(sch, blk, lanes)
        return sch
