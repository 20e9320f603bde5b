"""qdq_matmul_integer: QDQ MatMul (static quantisation) onto the integer matmul kernel:
structure (rewrite count, kernel rule, requantisation fused), numerics against
onnxruntime and exact arithmetic, and matmuls it must leave alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import compiler
from passes.qdq_matmul_integer import RULE


def qdq_model(m, k, n, wq, sw, zw, bias=True, w_input=False):
    """Q(x) -> DQ -> MatMul(., DQ(Wq, sw, zw, axis=1)) [-> + b] -> Q -> DQ (quantize_static's
    QDQ form, u8 activations)."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], name="dqw",
                              axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["y0"], name="mm")]
    inits = {"sx": np.array(0.02, np.float32), "zx": np.array(128, np.uint8), "sw": sw,
             "zw": zw, "sy": np.array(0.05, np.float32), "zy": np.array(120, np.uint8)}
    last = "y0"
    if bias:
        nodes.append(helper.make_node("Add", ["y0", "b"], ["y1"], name="bias"))
        inits["b"], last = rng.standard_normal(n).astype(np.float32), "y1"
    nodes += [helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["yq"], name="qy"),
              helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], name="dqy")]
    ins = [helper.make_tensor_value_info("x", TP.FLOAT, [m, k])]
    if w_input:
        ins.append(helper.make_tensor_value_info("wq", TP.INT8, [k, n]))
    else:
        inits["wq"] = wq
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TP.FLOAT, [m, n])],
                          [numpy_helper.from_array(np.asarray(v), name)
                           for name, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _pass(cm):
    return next(p for p in cm.report["passes"] if p["name"] == "qdq_matmul_integer")


@pytest.mark.parametrize("m,k,n,per_channel,bias", [
    (16, 64, 48, True, True),
    (7, 65, 100, False, True),       # odd K, N not whole panels
    (1, 128, 32, True, False),       # one row, no bias
])
def test_qdq_matmul_matches_ort_and_requantizes_in_the_kernel(m, k, n, per_channel, bias):
    rng = np.random.default_rng(0)
    # s8 weights in [-64, 64): onnxruntime's AVX2 u8 x s8 kernel saturates past that
    wq = rng.integers(-64, 64, (k, n)).astype(np.int8)
    sw = ((rng.random(n) * 0.01 + 0.002) if per_channel else np.array(0.006)).astype(np.float32)
    zw = np.zeros(n if per_channel else (), np.int8)
    model = qdq_model(m, k, n, wq, sw, zw, bias)
    x = rng.standard_normal((m, k)).astype(np.float32)
    cm = compiler.compile(model, target="host")
    rep = _pass(cm)
    assert rep["rewrites"] == {RULE: 1} and rep["nodes"] == ["mm"]
    rows = [r for r in cm.report["kernel_table"] if "mm" in r["nodes"]]
    assert len(rows) == 1 and rows[0]["rule"] == "cpu.matmul_int8"
    assert "qy" in rows[0]["nodes"]          # requantisation in the epilogue
    got = cm.session().run(None, {"x": x})[0]
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # at most one quantisation step (0.05) apart where float sums round differently
    assert np.abs(got - ref).max() <= 0.05 + 1e-6
    assert np.mean(got != ref) < 0.02


def test_full_range_weights_exact():
    rng = np.random.default_rng(1)
    m, k, n = 8, 64, 32
    wq = rng.integers(-127, 128, (k, n)).astype(np.int8)
    sw = (rng.random(n) * 0.01 + 0.002).astype(np.float32)
    model = qdq_model(m, k, n, wq, sw, np.zeros(n, np.int8), bias=False)
    x = rng.standard_normal((m, k)).astype(np.float32)
    # exact: the i16 pair path (vpmaddwd); u8 x s8 by fours would saturate like onnxruntime
    cm = compiler.compile(model, target="host", pass_config={"pack_int_matmul": {"exact": True}})
    got = cm.session().run(None, {"x": x})[0]
    xq = np.clip(np.round(x / np.float32(0.02)) + 128, 0, 255) - 128
    acc = (xq.astype(np.int64) @ wq.astype(np.int64)).astype(np.float32)
    y = acc * (np.float32(0.02) * sw)
    exact = (np.clip(np.round(y / np.float32(0.05)) + 120, 0, 255) - 120) * np.float32(0.05)
    assert np.abs(got - exact).max() <= 0.05 + 1e-6 and np.mean(got != exact) < 0.02


@pytest.mark.parametrize("per_channel", [True, False])
def test_qdq_gemm_trans_b_with_bias(per_channel):
    rng = np.random.default_rng(4)
    m, k, n = 5, 48, 24
    wq = rng.integers(-64, 64, (n, k)).astype(np.int8)           # Gemm's [N, K] weight
    sw = ((rng.random(n) * 0.01 + 0.002) if per_channel else np.array(0.005)).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], name="dqw",
                              axis=0),
             helper.make_node("Gemm", ["xd", "wd", "b"], ["y"], name="gemm", transB=1)]
    inits = {"sx": np.array(0.02, np.float32), "zx": np.array(128, np.uint8), "wq": wq,
             "sw": sw, "zw": np.zeros(n if per_channel else (), np.int8),
             "b": rng.standard_normal(n).astype(np.float32)}
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [m, n])],
                          [numpy_helper.from_array(np.asarray(v), name)
                           for name, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(model, target="host")
    assert _pass(cm)["rewrites"] == {RULE: 1}
    assert cm.report["schedules"].get("cpu.matmul_int8") == 1
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4,
                               atol=1e-4 * np.abs(ref).max())


def test_non_constant_weight_is_left_alone():
    rng = np.random.default_rng(2)
    wq = rng.integers(-64, 64, (32, 16)).astype(np.int8)
    model = qdq_model(4, 32, 16, wq, np.array(0.01, np.float32), np.array(0, np.int8),
                      w_input=True)
    cm = compiler.compile(model, target="host")
    assert _pass(cm)["changed"] is False
    x = rng.standard_normal((4, 32)).astype(np.float32)
    feeds = {"x": x, "wq": wq}
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(cm.session().run(None, feeds)[0] - ref).max() <= 0.05 + 1e-6
