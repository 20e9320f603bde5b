"""compiler/lowering/graph.py: the kernel graph extracted from the lowered module, and its
storage plan (in-place reuse, reshape views, concats by placement, the planner's bounds)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import compiler
import runtime
from compiler.driver import lower_to_kernels
from compiler.lowering.graph import plan_storage
from runtime.instruments import inplace_inputs
from tests.conftest import assert_close, ort_run, zoo_model
from tests.passes.helpers import model, node
from tests.passes.test_place_concat import RNG, dense_block, negatives

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

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
    assert len(meta["calls"]) == len(graph.calls) and len(meta["params_payload"])
    graph2, _ = lower_to_kernels(zoo_model("cnn"), HOST)
    _, flat = plan_storage(graph2, reuse=False)
    assert flat.arena_bytes == flat.no_reuse_bytes >= plan.arena_bytes


# -- concat by placement (place_concats, passes/place_concat.py) -------------------------
def _out_of(graph, node: str) -> int:
    """The tensor the last call covering ONNX node ``node`` writes (after a layout
    transform the stem's output takes on the way to the block)."""
    return [c["args"][-1] for c in graph.calls if node in c["nodes"]][-1]


def _arena_span(meta, plan, t: int) -> tuple:
    tt = meta["tensors"][t]
    start = plan.offsets[tt["index"]] + tt.get("offset", 0)
    return start, start + int(np.prod(tt["shape"])) * np.dtype(tt["dtype"]).itemsize


def test_dense_block_concats_have_no_kernel_and_share_one_buffer():
    """DenseNet's block: every concat is a prefix of one buffer [x0 | f1 | f2 | f3] that the
    stem and the convs write in place; BN + Relu run over it as their own kernels."""
    graph, prim_funcs = lower_to_kernels(dense_block(), HOST)
    assert not any("Concat" in c["ops"] for c in graph.calls)
    assert not any("concat" in k for k in prim_funcs)
    assert [p["nodes"] for p in graph.concats["placed"]] == [["cat1"], ["cat2"], ["catL"]]
    assert graph.concats["kernels"] == []
    meta, plan = plan_storage(graph)
    assert plan.overlaps() == [] and [p["inputs"] for p in meta["placed_concats"]] == [2, 3, 4]
    leaves = [_out_of(graph, n) for n in ("stem", "conv1", "conv2", "conv3")]
    spans = [_arena_span(meta, plan, t) for t in leaves]
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))   # back to back, in order
    assert len({meta["tensors"][t]["index"] for t in leaves}) == 1
    # the concat outputs are the prefixes, read by the BN + Relu kernels
    for name, n in (("m1", 2), ("m2", 3)):
        call = next(c for c in graph.calls if name in c["nodes"])
        cat = next(a for a in call["args"][:-1] if meta["tensors"][a]["storage"] == "arena")
        assert _arena_span(meta, plan, cat) == (spans[0][0], spans[n - 1][1])
    # no kernel reads storage that it writes (what a NaN check would save first)
    assert all(not ins for ins in inplace_inputs(meta))


def _two_concats(second: list, sizes=(8, 8, 8), hw: int = 4):
    """c1 = concat(f1, f2); c2 = concat(``second``); y = conv1x1(relu(c1)) +
    conv1x1(relu(c2)), f_k convs of x (``hw`` x ``hw`` pixels) with ``sizes`` channels."""
    nodes = [helper.make_node("Conv", ["x", f"w{k}"], [f"f{k}"], name=f"f{k}", pads=[1] * 4)
             for k in (1, 2, 3)]
    inits = {f"w{k}": (RNG.standard_normal((c, 4, 3, 3)) * 0.3).astype(np.float32)
             for k, c in zip((1, 2, 3), sizes)}
    size = dict(zip(("f1", "f2", "f3"), sizes))
    inits["v1"] = (RNG.standard_normal((8, sizes[0] + sizes[1], 1, 1)) * 0.3).astype(np.float32)
    inits["v2"] = (RNG.standard_normal((8, sum(size[f] for f in second), 1, 1)) * 0.3
                   ).astype(np.float32)
    nodes += [node("Concat", ["f1", "f2"], "c1", axis=1), node("Concat", second, "c2", axis=1),
              node("Relu", ["c1"], "r1"), node("Relu", ["c2"], "r2"),
              helper.make_node("Conv", ["r1", "v1"], ["p1"], name="p1"),
              helper.make_node("Conv", ["r2", "v2"], ["p2"], name="p2"),
              node("Add", ["p1", "p2"], "y")]
    return model(nodes, {"x": [1, 4, hw, hw]}, {"y": [1, 8, hw, hw]}, inits)


