"""Divergence bisection finds the first wrong tensor and the pass that rewrote it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

import compiler.driver
from compiler.tools.debug import find_divergence
from passes.context import GraphPass


def _model():
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Relu", ["h"], ["r"], name="act"),
         helper.make_node("MatMul", ["r", "w2"], ["z"], name="fc2"),
         helper.make_node("Softmax", ["z"], ["y"], name="probs", axis=-1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


class _BrokenRelu(GraphPass):
    """relu(x) => relu(x) * 1.01: a deliberately wrong rewrite."""

    name = "broken_relu"

    def rewrite(self, mod, report, options):
        @mutator
        class _M(PyExprMutator):
            def visit_var_binding_(self, b):
                value = self.visit_expr(b.value)
                if isinstance(value, relax.Call) and getattr(value.op, "name", "") == \
                        "relax.nn.relu":
                    inner = self.builder_.emit(value, name_hint=b.var.name + "_1")
                    value = relax.op.multiply(inner, relax.const(1.01, "float32"))
                    report.rewrites["relu => relu*1.01"] = 1
                    report.nodes.append("act")
                var = self.builder_.emit(value, name_hint=b.var.name)
                self.set_var_remap(b.var, var)

        mod["main"] = _M(mod).visit_expr(mod["main"])
        return mod


@pytest.fixture
def broken_pipeline(monkeypatch):
    original = compiler.driver.graph_passes
    monkeypatch.setattr(compiler.driver, "graph_passes", lambda: original() + [_BrokenRelu()])


FEEDS = {"x": np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)}


def test_clean_model_has_no_divergence():
    r = find_divergence(_model(), FEEDS)
    assert r["first"] is None and r["checked"] and all(c["ok"] for c in r["checked"])


@pytest.mark.parametrize("compare", ["onnxruntime", "reference"])
def test_finds_the_broken_pass(broken_pipeline, compare):
    r = find_divergence(_model(), FEEDS, compare=compare)
    f = r["first"]
    assert f is not None and f["node"] == "act" and f["op"] == "Relu" and f["tensor"] == "r"
    assert "broken_relu" in f["passes"] and "act" in f["kernel_nodes"]


def test_disabling_the_suspect_confirms_it(broken_pipeline):
    assert find_divergence(_model(), FEEDS, disabled_passes=["broken_relu"])["first"] is None


def test_cli_debug_exit_codes(tmp_path):
    import subprocess
    import sys

    import onnx

    onnx.save(_model(), tmp_path / "m.onnx")
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "debug", tmp_path / "m.onnx"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "no divergence" in r.stdout, r.stderr
