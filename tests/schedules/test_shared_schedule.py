"""schedules.default_schedule shares one Schedule between the rules' match() calls
(schedules/base.py SharedSchedule): every match must leave it unchanged, and a rule that
matched takes it, so the next rule (after one that gave up) starts from the kernel."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax, s_tir

import schedules
from schedules.base import MatchingCPURule, SharedSchedule
from schedules.cpu import RULES
from tests.schedules.util import TARGET, fused_primfunc

KERNELS = {
    "softmax": (lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)), [(4, 33, 40)]),
    "matmul": (lambda bb, a, b: bb.emit(relax.op.matmul(a, b)), [(37, 24), (24, 40)]),
    "conv2d": (lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1)),
               [(1, 8, 14, 14), (16, 8, 3, 3)]),
    "max_pool2d": (lambda bb, x: bb.emit(relax.op.nn.max_pool2d(x, 3, 2)), [(1, 8, 15, 15)]),
    "sum": (lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(6, 50, 7)]),
}


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_match_leaves_the_shared_schedule_unchanged(kind):
    build, shapes = KERNELS[kind]
    func = fused_primfunc(build, shapes, kind)
    before = s_tir.Schedule(func).mod
    shared = SharedSchedule(func)
    matched = 0
    for rule in RULES:
        if not isinstance(rule, MatchingCPURule):
            continue
        with TARGET:
            try:
                m = rule.match(shared.get())
            except Exception:  # noqa: BLE001 - a rule may refuse by raising
                m = None
        matched += m is not None
        tvm.ir.assert_structural_equal(shared.get().mod, before)
    assert kind == "sum" or matched >= 1  # the case exercises at least one match


def test_shared_schedule_is_taken_by_the_rule_that_schedules():
    func = fused_primfunc(*KERNELS["softmax"], "softmax")
    shared = SharedSchedule(func)
    first = shared.get()
    assert shared.get() is first
    sch, rule = schedules.default_schedule(func, TARGET, "softmax")
    assert rule == "cpu.row_reduction" and sch is not None
    # the same result as the rule on a schedule of its own
    alone = next(r for r in RULES if r.name == rule).apply(func, TARGET)
    tvm.ir.assert_structural_equal(sch.mod, alone.mod)
    shared.take()
    assert shared.get() is not first
