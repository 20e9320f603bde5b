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

    def apply(self, func, target, shared=None):
        """The scheduled kernel or None.  ``shared`` (optional, a :class:`SharedSchedule`
        of ``func``): match on its schedule, so that rules which do not match share one
        (a Schedule costs ~10 ms to make: DenseNet-121 made 1314 of them); only a rule
        that matches takes it, to schedule."""
        from tvm import s_tir

        if target.kind.name != "llvm":
            return None
        sch = shared.get() if shared is not None else s_tir.Schedule(func)
        m = self.match(sch)
        if m is None:
            return None
        if shared is not None:
            shared.take()  # schedule() changes it (and may give up half way)
        return self.schedule(sch, m, target)

    def match(self, sch):
        """Recognise the kernel; must not change ``sch`` (rules share it for matching)."""
        raise NotImplementedError

    def schedule(self, sch, match, target):
        raise NotImplementedError


class SharedSchedule:
    """One unchanged ``Schedule`` of a kernel for every rule's ``match`` to read; made on
    first use and again after a rule took it to schedule."""

    def __init__(self, func):
        self._func, self._sch = func, None

    def get(self):
        from tvm import s_tir

        if self._sch is None:
            self._sch = s_tir.Schedule(self._func)
        return self._sch

    def take(self) -> None:
        self._sch = None
