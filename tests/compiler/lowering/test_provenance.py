"""ONNX node names reach the kernels that compute them (profiles, errors, NaN checks)."""

from __future__ import annotations

import pytest

from tests.conftest import SMALL, compiled, zoo_model


@pytest.mark.parametrize("name", list(SMALL))
def test_every_kernel_names_its_nodes(name):
    calls = compiled(name).meta["graph"]["calls"]
    assert calls and all(c["nodes"] for c in calls), [c["kernel"] for c in calls if not c["nodes"]]
    known = {n.name for n in zoo_model(name).graph.node}
    assert all(set(c["nodes"]) <= known for c in calls)


@pytest.mark.parametrize("name", list(SMALL))
def test_computing_nodes_are_covered_once(name):
    """Every node that computes something at run time is in exactly one kernel call (a
    split transpose in two) (Flatten/Reshape are views, and constant subgraphs fold away).  Layout transforms that
    convert_layout inserted name the node whose output (or input) they convert, and are
    not counted as computing it.  A concat by placement (no kernel: its inputs are written
    inside its output's buffer) is covered by its ``placed_concats`` entry instead."""
    graph = compiled(name).meta["graph"]
    calls = graph["calls"]
    covered = [n for c in calls if "layout_transform" not in c["kernel"] for n in c["nodes"]]
    covered += [n for p in graph.get("placed_concats", []) for n in p["nodes"]]
    # a K transpose that also moves the heads is split by fold_transpose_matmul: the heads'
    # permutation a copy, the last two axes' swap read by the scores matmul; both name it
    ops = {n.name: n.op_type for n in zoo_model(name).graph.node}
    twice = [n for n in set(covered) if covered.count(n) > 1]
    assert all(ops.get(n) == "Transpose" and covered.count(n) == 2 for n in twice), twice
    views = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Constant"}
    must = {n.name for n in zoo_model(name).graph.node if n.op_type not in views}
    assert must <= set(covered), sorted(must - set(covered))


def test_fused_kernel_names_all_its_nodes():
    calls = compiled("cnn").meta["graph"]["calls"]
    add_relu = next(c for c in calls if "res.add" in c["nodes"])
    # conv2 + its folded BN + the residual Add + Relu: one kernel (graph passes)
    assert add_relu["nodes"] == ["res.conv2", "res.bn2", "res.add", "res.relu2"]
    assert add_relu["ops"] == "Add+BatchNormalization+Conv+Relu"
    shared = [c for c in calls if c["kernel"] == add_relu["kernel"]]
    assert len(shared) == 1
    # one kernel function serving several call sites still names each site's own nodes
    by_kernel: dict = {}
    for c in calls:
        by_kernel.setdefault(c["kernel"], []).append(tuple(c["nodes"]))
    reused = [v for v in by_kernel.values() if len(v) > 1]
    assert reused and all(len(set(v)) == len(v) for v in reused)
