"""Schedules for kernels: default rules per target (dlight style), tuning records.

``apply_schedules(mod, target)`` schedules every PrimFunc of ``mod``: the first rule of
the target's list whose ``apply(func, target)`` returns a schedule wins.  A kernel no rule
matches is built as it is (correct, slow).  With a tuning database (``database.py``), a kernel
whose record says tuning won replays the record's MetaSchedule trace instead; tuning jobs
themselves are in ``tuning.py``.  A kernel written already scheduled (the attribute
``PRESCHEDULED``: ``cpu/recurrence.py``) is kept as it is, under the rule it names.
This package knows nothing of ONNX.
"""

from __future__ import annotations

import logging

import tvm

from .base import MatchingCPURule, ScheduleRule, SharedSchedule
from .cpu import RULES
from .cpu.recurrence import PRESCHEDULED
from .lets import vectorizable
from . import vector_ops  # noqa: F401  (marks tirx.nearbyint / isnan vectorisable)

__all__ = ["apply_schedules", "default_schedule", "ScheduleRule", "RULES"]

log = logging.getLogger("onnxc.schedules")


def apply_schedules(mod, target, database=None) -> tuple:
    """Schedule each PrimFunc of ``mod`` for ``target`` (a targets.TargetInfo).

    ``database`` (a :class:`schedules.database.TuningDatabase`, optional): a kernel whose
    record for this target says tuning won replays the record's trace; every other kernel
    (no record, or the default won) gets the default rule.

    Returns (scheduled IRModule, {kernel symbol: "tuned", a rule name or "none"}).
    """
    tvm_target = target.tvm_target()
    out, used = {}, {}
    for gv, func in mod.functions.items():
        name = gv.name_hint
        tuned = _from_database(database, func, target, name) if database is not None else None
        if tuned is not None:
            out[gv], used[name] = vectorizable(tuned).with_attrs(func.attrs), "tuned"
            continue
        if func.attrs is not None and PRESCHEDULED in func.attrs:
            # written already scheduled (schedules/cpu/recurrence.py)
            out[gv], used[name] = func, str(func.attrs[PRESCHEDULED])
            continue
        sch, used[name] = default_schedule(func, tvm_target, name)
        # (Lets TVM's vectorizer cannot take inlined: schedules/lets.py)
        out[gv] = func if sch is None else vectorizable(sch.mod["main"]).with_attrs(func.attrs)
    return tvm.IRModule(out), used


def default_schedule(func, tvm_target, name: str = "kernel") -> tuple:
    """(schedule, rule name) from the first rule that applies, or (None, "none")."""
    shared = SharedSchedule(func)  # the matching rules read one schedule until one matches
    for rule in RULES:
        try:
            with tvm_target:
                sch = (rule.apply(func, tvm_target, shared) if isinstance(rule, MatchingCPURule)
                       else rule.apply(func, tvm_target))
        except Exception as e:  # a rule that cannot handle a kernel must not fail the build
            log.debug("rule %s failed on %s: %s", rule.name, name, e)
            shared.take()  # whatever state it left
            continue
        if sch is not None:
            return sch, rule.name
    return None, "none"


def _from_database(database, func, target, name: str):
    """The kernel as its tuned record schedules it, or None (no record, default won, or a
    trace that does not replay: then the default rule, with a warning)."""
    from .database import apply_record

    record = database.lookup(func, target)
    if record is None:
        return None
    try:
        return apply_record(func, record)
    except Exception as e:  # a stale or foreign record must not fail the build
        log.warning("tuning record %s for kernel %s does not apply (%s); using the default "
                    "schedule", record["task"], name, str(e).strip().splitlines()[-1:])
        return None
