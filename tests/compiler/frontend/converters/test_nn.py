"""onnxc's nn converters (compiler/converters_nn.py) against onnx.reference, and the float
max/min reduction identity fix (compiler/legalize_reductions.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.errors import ModelError, UnsupportedError

RTOL, ATOL = 1e-4, 1e-5
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(node, inputs, outputs, opset, inits=()):
    g = helper.make_graph([node], "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _check(model, feeds):
    want = ReferenceEvaluator(model).run(None, feeds)
    got = compiler.compile(model).session().run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == np.asarray(w).shape and g.dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    return got


def _attention(q_shape, k_shape, v_shape, opset=23, mask=None, past=None, nonpad=False,
               n_out=1, **attrs):
    rng = np.random.default_rng(0)
    names = ["Q", "K", "V"]
    inputs = [_vi("Q", F, q_shape), _vi("K", F, k_shape), _vi("V", F, v_shape)]
    feeds = {n: rng.standard_normal(s).astype(np.float32)
             for n, s in zip(names, [q_shape, k_shape, v_shape])}
    if mask is not None:
        names.append("mask")
        elem = B if mask.dtype == bool else F
        inputs.append(_vi("mask", elem, list(mask.shape)))
        feeds["mask"] = mask
    if past is not None:
        names += [""] * (4 - len(names)) + ["past_key", "past_value"]
        for n, s in zip(["past_key", "past_value"], past):
            inputs.append(_vi(n, F, s))
            feeds[n] = rng.standard_normal(s).astype(np.float32)
    if nonpad:
        names += [""] * (6 - len(names)) + ["nonpad"]
        inputs.append(_vi("nonpad", I64, [q_shape[0]]))
        feeds["nonpad"] = np.array([k_shape[2] - 1, 2][:q_shape[0]], np.int64)
    outs = ["Y", "present_key", "present_value", "qk"][:n_out]
    node = helper.make_node("Attention", names, outs, **attrs)
    outputs = [helper.make_empty_tensor_value_info(o) for o in outs]
    model = _model(node, inputs, outputs, opset)
    # the reference gives the output shapes
    want = ReferenceEvaluator(model).run(None, feeds)
    del model.graph.output[:]
    model.graph.output.extend([_vi(o, F, list(w.shape)) for o, w in zip(outs, want)])
    return _check(model, feeds)


def test_attention_4d_plain():
    _attention([2, 3, 4, 8], [2, 3, 6, 8], [2, 3, 6, 5])


def test_attention_3d_gqa_causal_softcap():
    _attention([2, 4, 16], [2, 6, 8], [2, 6, 8], q_num_heads=4, kv_num_heads=2,
               is_causal=1, softcap=2.0, scale=0.3)


def test_attention_bool_mask_fully_masked_row_is_zero():
    mask = np.ones((4, 6), bool)
    mask[1] = False  # row 1 attends nothing: 0, not NaN
    y = _attention([1, 2, 4, 8], [1, 2, 6, 8], [1, 2, 6, 8], mask=mask)[0]
    assert not np.isnan(y).any() and np.all(y[:, :, 1] == 0)


def test_attention_float_mask_past_present_qk_modes():
    rng = np.random.default_rng(1)
    mask = rng.standard_normal((2, 1, 3, 7)).astype(np.float32)
    for mode in (1, 2, 3):
        _attention([2, 2, 3, 4], [2, 2, 3, 4], [2, 2, 3, 4], mask=mask,
                   past=([2, 2, 4, 4], [2, 2, 4, 4]), n_out=4, qk_matmul_output_mode=mode,
                   softcap=1.5, is_causal=1)


def test_attention_nonpad_kv_seqlen_causal():
    _attention([2, 2, 3, 4], [2, 2, 5, 4], [2, 2, 5, 4], opset=24, nonpad=True, is_causal=1)


def test_attention_qk_output_mode0_with_softcap_refused():
    with pytest.raises(UnsupportedError, match="qk_matmul_output_mode=0"):
        _attention([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], n_out=4, softcap=1.5)


def test_attention_refuses_3d_without_heads():
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"])
    model = _model(node, [_vi("Q", F, [1, 2, 8]), _vi("K", F, [1, 2, 8]),
                          _vi("V", F, [1, 2, 8])], [_vi("Y", F, [1, 2, 8])], 23)
    with pytest.raises((UnsupportedError, ModelError)):  # onnx's checker may refuse first
        compiler.compile(model)


@pytest.mark.parametrize("reduction,weighted", [("none", True), ("sum", False),
                                                ("mean", True), ("mean", False)])
def test_nll_loss(reduction, weighted):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5, 2, 2)).astype(np.float32)
    t = rng.integers(0, 5, (3, 2, 2)).astype(np.int64)
    t[0, 0, 0] = 1
    feeds = {"x": x, "t": t}
    names, inputs = ["x", "t"], [_vi("x", F, x.shape), _vi("t", I64, t.shape)]
    if weighted:
        names.append("w")
        inputs.append(_vi("w", F, [5]))
        feeds["w"] = rng.random(5).astype(np.float32)
    node = helper.make_node("NegativeLogLikelihoodLoss", names, ["y"], reduction=reduction,
                            ignore_index=1)
    out_shape = [3, 2, 2] if reduction == "none" else []
    _check(_model(node, inputs, [_vi("y", F, out_shape)], 22), feeds)


def test_softmax_cross_entropy_log_prob():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 3)).astype(np.float32)
    t = rng.integers(0, 6, (4, 3)).astype(np.int64)
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t"], ["loss", "logp"],
                            ignore_index=2)
    model = _model(node, [_vi("x", F, x.shape), _vi("t", I64, t.shape)],
                   [_vi("loss", F, []), _vi("logp", F, x.shape)], 13)
    _check(model, {"x": x, "t": t})


@pytest.mark.parametrize("op,opset,exclusive,reverse", [
    ("CumSum", 14, 0, 0), ("CumSum", 14, 1, 1), ("CumProd", 26, 1, 0), ("CumProd", 26, 0, 1)])
def test_cumulative(op, opset, exclusive, reverse):
    x = np.random.default_rng(4).random((3, 5)).astype(np.float32) + 0.5
    axis = helper.make_tensor("axis", I64, [], [1])
    node = helper.make_node(op, ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    _check(_model(node, [_vi("x", F, [3, 5])], [_vi("y", F, [3, 5])], opset, [axis]),
           {"x": x})


def test_reduce_max_min_of_all_infinite_rows():
    """TVM's max/min reductions started from the lowest/highest finite value."""
    x = np.full((2, 4), -np.inf, np.float32)
    x[1, 2] = 3
    for op, data, want in (("ReduceMax", x, [[-np.inf], [3]]), ("ReduceMin", -x, [[np.inf], [-3]])):
        node = helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=1)
        model = _model(node, [_vi("x", F, [2, 4])], [_vi("y", F, [2, 1])], 13)
        got = compiler.compile(model).session().run(None, {"x": data})[0]
        np.testing.assert_array_equal(got, np.array(want, np.float32))


def test_resize_non_integral_scales_sample_with_the_scale():
    """TVM samples with the size ratio; compiler/converters_resize.py with the scale."""
    scales = helper.make_tensor("scales", F, [4], [1, 1, 0.6, 0.6])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = _model(node, [_vi("x", F, [1, 1, 2, 4])], [_vi("y", F, [1, 1, 1, 2])], 19,
                   [scales])
    _check(model, {"x": np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)})


def test_resize_integral_scales_from_input_specialise():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = _model(node, [_vi("x", F, [1, 1, 4, 4]), _vi("scales", F, [4])],
                   [_vi("y", F, [1, 1, 8, 8])], 19)
    _check(model, {"x": x, "scales": np.array([1, 1, 2, 2], np.float32)})
