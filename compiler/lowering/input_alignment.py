"""Kernels that read a model input take it wherever the caller's array lies.

TVM declares every buffer parameter 64-byte aligned (its ``data_alignment``), marks it so
for LLVM (``storage_alignment``), and LLVM may then emit aligned vector moves on it
(``vmovaps``), which fault on any other address.  numpy gives 16-byte aligned memory, so
the runtime copied each such input into the arena before every run: 786 KB of softmax
input cost ~50 us of a 120 us run (`[12, 128, 128]`, emeraldrapids, 2 threads).

Here the parameters through which kernels read a model input (or a reshape view of one)
are declared element-aligned instead:

* :func:`mark` (before scheduling) names them on each kernel (attribute :data:`ATTR`:
  parameter positions) and returns, per input, the alignment the kernels now assume of
  it (its element size, or 64 where a kernel writes into the input's storage: a key/value
  cache appended in place); ``graph.plan_storage`` records it as the input's ``align`` and the
  runtime reads an input in place when its data is that aligned;
* :func:`relax` (after scheduling, before ``tvm.compile``) rewrites those parameters'
  buffer types.  It runs after the schedules so that tuning records (keyed by the
  scheduled-from kernel's structure) still match; :data:`ATTR` is left out of that key
  (``schedules/database.py``).

A kernel built this way is as fast (``scripts/bench_alignment.py``: the matmul, conv
layout transform and add reading an element-aligned input measured within noise of the
64-byte build; docs/performance.md, "Unaligned inputs").
"""

from __future__ import annotations

import json

import numpy as np

from runtime.dims import call_kernels
from runtime.session import arg_positions

from .graph import _root  # the tensor whose storage a view is of

# Kernel attribute: positions of the parameters to declare element-aligned.
ATTR = "onnxc.element_aligned"
# What TVM assumes of every buffer parameter unless told otherwise (its kAllocAlignment).
DEFAULT_ALIGN = 64


def mark(graph) -> dict:
    """Name, on each kernel of ``graph`` (a KernelGraph), the parameters that read a model
    input or a view of one; returns {input name: alignment in bytes the kernels assume of
    its data}."""
    inputs = {t: name for name, t in graph.inputs}
    positions: dict = {}   # kernel -> set of parameter positions
    written = set()        # inputs whose storage a kernel writes
    for call in graph.calls:
        nin = len(call["args"]) - call["num_outputs"]
        kernels = call_kernels(call)
        for i, (t, pos) in enumerate(zip(call["args"], arg_positions(call))):
            r = _root(graph, t)
            if r not in inputs:
                continue
            if i >= nin:
                written.add(r)
                continue
            for k in kernels:
                positions.setdefault(k, set()).add(pos)
    for k, ps in positions.items():
        graph.prim_funcs[k] = graph.prim_funcs[k].with_attr(ATTR, sorted(ps))
    return {name: DEFAULT_ALIGN if t in written else
            np.dtype(graph.tensors[t].dtype).itemsize for t, name in inputs.items()}


def relax(mod):
    """``mod`` with the parameters :data:`ATTR` names on each kernel declared
    element-aligned (the attribute removed); kernels without it unchanged."""
    import tvm

    changed = {}
    for gv, func in mod.functions.items():
        attrs = getattr(func, "attrs", None)
        if attrs is None or ATTR not in attrs:
            continue
        changed[gv] = _relaxed(func.without_attr(ATTR), [int(p) for p in attrs[ATTR]])
    if not changed:
        return mod
    funcs = {gv: changed.get(gv, f) for gv, f in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _relaxed(func, positions: list[int]):
    """``func`` with the buffer types of ``params[positions]`` at their element's alignment.

    TVM 0.27 keeps a buffer's alignment in the type of its variable, which every access
    shares, and offers no Python mutator over TIR nor a ``specialize`` that changes it: the
    function goes through its JSON form, where the type is one node."""
    import tvm

    doc = json.loads(tvm.ir.save_json(func))
    nodes = doc["nodes"]
    root = nodes[doc.get("root_index", doc.get("root"))]["data"]
    params = nodes[root["params"]]["data"]
    for p in positions:
        ty = nodes[nodes[params[p]]["data"]["ty"]] if p < len(params) else None
        if ty is None or ty["type"] != "tirx.BufferType":
            # the graph already records the input as element-aligned: a kernel left at 64
            # would fault on it, so refuse rather than skip
            raise ValueError(f"kernel parameter {p} named for element alignment is not a "
                             "buffer parameter")
        dtype = nodes[ty["data"]["dtype"]]["data"]["dtype"]
        ty["data"]["data_alignment"] = max(1, tvm.DataType(dtype).bits // 8)
    return tvm.ir.load_json(json.dumps(doc))
