"""Numerics of compiled zoo models against onnxruntime: API, export + load."""

from __future__ import annotations

import numpy as np
import pytest

import runtime
from tests.conftest import SMALL, assert_close, compiled, ort_run, zoo, zoo_model


@pytest.mark.parametrize("name", list(SMALL))
def test_session_matches_onnxruntime(name):
    model = zoo_model(name)
    feeds = zoo.random_inputs(model, seed=1)
    assert_close(compiled(name).session().run(None, feeds), ort_run(model, feeds))


@pytest.mark.parametrize("name", list(SMALL))
def test_export_load_matches_onnxruntime(name, tmp_path):
    model = zoo_model(name)
    path = tmp_path / f"{name}.so"
    compiled(name).export(str(path))
    sess = runtime.load(str(path))
    feeds = zoo.random_inputs(model, seed=2)
    assert_close(sess.run(None, feeds), ort_run(model, feeds))


@pytest.mark.parametrize("name", ["cnn", "dwsep"])
def test_no_memory_reuse_matches_and_uses_more_memory(name):
    model = zoo_model(name)
    feeds = zoo.random_inputs(model, seed=3)
    cm = compiled(name, memory_reuse=False)
    mem = cm.report["memory"]
    assert mem["arena_bytes"] == mem["no_reuse_bytes"]
    assert mem["arena_bytes"] > compiled(name).report["memory"]["arena_bytes"]
    assert mem["inplace_outputs"] == 0
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds))


def test_report_has_design_keys():
    r = compiled("cnn").report
    for key in ("kernels", "passes", "memory", "compile_seconds", "target", "tuned_kernels",
                "untuned_kernels"):
        assert key in r
    assert set(r["memory"]) >= {"arena_bytes", "lower_bound_bytes", "no_reuse_bytes"}
    assert r["memory"]["lower_bound_bytes"] <= r["memory"]["arena_bytes"] <= \
        r["memory"]["no_reuse_bytes"]
    assert r["kernels"] == len(compiled("cnn").meta["graph"]["calls"]) > 0
    from compiler.pipeline import graph_passes

    assert [p["name"] for p in r["passes"]] == [p.name for p in graph_passes()]
    assert all({"name", "changed", "nodes"} <= set(p) for p in r["passes"])
    assert r["target"]["cpu"] and r["target"]["cores"] >= 1


def test_residual_add_runs_in_place():
    """dwsep ends in x + block(x): the Add may overwrite the block output's buffer."""
    assert compiled("dwsep").report["memory"]["inplace_outputs"] >= 1


def test_output_that_is_an_input_and_a_param(tmp_path):
    """Graph outputs that are graph inputs or initializers need no kernel."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    import compiler

    x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
    y, x_out, w_out = compiler.compile(m).session().run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(x_out, x)
    np.testing.assert_array_equal(w_out, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_int64_and_bool_tensors():
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Greater", ["a", "b"], ["gt"], name="gt"),
         helper.make_node("Add", ["a", "b"], ["sum"], name="add")], "g",
        [helper.make_tensor_value_info("a", TensorProto.INT64, [5]),
         helper.make_tensor_value_info("b", TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("gt", TensorProto.BOOL, [5]),
         helper.make_tensor_value_info("sum", TensorProto.INT64, [5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    import compiler

    a = np.array([1, 5, -3, 7, 0], dtype=np.int64)
    b = np.array([2, 4, -3, 1, 9], dtype=np.int64)
    sess = compiler.compile(m).session()
    assert [o.type for o in sess.get_outputs()] == ["tensor(bool)", "tensor(int64)"]
    gt, s = sess.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(gt, a > b)
    np.testing.assert_array_equal(s, a + b)
