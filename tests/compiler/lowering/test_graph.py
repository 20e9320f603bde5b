"""compiler/lowering/graph.py: the kernel graph extracted from the lowered module, and its
storage plan (in-place reuse, reshape views, the planner's bounds)."""

from __future__ import annotations

from compiler.driver import lower_to_kernels
from compiler.lowering.graph import plan_storage
from tests.conftest import zoo_model

HOST = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 2}


def test_mlp_extracts_calls_in_order_over_inputs_params_and_intermediates():
    graph, prim_funcs = lower_to_kernels(zoo_model("mlp"), HOST)
    assert graph.calls and set(c["kernel"] for c in graph.calls) <= set(prim_funcs)
    kinds = {t.kind for t in graph.tensors}
    assert kinds == {"input", "param", "intermediate"}
    (name, tid), = graph.inputs
    assert graph.tensors[tid].kind == "input" and graph.tensors[tid].shape[0] == 4
    # every call's arguments are known tensors, and a call only reads what exists by then
    produced = {tid} | {i for i, t in enumerate(graph.tensors) if t.kind == "param"}
    for c in graph.calls:
        n_in = len(c["args"]) - c["num_outputs"]
        assert all(a in produced or graph.tensors[a].base in produced for a in c["args"][:n_in])
        produced.update(c["args"][n_in:])
    assert all(tid in produced for _, tid in graph.outputs)
    # ONNX provenance: every call names the nodes it computes
    assert all(c["nodes"] for c in graph.calls)


def test_plan_storage_bounds_and_no_reuse():
    graph, _ = lower_to_kernels(zoo_model("cnn"), HOST)
    meta, plan = plan_storage(graph, reuse=True)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.no_reuse_bytes
    assert len(meta["calls"]) == len(graph.calls) and meta["params_payload"]
    graph2, _ = lower_to_kernels(zoo_model("cnn"), HOST)
    _, flat = plan_storage(graph2, reuse=False)
    assert flat.arena_bytes == flat.no_reuse_bytes >= plan.arena_bytes
