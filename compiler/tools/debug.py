"""Divergence bisection: the first ONNX tensor where onnxc and a reference disagree.

The model is compiled without memory reuse, so every kernel output keeps its own buffer
and can be read after the run.  A kernel output whose binding is tagged with an ONNX node
(``n<k>``, ``n<k>_o<i>``, ``n2x3`` for what a pass fused; see compiler/lowering/provenance.py) *is*
that node's output tensor.  The reference (onnxruntime with graph optimisations off, or
``onnx.reference``) is run on the same model with those tensors added as graph outputs.
Each kernel output is first mapped back to the ONNX layout (NCHW[b]c and NHWC to NCHW,
padded channels dropped) from the layout the graph records per tensor
(``compiler/lowering/layouts.py``); a tensor whose layout cannot be mapped is counted, not
compared.  Tensors are compared in the model's node order; the first beyond tolerance is
reported with the kernel, the ONNX nodes it covers, and the passes whose reports name them.
When that tensor is the output of a fused kernel, the kernel's checked variant
(``compiler/lowering/checked.py``: the same kernel with its intermediates exposed) is run on
the kernel's inputs and its intermediates compared too, so the divergence is named at the
node inside the kernel where it starts.  Re-running with ``disabled_passes`` confirms or
clears a suspect.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import helper

# absolute tolerance per unit of the tensor's largest magnitude (see _diverges)
SCALE_TOL = 1e-4
_TENSOR = re.compile(r"^n(\d+(?:x\d+)*)(?:_o(\d+))?$")


def _onnx_tensor(binding: str, model: onnx.ModelProto):
    """(node index, ONNX tensor name) that a kernel output binding holds, or None."""
    m = _TENSOR.match(binding)
    if not m:
        return None
    k = max(int(x) for x in m.group(1).split("x"))
    out = int(m.group(2) or 0)
    node = model.graph.node[k]
    if out >= len(node.output) or not node.output[out]:
        return None
    return k, node.output[out]


def _reference(model: onnx.ModelProto, names: list, feeds: dict, engine: str) -> dict:
    """Values of ``names`` (and the graph outputs) computed by the reference engine."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    types = {vi.name: vi for vi in list(m.graph.value_info) + list(m.graph.input)}
    for n in names:
        if n not in have:
            m.graph.output.append(types[n] if n in types else helper.make_empty_tensor_value_info(n))
    wanted = [o.name for o in m.graph.output]
    if engine == "reference":
        from onnx.reference import ReferenceEvaluator

        values = ReferenceEvaluator(m).run(None, feeds)
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        values = ort.InferenceSession(m.SerializeToString(), so,
                                      providers=["CPUExecutionProvider"]).run(None, feeds)
    return dict(zip(wanted, values))


