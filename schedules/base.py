"""The schedule rule interface (dlight style)."""

from __future__ import annotations


class ScheduleRule:
    """Base: ``name`` and ``apply(func, target) -> Schedule | None``."""

    name = ""

    def apply(self, func, target):
        raise NotImplementedError


class Dlight(ScheduleRule):
    """A TVM dlight rule as one of ours (dlight's ``apply`` takes a third ``tunable``
    argument and may return a list of schedules: the first is taken)."""

    def __init__(self, name, rule):
        self.name, self._rule = name, rule

    def apply(self, func, target):
        sch = self._rule.apply(func, target, False)
        return sch[0] if isinstance(sch, list) else sch


class MatchingCPURule(ScheduleRule):
    """A CPU rule in two steps: ``match(sch)`` recognises the kernel (None: not ours), then
    ``schedule(sch, match, target)`` schedules it (None: leave it to the next rule)."""

    def apply(self, func, target):
        from tvm import s_tir

        if target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        m = self.match(sch)
        return None if m is None else self.schedule(sch, m, target)

    def match(self, sch):
        raise NotImplementedError

    def schedule(self, sch, match, target):
        raise NotImplementedError