def _runs_as_onnxruntime(m):
    x = RNG.standard_normal([d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
                            ).astype(np.float32)
    cm = compiler.compile(m)  # this host: it runs here
    assert_close(cm.session().run(None, {"x": x}), ort_run(m, {"x": x}))
    return cm


def test_tensor_at_two_offsets_keeps_a_concat_kernel():
    """concat(f1, f2) and concat(f2, f1): f1 cannot start both buffers; the second stays a
    kernel (unfused), and the numbers are onnxruntime's."""
    m = _two_concats(["f2", "f1"])
    graph, _ = lower_to_kernels(m, HOST)
    (kept,) = graph.concats["kernels"]
    assert kept["nodes"] == ["c2"] and "two offsets" in kept["reason"]
    assert [p["nodes"] for p in graph.concats["placed"]] == [["c1"]]
    assert sum(c["ops"] == "Concat" for c in graph.calls) == 1
    cm = _runs_as_onnxruntime(m)
    assert cm.memory_plan.overlaps() == []


def test_overlapping_leaves_keep_a_concat_kernel():
    """concat(f1, f2) and concat(f3, f2) with f1, f3 of one size: both would sit before f2."""
    m = _two_concats(["f3", "f2"])
    graph, _ = lower_to_kernels(m, HOST)
    (kept,) = graph.concats["kernels"]
    assert kept["nodes"] == ["c2"] and "overlap" in kept["reason"]
    _runs_as_onnxruntime(m)


def test_shared_input_at_consistent_offsets_is_placed():
    """concat(f1, f2) and concat(f1, f2, f3): the first is a prefix of the second."""
    m = _two_concats(["f1", "f2", "f3"])
    graph, _ = lower_to_kernels(m, HOST)
    assert graph.concats["kernels"] == [] and len(graph.concats["placed"]) == 2
    _runs_as_onnxruntime(m)


def test_refused_by_the_pass_fuse_as_before():
    """The pass's negatives (inner axis with N=2, graph input, constant, model output, ...)
    reach extraction as ordinary fused concats: nothing placed, same numbers.  NCHW: in a
    blocked layout (8 channels take half blocks on AVX-512) a transform follows the concat,
    which then is no model output any more."""
    for why, m in negatives().items():
        graph, _ = lower_to_kernels(m, HOST, layout="NCHW")
        assert graph.concats["placed"] == [] and graph.placed == {}, why


def test_placed_artifact_loads_without_the_compiler(tmp_path, pytestconfig):
    """The .so runs in a process that imports runtime only; profiling and NaN checks run
    over the placed buffer (the concat has no call of its own: its consumers read it)."""
    if pytestconfig.getoption("--fake-host"):  # the child process sees the real host
        pytest.skip("compile-only (fabricated host): the test runs the .so in a child process")
    m = dense_block()
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    path = compiler.compile(m).export(str(tmp_path / "dense.so"))
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, runtime, numpy as np\n"
            f"s = runtime.load({path!r}, runtime.SessionOptions(check_nan=True))\n"
            "np.save('y.npy', s.run(None, {'x': np.load('x.npy')})[0])\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('compiler', 'passes')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": ROOT})
    assert_close([np.load(tmp_path / "y.npy")], ort_run(m, {"x": x}))
    sess = runtime.load(path, runtime.SessionOptions(enable_profiling=True))
    assert_close(sess.run(None, {"x": x}), ort_run(m, {"x": x}))
    summary = sess.profile_summary()
    assert "3 Concat nodes by placement, no kernel call" in summary
    assert summary.endswith("cat1, cat2, catL")


def test_kv_cache_appended_in_place_shares_the_input_buffer():
    """place_kv_caches: the past input is stored sequence-major (perm [1, 2, 0, 3] on its
    entry, no transpose call), present is a view of its buffer at offset 0 and the new rows
    one at byte P * row (an expression of the dims), the buffer sized for present at the
    maxima; neither the input permute nor the append is a call."""
    from tests.passes.test_seq_major_cache import DIMS, D, H, attention

    cm = compiler.compile(attention(), dims=DIMS)
    g = cm.session().graph
    tensors = g["tensors"]
    (past,) = [i for i in g["inputs"] if i["name"] == "past"]
    (present,) = [o for o in g["outputs"] if o["name"] == "present"]
    assert past["perm"] == present["perm"] == [1, 2, 0, 3]
    assert tensors[past["tensor"]]["shape"] == ["past", 1, H, D]
    buf = tensors[past["tensor"]]["index"]
    assert tensors[present["tensor"]]["index"] == buf and "offset" not in tensors[present["tensor"]]
    rows = [t for t in tensors if t["storage"] == "arena" and t["index"] == buf
            and isinstance(t.get("offset"), str)]
    assert len(rows) == 1 and "past" in rows[0]["offset"]
    assert rows[0]["shape"] == ["seq", 1, H, D]
    assert g["buffers"][buf]["nbytes"] == (16 + 4) * H * D * 4  # present at past + seq max
    assert g["kv_caches"] == [{"input": "past", "output": "present", "nodes": ["present"]}]
    assert not any(c["kernel"].startswith(("kv_past", "kv_append")) for c in g["calls"])
    # the new rows' producer writes them into the cache: its output is that view
    assert any(t["name"] == rows[0]["name"] for c in g["calls"]
               for t in [tensors[a] for a in c["args"][len(c["args"]) - c["num_outputs"]:]])
