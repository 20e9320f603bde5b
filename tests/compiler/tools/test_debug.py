"""Divergence bisection finds the first wrong tensor and the pass that rewrote it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

import compiler.driver
from compiler.registry import REGISTRY, previous, register_op
from compiler.tools.debug import find_divergence
from passes.context import GraphPass
from tests.conftest import zoo


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


# -- layouts: every tensor is compared in the ONNX layout -------------------------------------
@pytest.mark.parametrize("layout", ["NCHW", "NCHWc", "NHWC", "auto"])
def test_healthy_conv_model_has_no_divergence_in_any_layout(layout):
    model = zoo.build("cnn", image=16)
    r = find_divergence(model, zoo.random_inputs(model), layout=layout)
    assert r["first"] is None and not r["unmappable"]
    assert len(r["checked"]) >= 10 and all(c["ok"] for c in r["checked"])
    mapped = [c for c in r["checked"] if c["layout"]]
    if layout == "NCHW":
        assert not mapped
    else:  # the conv outputs were compared after mapping back, not skipped
        assert len(mapped) >= 5 and r["layout"]["convs_converted"] >= 4
        assert {c["layout"] for c in mapped} <= {"NHWC", f"NCHW{r['layout']['block']}c"}


def _conv_chain(channels=16, image=16):
    """Conv -> Relu -> Sqrt -> Neg: one fused kernel whose middle node is not observable."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(
        rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.2, "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="act"),
         helper.make_node("Sqrt", ["r"], ["s"], name="root"),
         helper.make_node("Neg", ["s"], ["y"], name="neg")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, image, image])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, image, image])],
        [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(1).standard_normal((1, channels, image, image)).astype(np.float32)
    return model, {"x": x}


def test_nhwc_with_equal_dims_is_mapped_not_compared_as_is():
    """[1, 16, 16, 16] has the same shape in NHWC and NCHW: only the recorded layout tells."""
    model, feeds = _conv_chain(16, 16)
    r = find_divergence(model, feeds, layout="NHWC")
    assert r["first"] is None and r["layout"]["chosen"] == "NHWC"
    assert any(c["layout"] == "NHWC" for c in r["checked"])


@pytest.fixture
def broken_sqrt():
    """Sqrt's converter replaced through the registry by sqrt(x) * 1.01."""

    @register_op("", "Sqrt", override=True)
    def wrong_sqrt(bb, inputs, attrs, ctx):
        """sqrt(x) * 1.01: a deliberately wrong converter."""
        value = previous(wrong_sqrt)(bb, inputs, attrs, ctx)
        return relax.op.multiply(value, relax.const(1.01, "float32"))

    yield
    for versions in REGISTRY.entries.values():
        for e in list(versions):
            if e.converter is wrong_sqrt:
                versions.remove(e)


@pytest.mark.parametrize("layout", ["NCHW", "NCHWc", "NHWC"])
def test_divergence_inside_a_fused_kernel_names_the_node(broken_sqrt, layout):
    model, feeds = _conv_chain()
    r = find_divergence(model, feeds, layout=layout)
    f = r["first"]
    assert f is not None and f["kernel_nodes"] == ["conv", "act", "root", "neg"]
    # the kernel's only observable output is Neg's; its checked variant shows the Sqrt
    assert (f["node"], f["op"], f["tensor"]) == ("root", "Sqrt", "s")
    assert f["kernel_output"]["tensor"] == "y" and f["kernel_output"]["node"] == "neg"


def test_clean_conv_chain_has_no_divergence_inside_kernels():
    model, feeds = _conv_chain()
    assert find_divergence(model, feeds, layout="NCHWc")["first"] is None


def test_cli_debug_names_the_node_inside_the_kernel(broken_sqrt, tmp_path):
    """In process (the override lives in this process's registry)."""
    import onnx

    from compiler import cli

    model, feeds = _conv_chain()
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", feeds["x"])
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["debug", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                       "--layout", "NCHWc"])
    text = out.getvalue()
    assert rc == 1, text
    assert "first divergence: tensor 's' = output of node 'root' (Sqrt)" in text
    assert "inside kernel" in text and "'y' (node 'neg')" in text


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["NCHWc", "NHWC"])
def test_squeezenet_is_compared_in_the_onnx_layout(layout):
    """Issue #17's false alarm: NCHW8c/16c tensors (the classifier's channels padded to whole
    blocks) were compared as they are with the NCHW reference."""
    model = zoo.build("squeezenet", image=64)
    r = find_divergence(model, zoo.random_inputs(model), layout=layout)
    assert r["first"] is None and not r["unmappable"] and len(r["checked"]) >= 30
    assert sum(bool(c["layout"]) for c in r["checked"]) >= 20
