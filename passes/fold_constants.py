"""op(constants) => constant: evaluate every binding whose inputs are all constants.

Runs first: ONNX exports carry weight reshapes, casts and shape arithmetic on initializers
that would otherwise become kernels run on every inference.
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .relax_util import bindings, op_counts


class FoldConstants(GraphPass):
    name = "fold_constants"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        before = op_counts(mod)
        n_before = len(bindings(mod))
        mod = relax.transform.FoldConstant()(mod)
        after = op_counts(mod)
        folded = n_before - len(bindings(mod))
        if folded:
            report.rewrites["op(const) => const"] = folded
            report.nodes = sorted(op for op in before if after.get(op, 0) < before[op])
        return mod
