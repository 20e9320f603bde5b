"""Checked variants of fused kernels: every intermediate exposed and named after its ONNX node.

A fused kernel computes several ONNX nodes in one loop nest.  When its output holds NaN/Inf
(``onnxc run --check-nan``) or differs from a reference (``onnxc debug``), the kernel alone
cannot say which node went wrong.  So for every fused kernel of two or more steps the
compiler also builds ``<kernel>__checked``: the same *unscheduled* PrimFunc with each
intermediate buffer (FuseTIR's ``<buffer>_intermediate``, one per binding of the fused Relax
function, in binding order) turned into an extra output parameter.  Called on the kernel's
own arguments plus one temporary per intermediate, it recomputes the kernel step by step;
each call in the graph records (``call["checked"]``) which ONNX node every step computes,
which buffers the step read, and where its result lies.

Why this design (and not re-evaluating the ONNX sub-graph with onnx.reference): it works
from the ``.so`` alone (no ONNX model, no compiler, no onnx package at run time), it replays
our own code, so the transformed params (folded BatchNorm, packed weights, constants
inlined into the kernel) and blocked layouts need no mapping back, and it costs nothing at
run time unless a check fires.  The price: one unscheduled kernel per distinct fused
kernel at build time (``compile_seconds`` of the cnn zoo model: see docs/architecture.md),
and on CPU targets only (an unscheduled kernel does not build for CUDA).  A fused function
whose intermediates cannot be matched to its bindings gets no variant; the check then
names the kernel and all its nodes, as before.
"""

from __future__ import annotations

import re

from tvm import relax
from tvm.s_tir import SBlock, SBlockRealize
from tvm.tirx import PrimFunc

from .provenance import nodes_of_binding

SUFFIX = "__checked"
_TENSOR = re.compile(r"^n(\d+(?:x\d+)*)(?:_o(\d+))?$")  # bindings that are ONNX tensors


def fused_steps(fused_mod) -> dict:
    """{fused function name: (number of params, steps, output steps)} of the module after
    FuseOps; a step is (callee output buffer name, [("in", param index) | ("step", j)]).
    Functions with a binding other than a single-output call_tir are left out."""
    out = {}
    for gv, func in fused_mod.functions.items():
        if not isinstance(func, relax.Function) or gv.name_hint == "main":
            continue
        info = _steps(fused_mod, func)
        if info is not None:
            out[gv.name_hint] = info
    return out


def _steps(mod, func):
    where = {p: ("in", i) for i, p in enumerate(func.params)}
    steps = []
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if not (isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.call_tir"
                    and isinstance(v.args[1], relax.Tuple) and len(v.args) == 2
                    and not isinstance(v.ty, relax.TupleType)):
                return None
            reads = []
            for a in v.args[1].fields:
                if isinstance(a, relax.Var):
                    if a not in where:
                        return None
                    reads.append(where[a])
            callee = mod[v.args[0]]
            where[b.var] = ("step", len(steps))
            steps.append((callee.params[-1].name, reads))
    result = func.body.body
    fields = result.fields if isinstance(result, relax.Tuple) else [result]
    outputs = []
    for f in fields:
        if not (isinstance(f, relax.Var) and where.get(f, ("in",))[0] == "step"):
            return None
        outputs.append(where[f][1])
    if len(steps) < 2:
        return None
    return len(func.params), steps, outputs


