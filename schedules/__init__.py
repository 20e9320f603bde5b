"""Schedules for kernels: default rules per target (dlight style), later tuning records.

``apply_schedules(mod, target)`` schedules every PrimFunc of ``mod``: the first rule of
the target's list whose ``apply(func, target)`` returns a schedule wins.  A kernel no rule
matches is built as it is (correct, slow).  This package knows nothing of ONNX.
"""

from __future__ import annotations

import logging

import tvm

from .rules import RULES, ScheduleRule

__all__ = ["apply_schedules", "ScheduleRule", "RULES"]

log = logging.getLogger("onnxc.schedules")


def apply_schedules(mod, target) -> tuple:
    """Schedule each PrimFunc of ``mod`` for ``target`` (a targets.TargetInfo).

    Returns (scheduled IRModule, {kernel symbol: rule name or "none"}).
    """
    tvm_target = target.tvm_target()
    out, used = {}, {}
    for gv, func in mod.functions.items():
        name = gv.name_hint
        out[gv], used[name] = func, "none"
        for rule in RULES:
            try:
                with tvm_target:
                    sch = rule.apply(func, tvm_target)
            except Exception as e:  # a rule that cannot handle a kernel must not fail the build
                log.debug("rule %s failed on %s: %s", rule.name, name, e)
                continue
            if sch is not None:
                out[gv], used[name] = sch.mod["main"].with_attrs(func.attrs), rule.name
                break
    return tvm.IRModule(out), used
