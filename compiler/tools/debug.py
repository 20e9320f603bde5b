"""Divergence bisection: the first ONNX tensor where onnxc and a reference disagree.

The model is compiled without memory reuse, so every kernel output keeps its own buffer
and can be read after the run.  A kernel output whose binding is tagged with an ONNX node
(``n<k>``, ``n<k>_o<i>``, ``n2x3`` for what a pass fused; see compiler/lowering/provenance.py) *is*
that node's output tensor.  The reference (onnxruntime with graph optimisations off, or
``onnx.reference``) is run on the same model with those tensors added as graph outputs.
Tensors are compared in the model's node order; the first beyond tolerance is reported
with the kernel, the ONNX nodes it covers, and the passes whose reports name them.
Re-running with ``disabled_passes`` confirms or clears a suspect.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import helper

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
    if ours.shape != ref.shape:
        return f"shape {list(ours.shape)} vs reference {list(ref.shape)}"
    if ours.dtype.kind in "fc" or ref.dtype.kind in "fc":
        a, b = ours.astype(np.float64), np.asarray(ref, np.float64)
        bad = ~np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
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
                    disabled_passes=(), rtol: float = 1e-3, atol: float = 1e-5) -> dict:
    """Compile ``model`` (path or ModelProto), run it on ``feeds`` and the reference, and
    return {"first": divergence or None, "checked": [...], "unobservable": n, ...}."""
    from ..driver import compile_static
    from ..frontend.fold_onnx import fold_constants
    from ..frontend.loader import load_model
    from ..specialize import specialize_model

    proto = load_model(model)
    spec = specialize_model(proto, {k: list(v.shape) for k, v in feeds.items()})
    cm = compile_static(spec, target=target, memory_reuse=False,
                        disabled_passes=disabled_passes)
    # the model as the compiler numbered its nodes (after ONNX-level constant folding)
    folded_proto = fold_constants(load_model(spec))[0]
    sess = cm.session()
    sess.run(None, feeds)
    graph = cm.meta["graph"]
    observed = []  # (node index, onnx tensor, our array, call)
    for call in graph["calls"]:
        nin = len(call["args"]) - call["num_outputs"]
        for t in call["args"][nin:]:
            hit = _onnx_tensor(graph["tensors"][t]["name"], folded_proto)
            if hit:
                observed.append((hit[0], hit[1], sess._np[t].copy(), call))
    observed.sort(key=lambda o: o[0])
    ref = _reference(folded_proto, [o[1] for o in observed], feeds, compare)
    by_pass = {}
    for p in cm.report["passes"]:
        for n in p.get("nodes", []):
            by_pass.setdefault(n, []).append(p["name"])
    checked, first = [], None
    for k, name, ours, call in observed:
        why = _diverges(ours, np.asarray(ref[name]), rtol, atol)
        checked.append({"tensor": name, "node": folded_proto.graph.node[k].name,
                        "ok": not why})
        if why and first is None:
            nodes = call["nodes"]
            first = {"tensor": name, "node": folded_proto.graph.node[k].name or f"#{k}",
                     "op": folded_proto.graph.node[k].op_type, "kernel": call["kernel"],
                     "kernel_nodes": nodes, "why": why,
                     "passes": sorted({p for n in nodes for p in by_pass.get(n, [])})}
    return {"first": first, "checked": checked, "compare": compare,
            "disabled_passes": list(disabled_passes),
            "observable": len(observed), "nodes": len(folded_proto.graph.node)}

