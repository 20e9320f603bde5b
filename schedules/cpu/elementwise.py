"""Kernels without a reduction: elementwise chains, layout transforms, pads, copies.

The schedule is the fallback's (``fallback.schedule_loops``: inline producers, vectorise the
innermost whole vectors, parallelise the fused outer loops), which is all such a kernel
needs; the rule exists so that the compile report names these kernels ``cpu.elementwise``
and ``fallback`` is left to kernels no rule understands.  Before it, an EfficientNet-B0's
swish kernels (a few FLOPs per element, counted generously for exp) read as "62% of the
FLOPs on the fallback" and the warning pointed `onnxc tune` at them.
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func

from ..base import ScheduleRule
from .fallback import schedule_loops


class Elementwise(ScheduleRule):
    """Every block spatial (no reduction loop): the fallback's loop schedule, named."""

    name = "cpu.elementwise"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos or any(set(info.dom_kind()) - {"S"} for info in infos):
            return None
        return schedule_loops(sch, infos, target)
