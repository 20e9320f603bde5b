"""Which ONNX nodes each kernel computes.

The importer names every Relax binding after its ONNX node (``n<k>``, or ``n<k>_<j>``
for helper bindings a converter emitted).  Binding names survive legalization; FuseOps
moves each group's bindings into a fused function (a function may serve several call
sites) and gives the group's call in ``main`` a fresh name.  ``name_fused_calls`` walks
``main`` after FuseOps, matches every fused function's bindings at each call site against
the module before fusion (same kernel, same arguments), renames the call after the
group's last member and returns the members: FuseTIR keeps that name, so every kernel call
can name its ONNX nodes.  It also returns, per call, the pre-fusion name of each binding of
the fused function in order, so that ``compiler/lowering/checked.py`` can name the node
behind every intermediate of the kernel.
"""

from __future__ import annotations

import tvm
from tvm import relax

# the binding tags (n3, n2x3, n3_1, n3_o0) are defined once, with the passes that write them
from passes.dataflow import nodes_of as nodes_of_binding


def node_of_binding(name: str) -> int | None:
    """The first ONNX node index of a tagged binding name, or None."""
    nodes = nodes_of_binding(name)
    return nodes[0] if nodes else None


def rename_bindings(mod, new_names: list):
    """Rename main's bindings by position (None keeps a name)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Rename(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.i = 0

        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            name = new_names[self.i] or binding.var.name
            self.i += 1
            cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
            var = cls(name, value.ty)
            self.builder_.emit_normalized(relax.VarBinding(var, value))
            self.set_var_remap(binding.var, var)

    renamed = _Rename(mod).visit_expr(mod["main"])
    out = tvm.IRModule(dict(mod.functions.items()))
    out["main"] = renamed
    return out


def _bindings(func):
    return [b for block in func.body.blocks for b in block.bindings]


def _key(value, resolve):
    """What a binding computes, by name: (kernel, argument names) of a call_tir, a tuple
    item, or None for anything else."""
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        return ("[]", resolve(value.tuple_value), value.index)
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.call_tir"):
        return None
    return (value.args[0].name_hint,
            tuple(resolve(a) if isinstance(a, relax.Var) else "<const>"
                  for a in value.args[1].fields))


def name_fused_calls(pre_fuse, fused, members_out: dict | None = None):
    """Rename fused calls in ``fused``'s main; return (module, {call name: [node index]}).

    ``members_out``, when given, receives {call name: (fused function name, [pre-fusion
    binding name or None, one per binding of the fused function, in order])}."""
    pre_index: dict = {}
    for b in _bindings(pre_fuse["main"]):
        key = _key(b.value, lambda v: v.name)
        if key:
            pre_index.setdefault(key, []).append(b.var.name)
    funcs = {gv.name_hint: f for gv, f in fused.functions.items()
             if isinstance(f, relax.Function) and gv.name_hint != "main"}
    outer: dict = {}           # main var -> pre-fusion name
    new_names, groups = [], {}
    for b in _bindings(fused["main"]):
        v = b.value
        callee = v.op.name_hint if isinstance(v, relax.Call) and \
            isinstance(v.op, relax.GlobalVar) else None
        if callee not in funcs:
            # an untagged alias (main's output, ``gv = x``) takes x's name, so the name
            # survives when later passes bind x's call to the alias directly
            name = None
            if isinstance(v, relax.Var) and node_of_binding(b.var.name) is None:
                name = outer.get(v)
            new_names.append(name)
            outer[b.var] = b.var.name if name is None else name
            continue
        func = funcs[callee]
        local = {p: outer.get(a, a.name if isinstance(a, relax.Var) else "<const>")
                 for p, a in zip(func.params, v.args)}
        members, per_binding = [], []
        for ib in _bindings(func):
            key = _key(ib.value, lambda x: local.get(x, x.name))
            names = pre_index.get(key, []) if key else []
            if names:
                local[ib.var] = names.pop(0)
                members.append(local[ib.var])
            per_binding.append(local.get(ib.var))
        name = members[-1] if members else None
        new_names.append(name)
        outer[b.var] = name or b.var.name
        if name:
            groups[name] = sorted({k for m in members for k in nodes_of_binding(m)})
            if members_out is not None:
                members_out[name] = (callee, per_binding)
    return rename_bindings(fused, new_names), groups
