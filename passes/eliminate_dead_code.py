"""Remove bindings whose values nothing uses (after folding, and after any rewrite).

Runs last: earlier passes leave the operands of what they replaced behind.
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .relax_util import bindings


class EliminateDeadCode(GraphPass):
    name = "eliminate_dead_code"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        n_before = len(bindings(mod))
        mod = relax.transform.DeadCodeElimination(["main"])(mod)
        removed = n_before - len(bindings(mod))
        if removed:
            report.rewrites["unused binding => removed"] = removed
        return mod