def _diverges(ours: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> str:
    """Why ``ours`` differs from ``ref`` beyond tolerance ("" when it does not).

    An element differs when ``|ours - ref| > atol' + rtol * |ref|`` with
    ``atol' = max(atol, SCALE_TOL * max|ref|)``: a sum of K float32 products (a conv, a
    matmul) carries an absolute error that grows with the size of its terms, so an output
    near zero by cancellation (0.0017 from terms of order 1 in SqueezeNet's 3x3 convs)
    differs by ~1e-5 from a reference that summed in another order, while a wrong rewrite
    (x * 1.01) moves the tensor's large elements too."""
    if ours.shape != ref.shape:
        return f"shape {list(ours.shape)} vs reference {list(ref.shape)}"
    if ours.dtype.kind in "fc" or ref.dtype.kind in "fc":
        a, b = ours.astype(np.float64), np.asarray(ref, np.float64)
        finite = np.isfinite(b)
        scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
        tol = max(atol, SCALE_TOL * scale)
        bad = ~np.isclose(a, b, rtol=rtol, atol=tol, equal_nan=True)
    else:
        bad = ours != ref
    if not bad.any():
        return ""
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    diff = np.abs(ours.astype(np.float64) - np.asarray(ref, np.float64))
    return (f"{int(bad.sum())} of {bad.size} elements differ (max abs diff "
            f"{float(np.nanmax(np.where(bad, diff, 0))):.4g}); first at {list(idx)}: "
            f"{ours[idx]!r} vs reference {ref[idx]!r}")


def find_divergence(model, feeds: dict, compare: str = "onnxruntime", target="host",
                    disabled_passes=(), rtol: float = 1e-3, atol: float = 1e-5,
                    layout: str = "auto") -> dict:
    """Compile ``model`` (path or ModelProto), run it on ``feeds`` and the reference, and
    return {"first": divergence or None, "checked": [...], "unmappable": [...], ...}.

    ``first`` names the tensor, node and op where the divergence starts, the kernel and its
    ONNX nodes, why (counts, first index, values), and the passes that rewrote those nodes;
    when the node lies inside a fused kernel, ``kernel_output`` says which output of the
    kernel diverged."""
    from runtime.instruments import SessionOptions, run_checked

    from ..driver import compile_static
    from ..frontend.fold_onnx import fold_constants
    from ..frontend.loader import load_model
    from ..lowering.layouts import to_onnx_layout
    from ..specialize import specialize_model

    proto = load_model(model)
    spec = specialize_model(proto, {k: list(v.shape) for k, v in feeds.items()})
    cm = compile_static(spec, target=target, memory_reuse=False,
                        disabled_passes=disabled_passes, layout=layout)
    # the model as the compiler numbered its nodes (after ONNX-level constant folding)
    folded_proto = fold_constants(load_model(spec))[0]
    nodes = folded_proto.graph.node
    sess = cm.session(SessionOptions(bind_io=False))  # every tensor stays in the arena
    sess.run(None, feeds)
    graph = cm.meta["graph"]
    tensors = graph["tensors"]
    observed = []  # (node index, onnx tensor, our array, its layout, call)
    inside = []    # the ONNX tensors that checked variants can show
    for call in graph["calls"]:
        nin = len(call["args"]) - call["num_outputs"]
        for t in call["args"][nin:]:
            hit = _onnx_tensor(tensors[t]["name"], folded_proto)
            if hit:
                observed.append((hit[0], hit[1], sess._np[t].copy(), tensors[t].get("layout"),
                                 call))
        inside += [st["tensor"] for st in (call.get("checked") or {}).get("steps", [])
                   if st.get("tensor")]
    observed.sort(key=lambda o: o[0])
    ref = _reference(folded_proto, sorted({o[1] for o in observed} | set(inside)), feeds,
                     compare)
    by_pass = {}
    for p in cm.report["passes"]:
        for n in p.get("nodes", []):
            by_pass.setdefault(n, []).append(p["name"])

    def compare_one(ours, layout, name):
        want = np.asarray(ref[name])
        mapped = to_onnx_layout(ours, layout, want.shape)
        if mapped is None:
            return None
        return _diverges(mapped, want, rtol, atol)

    checked, unmappable, first = [], [], None
    for k, name, ours, lay, call in observed:
        why = compare_one(ours, lay, name)
        if why is None:
            unmappable.append({"tensor": name, "layout": lay, "shape": list(ours.shape)})
            continue
        checked.append({"tensor": name, "node": nodes[k].name, "layout": lay, "ok": not why})
        if why and first is None:
            first = {"tensor": name, "node": nodes[k].name or f"#{k}", "op": nodes[k].op_type,
                     "kernel": call["kernel"], "kernel_nodes": call["nodes"], "why": why,
                     "passes": sorted({p for n in call["nodes"] for p in by_pass.get(n, [])})}
            inner = _inside_kernel(call, sess, run_checked, compare_one)
            if inner is not None and inner["tensor"] != name:
                first = {**first, **inner,
                         "kernel_output": {"tensor": name, "node": first["node"], "why": why}}
    return {"first": first, "checked": checked, "unmappable": unmappable, "compare": compare,
            "disabled_passes": list(disabled_passes), "layout": cm.report["layout"],
            "observable": len(observed), "nodes": len(nodes)}


def _inside_kernel(call: dict, sess, run_checked, compare_one) -> dict | None:
    """The first intermediate of ``call``'s checked variant that diverges, as
    {tensor, node, op, why}; None without a variant or when none of them diverges."""
    checked = call.get("checked")
    if not checked:
        return None
    nin = len(call["args"]) - call["num_outputs"]
    inputs = [sess._np[i] for i in call["args"][:nin]]  # memory_reuse=False: still intact
    results = run_checked(call, inputs, sess._np, sess._kernels)
    for step, value in zip(checked["steps"], results):
        if not step.get("tensor"):
            continue
        why = compare_one(value, step.get("layout"), step["tensor"])
        if why:
            return {"tensor": step["tensor"], "node": step["node"], "op": step["op"], "why": why}
    return None
