"""fold_constants: op(constants) => constant."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import compiler
from tests.conftest import assert_close, ort_run


def _gemm(weight_is_constant: bool):
    """Gemm with transB=1: the importer emits permute_dims(B), foldable when B is constant."""
    b = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    inits = []
    if weight_is_constant:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 3]))
    g = helper.make_graph([helper.make_node("Gemm", ["x", "b"], ["y"], name="fc", transB=1)],
                          "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                     [2, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), b


def _report(cm):
    return next(p for p in cm.report["passes"] if p["name"] == "fold_constants")


def test_folds_constant_transpose():
    model, _ = _gemm(True)
    cm = compiler.compile(model)
    r = _report(cm)
    assert r["changed"] and r["rewrites"] == {"op(const) => const": 1}
    assert r["nodes"] == ["relax.permute_dims"]
    assert cm.report["kernels"] == 1  # the transpose no longer runs per inference
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    assert_close(cm.session().run(None, {"x": x}), ort_run(model, {"x": x}))


def test_disabled_leaves_the_transpose_and_stays_correct():
    model, _ = _gemm(True)
    cm = compiler.compile(model, disabled_passes=["fold_constants"])
    assert _report(cm)["skipped"] == "disabled"
    x = np.ones((2, 3), np.float32)
    assert_close(cm.session().run(None, {"x": x}), ort_run(model, {"x": x}))


def test_does_not_fire_when_weight_is_an_input():
    model, b = _gemm(False)
    cm = compiler.compile(model)
    assert not _report(cm)["changed"]
    x = np.ones((2, 3), np.float32)
    (y,) = cm.session().run(None, {"x": x, "b": b})
    np.testing.assert_allclose(y, x @ b.T, rtol=1e-5)
