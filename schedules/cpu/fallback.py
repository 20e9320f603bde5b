"""The last CPU rule: any kernel no other rule takes, scheduled from its loop structure.

Inlines elementwise producers, then per remaining block fuses and parallelises the leading
spatial loops and vectorises the innermost loop when every loop is spatial (a symbolic
innermost loop is left serial, outside the fusion, for LLVM's loop vectoriser).
"""

from __future__ import annotations

import math
import re

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from ..base import ScheduleRule
from . import common


def _select_period(sch, info):
    """(period, cut) when the block chooses between loads with ``if_then_else`` on an index
    taken modulo a constant (RotaryEmbedding's half rotation: ``x[.., v % 8 - 4]`` when
    ``4 <= v % 8``): the modulus, and the constant the remainder is compared with (None
    when the condition has no such comparison); else None.

    Such a block is left scalar: TVM 0.27 vectorises it wrongly when its outer loops are
    serial (lanes 8-15 of 16 read the wrong elements: ONNX ``test_rotary_embedding_3d_input``
    on a 1-core target), and so does LLVM's own loop vectoriser for ``znver4`` / ``znver5``
    on the scalar loop (half of the outputs garbage; ``skylake-avx512``, ``icelake-server``
    and ``znver3`` are right): ``_split_period`` takes the modulo out of the loop first."""
    block = sch.get(info.block_rv)
    for select in common.nodes(block.body, tvm.ir.expr.Call):
        if not select.op.same_as(common.SELECT):
            continue
        cond = select.args[0]
        mods = [int(m.b) for m in common.nodes(cond, tirx.FloorMod)
                if isinstance(m.b, tirx.IntImm)]
        if not mods:
            continue
        cuts = []
        for kind, (left, right) in _CUT.items():
            for c in common.nodes(cond, kind):
                if isinstance(c.a, tirx.IntImm) and isinstance(c.b, tirx.FloorMod):
                    cuts.append(int(c.a) + left)
                elif isinstance(c.b, tirx.IntImm) and isinstance(c.a, tirx.FloorMod):
                    cuts.append(int(c.b) + right)
        return mods[0], (cuts[0] if cuts and 0 < cuts[0] < mods[0] else None)
    return None


# where the remainder's range splits for a comparison with a constant c: (c on the left,
# c on the right) -> the cut is c plus this (c <= m: c; m <= c: c + 1; ...)
_CUT = {tirx.LE: (0, 1), tirx.LT: (1, 0), tirx.GE: (1, 0), tirx.GT: (0, 1)}


def _split_period(sch, loops, period):
    """Split the innermost loop by the select's ``period`` (and at its ``cut``) so that the
    remainder is the inner loop's own variable: the lowered loop body has no modulo and no
    select left for a vectoriser to get wrong.  The loops stay scalar.  Returns the loops
    outside the split (the block itself may be gone: a partition makes new ones), or None
    when the innermost loop does not divide (then the loop stays scalar as before: not seen
    in an export, where the modulus is a head size that divides the flattened row)."""
    mod, cut = period
    ext = common.const_extent(sch, loops[-1])
    if ext is None or ext % mod or ext == mod:
        return None
    outer, inner = sch.split(loops[-1], [None, mod])
    if cut is not None:
        try:
            sch.loop_partition(inner, [cut, None])
        except Exception:  # noqa: BLE001 - the split alone already removes the modulo
            pass
    return [*loops[:-1], outer]


class Fallback(ScheduleRule):
    """Inline elementwise producers; per remaining block, fuse and parallelise the leading
    spatial loops and vectorise the innermost loop when every loop is spatial."""

    name = "fallback"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        return schedule_loops(sch, infos, target)


