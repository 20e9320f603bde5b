"""qdq_lookup_table: Q(f(DQ(x))) of one 8-bit tensor as a 256-entry table: the rewrite
count and the kernel it leaves, numerics against onnxruntime (within one quantization
step, mostly exact), and the chains it must leave alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import compiler
from passes.qdq_lookup_table import RULE


def _model(body, shape=(4, 96), dtype=TP.UINT8, extra=None):
    """x (float) -> Q -> DQ -> ``body`` nodes (reading "xd", writing "f") -> Q -> DQ -> y."""
    zero = 128 if dtype == TP.UINT8 else -3
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
             *body,
             helper.make_node("QuantizeLinear", ["f", "sy", "zy"], ["yq"], name="qy"),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], name="dqy")]
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "sx"),
             helper.make_tensor("zx", dtype, [], [zero]),
             numpy_helper.from_array(np.array(0.02, np.float32), "sy"),
             helper.make_tensor("zy", dtype, [], [zero // 2]),
             *(extra or [])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _const(name, v):
    return numpy_helper.from_array(np.array(v, np.float32), name)


GELU = ([helper.make_node("Div", ["xd", "sqrt2"], ["t0"]),
         helper.make_node("Erf", ["t0"], ["t1"]),
         helper.make_node("Add", ["t1", "one"], ["t2"]),
         helper.make_node("Mul", ["xd", "t2"], ["t3"]),
         helper.make_node("Mul", ["t3", "half"], ["f"])],
        [_const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)])

# EfficientNet's swish as onnxruntime's quantizer writes it: the sigmoid requantised
SWISH = ([helper.make_node("Sigmoid", ["xd"], ["s"]),
          helper.make_node("QuantizeLinear", ["s", "ss", "zs"], ["sq"]),
          helper.make_node("DequantizeLinear", ["sq", "ss", "zs"], ["sd"]),
          helper.make_node("Mul", ["xd", "sd"], ["f"])],
         [_const("ss", 1 / 256), helper.make_tensor("zs", TP.UINT8, [], [0])])


def _rewrites(cm) -> int:
    report = next(p for p in cm.report["passes"] if p["name"] == "qdq_lookup_table")
    return report["rewrites"].get(RULE, 0)


def _check(model, expect_rewrites):
    x = (np.random.default_rng(0).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]) * 2
         ).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cm = compiler.compile(model)
    got = cm.session().run(None, {"x": x})[0]
    assert _rewrites(cm) == expect_rewrites
    step = 0.02
    assert np.abs(got - want).max() <= step * 1.001
    assert (got == want).mean() > 0.99
    return cm


@pytest.mark.parametrize("dtype", [TP.UINT8, TP.INT8])
def test_gelu_between_quantizes_is_a_table(dtype):
    body, extra = GELU
    cm = _check(_model(body, dtype=dtype, extra=extra), 1)
    assert any("take" in k["kernel"] for k in cm.report["kernel_table"])
    assert not any("erf" in k["kernel"] for k in cm.report["kernel_table"])


def test_requantised_swish_is_one_table():
    body, extra = SWISH
    # two quantizes of x: the sigmoid's and the product's; each is a table of x
    _check(_model(body, extra=extra), 2)


@pytest.mark.parametrize("case", ["no_costly_op", "two_tensors", "per_channel"])
def test_left_alone(case):
    if case == "no_costly_op":      # DQ -> Relu -> Q: the requantisation passes' arithmetic
        model = _model([helper.make_node("Relu", ["xd"], ["f"])])
    elif case == "two_tensors":     # sigmoid(DQ(x)) * DQ(x2): a function of two tensors
        model = _model([helper.make_node("Sigmoid", ["xd"], ["s"]),
                        helper.make_node("Mul", ["s", "x"], ["f"])])
    else:                           # a per-channel constant: not one function for all
        model = _model([helper.make_node("Sigmoid", ["xd"], ["s"]),
                        helper.make_node("Mul", ["s", "w"], ["f"])],
                       extra=[_const("w", np.linspace(0.5, 2, 96))])
    _check(model, 0)


def test_blocked_conv_activations_keep_the_arithmetic():
    """With the graph converted to NCHW[b]c, a 4-D activation is not made a table (take
    has no blocked layout rule and does not fuse into a conv); NCHW makes it one."""
    body, extra = SWISH
    model = _model(body, shape=(1, 16, 6, 6), extra=extra)
    x = np.random.default_rng(1).standard_normal((1, 16, 6, 6)).astype(np.float32)
    blocked = compiler.compile(model, pass_config={"qdq_lookup_table": {"layout": "NCHWc"}})
    plain = compiler.compile(model, pass_config={"qdq_lookup_table": {"layout": "NCHW"}})
    assert _rewrites(blocked) == 0 and _rewrites(plain) == 2
    np.testing.assert_array_equal(blocked.session().run(None, {"x": x})[0],
                                  plain.session().run(None, {"x": x})[0])
