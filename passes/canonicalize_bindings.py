"""x = y; f(x) => f(y): drop alias bindings (the importer's n1_o0 = n1_2, one per output).

TVM's FuseOps does not fuse through a variable bound to another variable, so each alias
ends a kernel group: conv + folded BatchNorm + Relu stayed two kernels, a residual Add
after a converter's helper bindings another.  Dataflow aliases only: ``main``'s output
(``gv = x``) stays, since the binding names (provenance tags) are kept that way; TVM's
CanonicalizeBindings would bind the output's call to ``gv`` and lose its tag.  Runs right
after fold_constants, before the fusion passes whose results should fuse with neighbours.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .context import GraphPass, PassReport
from .dataflow import rebind, record_bindings

RULE = "x = y; f(x) => f(y)"


class CanonicalizeBindings(GraphPass):
    """x = y; f(x) => f(y)"""

    name = "canonicalize_bindings"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        dropper = _DropAliases(mod)
        func = dropper.visit_expr(mod["main"])
        if not dropper.dropped:
            return mod
        record_bindings(report, RULE, dropper.dropped)
        out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs,
                           global_infos=mod.global_infos)
        out["main"] = func
        return out


@mutator
class _DropAliases(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.dropped: list = []

    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        if isinstance(binding.var, relax.DataflowVar) and isinstance(value, relax.Var):
            self.set_var_remap(binding.var, value)      # uses of the alias read its source
            self.dropped.append(binding.var.name)
            return
        rebind(self, binding, value)
