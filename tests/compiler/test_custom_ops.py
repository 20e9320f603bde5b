"""Custom operators: register, compile, run, export; load without the registration."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
import examples.custom_ops  # noqa: F401  (registers com.example ops)
from compiler.registry import REGISTRY, OperatorRegistry, OpEntry, register_op
from tests.conftest import REPO


def _model(op="SoftmaxV2", shape=(2, 5), **attrs):
    g = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], name="custom0", domain="com.example", **attrs)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.example", 1)])


def _softmax64(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_v2_stable_on_huge_logits():
    x = np.array([[1e4, 0, -1e4, 1e4 - 1, 3], [-5, -5, -5, -5, -5]], np.float32)
    (y,) = compiler.compile(_model()).session().run(None, {"x": x})
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, _softmax64(x), rtol=1e-5, atol=1e-7)


def test_softmax_v2_axis_attribute():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (y,) = compiler.compile(_model(shape=(3, 4), axis=0)).session().run(None, {"x": x})
    np.testing.assert_allclose(y, _softmax64(x, axis=0), rtol=1e-5, atol=1e-7)


def test_kernel_names_the_custom_node():
    calls = compiler.compile(_model()).meta["graph"]["calls"]
    assert all(c["nodes"] == ["custom0"] for c in calls) and calls


def test_te_custom_op():
    x = np.linspace(-4, 4, 10, dtype=np.float32).reshape(2, 5)
    (y,) = compiler.compile(_model("Swish", beta=2.0)).session().run(None, {"x": x})
    np.testing.assert_allclose(y, x / (1 + np.exp(-2 * x)), rtol=1e-5, atol=1e-6)


def test_artifact_loads_without_the_registration(tmp_path):
    compiler.compile(_model()).export(str(tmp_path / "m.so"))
    code = ("import sys, numpy as np, runtime\n"
            f"s = runtime.load({str(tmp_path / 'm.so')!r})\n"
            "(y,) = s.run(None, {'x': np.zeros((2, 5), np.float32)})\n"
            "assert np.allclose(y, 0.2)\n"
            "assert 'examples.custom_ops' not in sys.modules and 'compiler' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_registry_entry_and_ops_listing():
    e = REGISTRY.lookup("com.example", "SoftmaxV2", 1)
    assert e.implementation == "custom" and "stable" in e.doc
    r = subprocess.run([sys.executable, "-c", "import examples.custom_ops, sys; "
                        "from compiler.cli import main; sys.exit(main(['ops']))"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0
    assert any("SoftmaxV2" in ln and "com.example" in ln for ln in r.stdout.splitlines())


def test_opset_ranges_and_override():
    reg = OperatorRegistry()
    reg.add(OpEntry("com.acme", "Op", 1, 3, lambda *a: None, implementation="v1"))
    reg.add(OpEntry("com.acme", "Op", 4, None, lambda *a: None, implementation="v4"))
    assert reg.lookup("com.acme", "Op", 2).implementation == "v1"
    assert reg.lookup("com.acme", "Op", 9).implementation == "v4"
    register_op("com.acme", "Op", since=2, until=2, registry=reg, override=True)(lambda *a: None)
    assert reg.lookup("com.acme", "Op", 2).implementation == "custom"  # the override wins
    assert reg.lookup("com.acme", "Op", 0) is None


def test_opset_outside_range_is_reported():
    m = _model()
    m.opset_import[1].version = 0
    with pytest.raises(compiler.UnsupportedError, match=r"opset 0 is outside 1\+"):
        compiler.compile(m)


def test_converter_error_names_the_node():
    @register_op("com.broken", "Boom")
    def boom(bb, inputs, attrs, ctx):
        raise ValueError("cannot handle this input")

    g = helper.make_graph([helper.make_node("Boom", ["x"], ["y"], name="boom_node",
                                            domain="com.broken")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.broken", 1)])
    with pytest.raises(compiler.CompileError,
                       match=r"node 'boom_node' \(Boom, domain com.broken, opset 1\): "
                             r"conversion failed: cannot handle this input"):
        compiler.compile(m)
