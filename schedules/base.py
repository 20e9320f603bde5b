"""The schedule rule interface (dlight style)."""

from __future__ import annotations


class ScheduleRule:
    """Base: ``name`` and ``apply(func, target) -> Schedule | None``."""

    name = ""

    def apply(self, func, target):
        raise NotImplementedError