# A block of fewer iterations than this (all loops, constant extents) stays on one core: a
# parallel launch costs more than the work.  Add over [1, N] float32, 2 threads against 1, on
# 2 vCPUs (scripts/bench_overhead.py's host): onnxc's launcher 0.90 / 0.70 us at N = 4096,
# 1.83 / 1.86 us at 16384; TVM's pool (in-memory sessions) 3.5 / 1.3 us and 6.5 / 2.7 us.
SERIAL_BELOW = 1 << 14


def _tiny(sch, loops) -> bool:
    """True when ``loops`` (a block's whole nest) run fewer than SERIAL_BELOW iterations."""
    extents = [common.const_extent(sch, lp) for lp in loops]
    return None not in extents and math.prod(extents) < SERIAL_BELOW


def _let_read_twice(sch, info) -> bool:
    """Whether ``info``'s block binds a Let (the legalizations' ``bind_once``,
    ``passes/math_f32``) and its consumers read it more than once: inlined, the Let would
    be copied into every read, binding one variable several times, which TVM's lowering
    refuses (T5's relative-position buckets over a symbolic sequence: a log read twice
    by a select) or simplifies for minutes.  Such a block keeps its own loop nest."""
    block = sch.get(info.block_rv)
    if "T.Let(" not in str(block.body):
        return False
    reads = 0
    for c in sch.get_consumers(info.block_rv):
        for w in block.writes:
            reads += len(re.findall(rf"\b{re.escape(w.source.name)}\[", str(sch.get(c).body)))
    return reads > 1