def expose_intermediates(func, info):
    """(checked PrimFunc, [where each step's result lies: ("out", k) | ("tmp", t)],
    [temporary buffers]) for the fused PrimFunc ``func`` and its ``fused_steps`` entry;
    None when the intermediates do not match the steps one to one."""
    nparams, steps, outputs = info
    if len(func.params) != nparams + len(outputs):
        return None
    realize = func.body
    if not isinstance(realize, SBlockRealize):
        return None
    root = realize.block
    allocs = list(root.alloc_buffers)
    taken, places, temps = set(), [], []
    for j, (buf_name, _) in enumerate(steps):
        if j in outputs:
            places.append(("out", outputs.index(j)))
            continue
        pattern = re.compile(rf"^{re.escape(buf_name)}_intermediate(_\d+)?$")
        hit = next((k for k, a in enumerate(allocs) if k not in taken
                    and pattern.match(a.name)), None)
        if hit is None:
            return None
        taken.add(hit)
        places.append(("tmp", len(temps)))
        temps.append(allocs[hit])
    kept = [a for k, a in enumerate(allocs) if k not in taken]
    new_root = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body,
                      root.init, kept, root.match_buffers, root.annotations)
    body = SBlockRealize(realize.iter_values, realize.predicate, new_root)
    checked = PrimFunc(list(func.params) + temps, body, func.ret_type, func.attrs)
    return checked, places, temps


def attach_checked(graph, fused: dict, members: dict, layouts: dict) -> int:
    """Make the checked variant of every fused kernel of ``graph`` that has one
    (``graph.checked``: {symbol: PrimFunc}) and describe it on each of its calls
    (``call["checked"]``); returns how many calls got one.

    ``fused``: ``fused_steps`` of the module after FuseOps; ``members``: {call name:
    (fused function, pre-fusion binding names)} from ``provenance.name_fused_calls``;
    ``layouts``: ``layouts.binding_layouts``."""
    made: dict = {}
    described = 0
    tensors = graph.tensors
    for call in graph.calls:
        nin = len(call["args"]) - call["num_outputs"]
        name = tensors[call["args"][nin]].name.split(".")[0]
        entry = members.get(name)
        symbol = call["kernel"]
        info = fused.get(symbol)
        if entry is None or info is None or entry[0] != symbol or info[0] != nin:
            continue
        if symbol not in made:
            made[symbol] = expose_intermediates(graph.prim_funcs[symbol], info)
        if made[symbol] is None:
            continue
        _, places, temps = made[symbol]
        call["checked"] = _describe(symbol, info[1], places, temps, entry[1],
                                    graph.onnx_nodes, graph.onnx_outputs, layouts)
        described += 1
    graph.checked = {sym + SUFFIX: m[0] for sym, m in made.items() if m is not None}
    return described


def onnx_tensor(binding: str, onnx_outputs: list) -> str | None:
    """The ONNX tensor a tagged binding holds (``n3``: node 3's first output, ``n3_o1`` its
    second, ``n2x3`` node 3's), or None (a converter's helper binding ``n3_1``)."""
    m = _TENSOR.match(binding or "")
    if not m:
        return None
    k = max(int(x) for x in m.group(1).split("x"))
    out = int(m.group(2) or 0)
    outs = onnx_outputs[k] if k < len(onnx_outputs) else []
    return outs[out] if out < len(outs) and outs[out] else None


def _describe(symbol, steps, places, temps, bindings, onnx_nodes, onnx_outputs,
              layouts) -> dict:
    """``call["checked"]``: the variant's symbol, its temporaries and, per step, the ONNX
    node it computes (the binding's last node: a pass's ``n2x3`` is node 3's output), the
    ONNX tensor it is (None for a converter's helper binding), where its result lies, its
    layout, and what it read."""
    described = []
    for j, ((_, reads), place) in enumerate(zip(steps, places)):
        binding = bindings[j] if j < len(bindings) else None
        idx = nodes_of_binding(binding) if binding else []
        node, op = onnx_nodes[idx[-1]] if idx and idx[-1] < len(onnx_nodes) else (None, None)
        described.append({"binding": binding, "node": node, "op": op,
                          "tensor": onnx_tensor(binding, onnx_outputs), "place": list(place),
                          "reads": [list(r) for r in reads],
                          "layout": layouts.get(binding) if binding else None})
    return {"kernel": symbol + SUFFIX,
            "temps": [{"shape": [int(d) for d in t.shape], "dtype": str(t.dtype)}
                      for t in temps],
            "steps": described}
