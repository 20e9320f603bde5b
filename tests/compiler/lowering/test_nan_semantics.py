"""NaN / Inf semantics against onnxruntime (issue #17): compiler/lowering/legalize_nan.py
and the Clip / Max / Min converters (compiler/frontend/converters/math.py).

Single-op models are fed NaN, +-Inf, -0.0, denormals and ordinary values and compared
element-wise with onnxruntime: NaN positions equal, values close elsewhere, the sign of
zero where onnxruntime is consistent (Relu, Clip, LeakyRelu, PRelu, Elu, Selu,
ThresholdedRelu, Sign, Tanh, Atanh).

What onnxruntime 1.32 was measured to do (the reference where the spec is silent):
Relu / LeakyRelu / PRelu / HardSigmoid / HardSwish / Softplus / Elu / Selu / Celu keep NaN;
Clip keeps a NaN x, treats a NaN bound as no bound, and an absent bound as the finite
extreme (Clip(inf) with no max = 3.4028235e38, as the spec's default says); Max / Min
propagate a NaN from either operand.  ReduceMax/Min and ArgMax/Min fold as ``std::max``
(a leading NaN wins, a later one is skipped: tests/compiler/lowering/
test_legalize_reductions.py); MaxPool keeps a NaN by its position in the window (tests/
compiler/lowering/test_legalize_pool.py).  Here those are compared on NaN-free inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from tvm import relax

import compiler
from tests.conftest import ort_run
from tests.nan_helpers import (F, I64, assert_nan_equal, check_against_ort, legalized_text,
                                node_model)
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40, 1.5, -1.5, 3.0, -3.0,
                    0.25, np.nan, 7.0, -7.0, 0.5], dtype=np.float32)
OTHER = np.array([1.0, np.nan, 2.0, np.nan, -0.0, 0.0, np.nan, 1.0, -2.0, np.inf, -np.inf,
                  0.0, np.nan, 8.0, -8.0, 0.5], dtype=np.float32)
NO_NAN = np.where(np.isnan(SPECIAL), np.float32(-0.5), SPECIAL)


def _scalar(v):
    return np.array(v, np.float32)


X4 = SPECIAL.reshape(4, 4)
# (id, op, feeds, initializers, input names (None: feeds then inits), attributes, zero sign)
CASES = [
    ("relu", "Relu", {"x": SPECIAL}, None, None, {}, True),
    ("leaky_relu", "LeakyRelu", {"x": SPECIAL}, None, None, {"alpha": 0.1}, True),
    ("prelu", "PRelu", {"x": SPECIAL}, {"s": np.float32([0.2])}, None, {}, True),
    ("clip", "Clip", {"x": SPECIAL}, {"lo": _scalar(-1), "hi": _scalar(1)}, None, {}, True),
    ("clip_nan_min_const", "Clip", {"x": SPECIAL}, {"lo": _scalar(np.nan), "hi": _scalar(1)},
     None, {}, True),
    ("clip_nan_max_const", "Clip", {"x": SPECIAL}, {"lo": _scalar(-1), "hi": _scalar(np.nan)},
     None, {}, True),
    ("clip_nan_min_fed", "Clip", {"x": SPECIAL, "lo": _scalar(np.nan)}, None, None, {}, True),
    ("clip_nan_max_fed", "Clip", {"x": SPECIAL, "lo": _scalar(-1), "hi": _scalar(np.nan)},
     None, None, {}, True),
    ("clip_fed_bounds", "Clip", {"x": SPECIAL, "lo": _scalar(-2), "hi": _scalar(2)},
     None, None, {}, True),
    ("clip_no_bounds", "Clip", {"x": SPECIAL}, None, None, {}, True),
    ("clip_max_only", "Clip", {"x": SPECIAL}, {"hi": _scalar(0.5)}, ["x", "", "hi"], {}, True),
    ("max", "Max", {"a": SPECIAL, "b": OTHER}, None, None, {}, False),
    ("min", "Min", {"a": SPECIAL, "b": OTHER}, None, None, {}, False),
    ("max_three_broadcast", "Max", {"a": X4, "b": OTHER[:4], "c": SPECIAL[::-1].reshape(4, 4)},
     None, None, {}, False),
    ("hard_sigmoid", "HardSigmoid", {"x": SPECIAL}, None, None, {}, False),
    ("hard_swish", "HardSwish", {"x": SPECIAL}, None, None, {}, False),
    ("softplus", "Softplus", {"x": SPECIAL}, None, None, {}, False),
    ("elu", "Elu", {"x": SPECIAL}, None, None, {}, True),
    ("selu", "Selu", {"x": SPECIAL}, None, None, {}, True),
    ("prelu_negative_channel_slopes", "PRelu", {"x": SPECIAL.reshape(1, 4, 2, 2)},
     {"s": np.float32([-0.5, 0.25, -2.0, 1.0]).reshape(4, 1, 1)}, None, {}, True),
    ("prelu_fed_last_axis_slopes", "PRelu", {"x": X4, "s": np.float32([-0.5, 0.5, -1, 2])},
     None, None, {}, True),
    ("thresholded_relu", "ThresholdedRelu", {"x": SPECIAL}, None, None, {"alpha": 0.1}, True),
    ("sign", "Sign", {"x": SPECIAL}, None, None, {}, True),
    ("tanh", "Tanh", {"x": SPECIAL}, None, None, {}, True),
    ("atanh", "Atanh", {"x": SPECIAL}, None, None, {}, True),
    ("hardmax", "Hardmax", {"x": X4}, None, None, {"axis": 1}, False),
    ("celu", "Celu", {"x": SPECIAL}, None, None, {}, False),
    # order-dependent in onnxruntime with NaN: Inf, -0.0 and denormals only
    ("maxpool", "MaxPool", {"x": NO_NAN.reshape(1, 1, 4, 4)}, None, None,
     {"kernel_shape": [2, 2], "strides": [1, 1]}, False),
    ("global_maxpool", "GlobalMaxPool", {"x": NO_NAN.reshape(1, 4, 2, 2)}, None, None, {},
     False),
    ("reduce_max", "ReduceMax", {"x": NO_NAN.reshape(4, 4)}, None, None,
     {"axes": [1], "keepdims": 0}, False),
    ("reduce_min", "ReduceMin", {"x": NO_NAN.reshape(4, 4)}, None, None,
     {"axes": [0], "keepdims": 0}, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_special_values_match_onnxruntime(case):
    _, op, feeds, inits, names, attrs, zero_sign = case
    check_against_ort(node_model(op, feeds, inits, names, **attrs), feeds, zero_sign)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_extremes_without_nan(op):
    feeds = {"x": NO_NAN.reshape(4, 4)}
    check_against_ort(node_model(op, feeds, out_type=I64, axis=1, keepdims=0), feeds)


def test_clip_opset6_attributes():
    feeds = {"x": SPECIAL}
    check_against_ort(node_model("Clip", feeds, opset=6, min=-1.0), feeds, zero_sign=True)


def test_reduce_max_leading_nan_row():
    """A NaN leading a row is the row's ReduceMax, as onnxruntime's fold gives (this was
    the xfail recording issue #17's gap)."""
    feeds = {"x": X4}
    check_against_ort(node_model("ReduceMax", feeds, axes=[1], keepdims=0), feeds)


def test_sub_log_relu_outputs_nan():
    """The issue's model: log of a negative is NaN, and Relu must keep it."""
    nodes = [helper.make_node("Sub", ["x", "c"], ["d"], name="sub"),
             helper.make_node("Log", ["d"], ["l"], name="log"),
             helper.make_node("Relu", ["l"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 8])],
                          [helper.make_tensor_value_info("y", F, [2, 8])],
                          [numpy_helper.from_array(np.float32(1.0).reshape(()), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.linspace(-3, 4, 16, dtype=np.float32).reshape(2, 8)
    expected = ort_run(m, {"x": x})[0]
    got = compiler.compile(m, target="host").session().run(None, {"x": x})[0]
    assert np.isnan(expected).sum() > 0
    assert_nan_equal(got, expected, rtol=1e-5, atol=1e-6)


def test_relu_lowers_to_a_select_not_max():
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    text = legalized_text(relax.op.nn.relu(x), x)
    assert "Select" in text and "T.max" not in text


@pytest.mark.parametrize("op", ["relu", "clip", "prelu"])
def test_input_bound_once(op):
    """relu / clip / prelu read their input once, through a Let: a producer fused into it
    (a concat's select chain, a conv's accumulator) is then inlined once, not per use."""
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    s = relax.Var("s", relax.TensorType((16,), "float32"))
    expr = {"relu": lambda: relax.op.nn.relu(x), "clip": lambda: relax.op.clip(x, 0.0, 6.0),
            "prelu": lambda: relax.op.nn.prelu(x, s, axis=1)}[op]()
    text = legalized_text(expr, x, s)
    assert "T.Let" in text and text.count("x[") == 1 + text.count("T.reads(x[")


def test_maximum_checks_nan_and_int_keeps_tvm():
    a = relax.Var("a", relax.TensorType((8, 16), "float32"))
    b = relax.Var("b", relax.TensorType((16,), "float32"))
    text = legalized_text(relax.op.maximum(a, b), a, b)
    assert "isnan" in text and "T.max" not in text
    i = relax.Var("i", relax.TensorType((8,), "int32"))
    j = relax.Var("j", relax.TensorType((8,), "int32"))
    assert "T.max" in legalized_text(relax.op.maximum(i, j), i, j)