def schedule_loops(sch, infos, target):
    """The fallback's schedule of ``sch`` (blocks ``infos`` from normalize_prim_func);
    also what ``cpu.elementwise`` applies to kernels without a reduction."""
    lanes, cores = common.lanes_fp32(target), common.cores(target)
    kept = []
    for info in reversed(infos):
        if info is not infos[-1] and info.is_injective() and not _let_read_twice(sch, info):
            try:
                sch.compute_inline(info.block_rv)
                continue
            except Exception:  # e.g. read by a reduction at a non-inlinable index
                pass
        kept.append(info)
    for info in kept:
        loops = sch.get_loops(info.block_rv)
        kinds = info.dom_kind()
        if len(loops) != len(kinds):  # not in one-loop-per-iter form: leave it
            continue
        n_lead = len(kinds) - len(kinds.lstrip("S"))
        vectorized, tiny, row = False, _tiny(sch, loops), None
        period = _select_period(sch, info) if n_lead == len(kinds) else None
        split = _split_period(sch, loops, period) if period is not None else None
        if split is not None:
            loops = split
            n_lead = len(loops)
        elif n_lead == len(kinds) and n_lead and period is None:
            ext = common.const_extent(sch, loops[-1])
            # odd widths (56, 28, 7): fuse the last two spatial loops when their product
            # is whole vectors (56x56 = 196 x 16), instead of leaving the loop scalar
            # (rows of 4 vectors or more keep their own loop, below: fused, a read indexed
            # by the row alone, a per-channel scale, became a gather behind a division)
            # (not with a Let in the value: lanes across two rows index by a division,
            # TVM's vectorizer then scalarizes the loop, binding the Let's var once per
            # lane, and its simplifier refuses that: "Let cannot bind the same var to two
            # different values", MobileNetV3's QDQ requantisation over NCHW8c)
            # (only when every read fused stays contiguous or invariant: a broadcast read
            # over the last axis alone, Expand's [1, 64, 1, 56] -> [.., 56, 56], became a
            # gather behind a modulo, 2.9x onnxruntime's time)
            if (ext is not None and ext % lanes and n_lead >= 2 and ext < 4 * lanes
                    and (common.const_extent(sch, loops[-2]) or 1) * ext % lanes == 0
                    and not _has_let(sch, info) and _flat_last_two(sch, info)):
                loops = [*loops[:-2], sch.fuse(loops[-2], loops[-1])]
                n_lead -= 1
                ext = common.const_extent(sch, loops[-1])
            if ext is not None and ext % lanes == 0 and ext >= lanes:
                _, vec = sch.split(loops[-1], [None, lanes])
                sch.vectorize(vec)
                loops = sch.get_loops(info.block_rv)[:-1]
                n_lead = len(loops)
                vectorized = True
            elif ext is not None and ext >= 2 * lanes and n_lead >= 2:
                # a row of no whole vectors (3199 audio frames, 197 tokens): selects
                # (pads) partitioned at their bounds tests, whose interior LLVM
                # vectorises; anything else vectorised as whole vectors and a short-vector tail
                # (wav2vec2's GELU over [512, 3199] with its per-channel scale, fused
                # into whole vectors above: 2.6 ms, onnxruntime 1.2)
                row = "partition" if _has_select(sch, info) else "vectors"
        inner = common.const_extent(sch, loops[-1]) if loops else 0
        if (not vectorized and n_lead == len(loops) and n_lead >= 2
                and (inner is None or inner >= lanes)):
            # the innermost loop stayed scalar (an odd width: a pad's 114; a symbolic seq):
            # kept out of the parallel fusion, a plain loop LLVM can still unroll or
            # vectorise, instead of a division and a modulo by the row width per element
            # (a 1-pixel zero pad of [1, 64, 112, 112]: 831744 fused iterations, 4-8 ms
            # against onnxruntime's 0.2; attention's K^T transpose over seq 4x its static)
            n_lead -= 1
        symbolic = [i for i, lp in enumerate(loops[:n_lead])
                    if common.const_extent(sch, lp) is None]
        if symbolic and 0 < symbolic[-1] < n_lead - 1:
            # a symbolic loop inside the fusion costs divisions by a runtime extent per
            # iteration: the constant loops inside the last symbolic one stay in the
            # parallel body, so each iteration copies a whole row, not one vector behind
            # three int64 divisions (GPT-2's Concat(past, new) over [1, 12, past + 1, 64]:
            # 98k iterations of 8 floats per layer and step before).  An outermost
            # symbolic loop (batch) costs no such division: nothing changes then.
            n_lead = symbolic[-1] + 1
        n_lead = common.one_symbolic_fusion(sch, info.block_rv, loops[:n_lead])
        if n_lead and cores > 1 and not tiny:
            fused = sch.fuse(*loops[:n_lead]) if n_lead > 1 else loops[0]
            ext = common.const_extent(sch, fused)
            if ext is None or ext >= 2:
                sch.parallel(fused)
        if row == "partition":
            sch.annotate(sch.get_loops(info.block_rv)[-1], "pragma_loop_partition_hint", 1)
        elif row == "vectors":
            common.vectorize_row(sch, info.block_rv, lanes)
    return sch


def _flat_last_two(sch, info) -> bool:
    """Whether fusing the block's last two iters keeps the reads as they were: False when
    a read indexes the last iter but not the one before (a broadcast over the rows, whose
    fused index is a modulo per lane: a gather).  Reads by both (a transpose, which reads
    no better unfused: ConvNeXt's transpose + add 139 -> 480 us when left unfused) or by
    the row alone are fused as before."""
    block = sch.get(info.block_rv)
    a, b = (iv.var for iv in block.iter_vars[-2:])
    for read in block.reads:
        idx = common.region_vars(read)
        if any(common.uses_var(e, b) for e in idx) and \
                not any(common.uses_var(e, a) for e in idx):
            return False
    return True


def _has_let(sch, info) -> bool:
    """The block's value binds a Let (legalize_nan's relu / clip, GELU)."""
    return bool(common.nodes(sch.get(info.block_rv).body, tvm.tirx.Let))


def _has_select(sch, info) -> bool:
    """The block chooses between loads with ``if_then_else`` (a pad, a concat)."""
    return any(c.op.same_as(common.SELECT)
               for c in common.nodes(sch.get(info.block_rv).body, tvm.ir.expr.Call))

