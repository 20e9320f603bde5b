"""onnxc's nn converters (compiler/frontend/converters/nn.py) against onnx.reference:
Attention, losses, RMS/LpNormalization, pooling indices, ConvTranspose's output_shape,
BatchNormalization in training mode, deterministic Dropout, Col2Im, DeformConv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, shape_inference
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.errors import CompileError, ModelError, UnsupportedError
from tests.compiler.frontend.converters.reference import (B, F, I64, RNG, check_against_reference,
                                                          initializer, onnx_model, randn, typed,
                                                          untyped_output, value_info)
from tests.compiler.onnx_check import check, run_onnxc


def _conv_out(size, k, pad, stride, dilation):
    return (size + 2 * pad - ((k - 1) * dilation + 1)) // stride + 1


def _attention(q_shape, k_shape, v_shape, opset=23, mask=None, past=None, nonpad=False,
               n_out=1, **attrs):
    rng = np.random.default_rng(0)
    names = ["Q", "K", "V"]
    inputs = [value_info("Q", F, q_shape), value_info("K", F, k_shape), value_info("V", F, v_shape)]
    feeds = {n: rng.standard_normal(s).astype(np.float32)
             for n, s in zip(names, [q_shape, k_shape, v_shape])}
    if mask is not None:
        names.append("mask")
        elem = B if mask.dtype == bool else F
        inputs.append(value_info("mask", elem, list(mask.shape)))
        feeds["mask"] = mask
    if past is not None:
        names += [""] * (4 - len(names)) + ["past_key", "past_value"]
        for n, s in zip(["past_key", "past_value"], past):
            inputs.append(value_info(n, F, s))
            feeds[n] = rng.standard_normal(s).astype(np.float32)
    if nonpad:
        names += [""] * (6 - len(names)) + ["nonpad"]
        inputs.append(value_info("nonpad", I64, [q_shape[0]]))
        feeds["nonpad"] = np.array([k_shape[2] - 1, 2][:q_shape[0]], np.int64)
    outs = ["Y", "present_key", "present_value", "qk"][:n_out]
    node = helper.make_node("Attention", names, outs, **attrs)
    outputs = [helper.make_empty_tensor_value_info(o) for o in outs]
    model = onnx_model(node, inputs, outputs, opset)
    # the reference gives the output shapes
    want = ReferenceEvaluator(model).run(None, feeds)
    del model.graph.output[:]
    model.graph.output.extend([value_info(o, F, list(w.shape)) for o, w in zip(outs, want)])
    return check_against_reference(model, feeds)


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
    model = onnx_model(node, [value_info("Q", F, [1, 2, 8]), value_info("K", F, [1, 2, 8]),
                          value_info("V", F, [1, 2, 8])], [value_info("Y", F, [1, 2, 8])], 23)
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
    names, inputs = ["x", "t"], [value_info("x", F, x.shape), value_info("t", I64, t.shape)]
    if weighted:
        names.append("w")
        inputs.append(value_info("w", F, [5]))
        feeds["w"] = rng.random(5).astype(np.float32)
    node = helper.make_node("NegativeLogLikelihoodLoss", names, ["y"], reduction=reduction,
                            ignore_index=1)
    out_shape = [3, 2, 2] if reduction == "none" else []
    check_against_reference(onnx_model(node, inputs, [value_info("y", F, out_shape)], 22), feeds)


def test_softmax_cross_entropy_log_prob():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 3)).astype(np.float32)
    t = rng.integers(0, 6, (4, 3)).astype(np.int64)
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t"], ["loss", "logp"],
                            ignore_index=2)
    model = onnx_model(node, [value_info("x", F, x.shape), value_info("t", I64, t.shape)],
                   [value_info("loss", F, []), value_info("logp", F, x.shape)], 13)
    check_against_reference(model, {"x": x, "t": t})


@pytest.mark.parametrize("axis", [0, -3])
def test_rms_normalization_over_all_axes(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-3)
    model = onnx_model(node, [value_info("x", F, [2, 3, 4])], [untyped_output("y")], 23,
                   [initializer("s", RNG.standard_normal((2, 3, 4)).astype(np.float32))])
    check_against_reference(model, {"x": x})


def test_mean_variance_normalization_default_axes():
    x = RNG.standard_normal((3, 3, 3, 1)).astype(np.float32)
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"])
    check_against_reference(onnx_model(node, [value_info("x", F, [3, 3, 3, 1])], [value_info("y", F, [3, 3, 3, 1])], 13),
           {"x": x})


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 2], strides=[2, 2], storage_order=1),
    dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER"),
])
def test_max_pool_indices(attrs):
    """Against onnxruntime: the reference's unit-stride path decomposes the window's argmax
    with the output shape and drops the (n, c) offset the spec gives the Indices."""
    import onnxruntime as ort

    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    x[0, 0, :2, :2] = 4  # a tie: the first maximum in row-major order wins
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    model = onnx_model(node, [value_info("x", F, [2, 3, 5, 6])], [untyped_output("y"), untyped_output("i")], 22)
    model = shape_inference.infer_shapes(model)  # the reference floors SAME_LOWER's size
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = compiler.compile(model).session().run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_max_unpool_with_output_shape():
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    node = helper.make_node("MaxUnpool", ["x", "i", "shape"], ["y"], kernel_shape=[2, 2],
                            strides=[2, 2])
    model = onnx_model(node, [value_info("x", F, [1, 1, 2, 2]), value_info("i", I64, [1, 1, 2, 2])],
                   [untyped_output("y")], 22, [initializer("shape", np.array([1, 1, 5, 6], np.int64))])
    check_against_reference(model, {"x": x, "i": np.array([[[[5, 7], [13, 15]]]], np.int64)})


@pytest.mark.parametrize("attrs", [
    dict(output_shape=[10, 8], strides=[3, 2]),                       # larger: zero fill
    dict(output_shape=[7, 6], strides=[3, 2], pads=[1, 0, 1, 1]),     # cropped by pads
    dict(output_shape=[9, 6], strides=[3, 2], auto_pad="SAME_UPPER", output_padding=[1, 1]),
    dict(output_shape=[10, 7], strides=[3, 2], auto_pad="SAME_LOWER"),
])
def test_conv_transpose_output_shape(attrs):
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(3).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    model = onnx_model(node, [value_info("x", F, [1, 2, 3, 3])], [untyped_output("y")], 22,
                   [initializer("w", w), initializer("b", bias)])
    check_against_reference(model, {"x": x})


@pytest.mark.parametrize("auto_pad,kernel,strides,size,group", [
    ("SAME_UPPER", [3, 3], [1, 1], [9, 10], 4),      # EfficientNet's depthwise SAME
    ("SAME_UPPER", [5, 5], [2, 2], [9, 10], 1),      # odd total padding: extra at the end
    ("SAME_LOWER", [4, 2], [2, 3], [9, 10], 1),      # even kernel, extra at the start
    ("SAME_UPPER", [3], [2], [11], 2),               # conv1d
])
def test_conv_auto_pad_same_is_explicit_padding(auto_pad, kernel, strides, size, group):
    c = 4
    x = RNG.standard_normal([1, c] + size).astype(np.float32)
    w = RNG.standard_normal([8, c // group] + kernel).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, kernel_shape=kernel,
                            strides=strides, group=group)
    model = onnx_model(node, [value_info("x", F, [1, c] + size)], [untyped_output("y")], 17,
                       [initializer("w", w)])
    check_against_reference(model, {"x": x})
    # no separate pad of the activation (TVM's converter emits nn.pad): the conv pads
    kernels = [r["kernel"] for r in compiler.compile(model).report["kernel_table"]]
    assert not any("pad" in k for k in kernels) and any("conv" in k for k in kernels), kernels


def test_batch_norm_training_mode_outputs():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv"], training_mode=1, momentum=0.8, epsilon=1e-2)
    inits = [initializer(n, RNG.uniform(0.5, 1.5, 3).astype(np.float32)) for n in "sbmv"]
    model = onnx_model(node, [value_info("x", F, [2, 3, 4, 5])], [untyped_output(n) for n in ("y", "rm", "rv")],
                   15, inits)
    check_against_reference(model, {"x": x})


def _dropout(ratio, training):
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=0)
    return onnx_model(node, [value_info("x", F, [3, 4])], [untyped_output("y"), untyped_output("mask")], 22,
                  [initializer("r", np.array(ratio, np.float32)), initializer("t", np.array(training))])


def test_dropout_training_with_zero_ratio_is_the_identity():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_against_reference(_dropout(0.0, True), {"x": x})
    check_against_reference(_dropout(0.5, False), {"x": x})
    model, _ = typed(_dropout(0.5, True), {"x": x})
    with pytest.raises(UnsupportedError, match="random dropout"):
        compiler.compile(model)


def test_dropout_training_mode_as_graph_input_is_bound_by_the_session():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    model, _ = typed(_dropout(0.0, True), {"x": x})
    del model.graph.initializer[:]
    model.graph.input.extend([value_info("r", F, []), value_info("t", B, [])])
    sess = compiler.compile(model).session()
    y, mask = sess.run(None, {"x": x, "r": np.array(0.0, np.float32), "t": np.array(True)})
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == bool and mask.all()
    with pytest.raises(UnsupportedError, match="random dropout"):
        sess.run(None, {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)})


@pytest.mark.parametrize("p,axis", [(1, 0), (2, -1), (2, 1)])
def test_lp_normalization(p, axis):
    x = np.abs(randn(2, 3, 4)) + 0.1
    x[0, 0, :] = 0  # a zero norm along the last axis gives zeros
    check("LpNormalization", {"x": x}, opset=22, p=p, axis=axis)


def test_lp_normalization_refuses_p3():
    with pytest.raises(UnsupportedError, match="p=3"):
        run_onnxc("LpNormalization", {"x": randn(2, 3)}, opset=22, out_shape=[2, 3], p=3)


@pytest.mark.parametrize("image,block,attrs", [
    ([5, 5], [2, 3], {}),
    ([6, 7], [3, 2], {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
    ([3, 4, 5], [1, 2, 2], {}),
])
def test_col2im(image, block, attrs):
    nd = len(image)
    strides = attrs.get("strides", [1] * nd)
    dil = attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * 2 * nd)
    blocks = [(image[i] + pads[i] + pads[i + nd] - dil[i] * (block[i] - 1) - 1) // strides[i]
              + 1 for i in range(nd)]
    x = randn(2, 2 * int(np.prod(block)), int(np.prod(blocks)))
    check("Col2Im", {"x": x, "image": np.array(image, np.int64),
                     "block": np.array(block, np.int64)}, consts=("image", "block"),
          opset=18, **attrs)


def test_col2im_refuses_a_wrong_block_count():
    with pytest.raises(CompileError, match="blocks"):
        run_onnxc("Col2Im", {"x": randn(1, 4, 7), "image": np.array([4, 4], np.int64),
                             "block": np.array([2, 2], np.int64)}, consts=("image", "block"),
                  opset=18, out_shape=[1, 1, 4, 4])


@pytest.mark.parametrize("group,offset_group,pad,stride,dilation", [
    (1, 1, 0, 1, 1),
    (2, 1, 1, 1, 1),
    (1, 2, 1, 2, 1),
    (2, 2, 0, 1, 2),
])
def test_deform_conv(group, offset_group, pad, stride, dilation):
    n, c, h, w, oc, k = 2, 4, 5, 6, 4, 3
    oh, ow = _conv_out(h, k, pad, stride, dilation), _conv_out(w, k, pad, stride, dilation)
    # offsets of up to a few pixels: taps fall between pixels and outside the image
    inputs = {"x": randn(n, c, h, w), "w": randn(oc, c // group, k, k),
              "offset": randn(n, offset_group * k * k * 2, oh, ow, scale=1.5)}
    check("DeformConv", inputs, opset=19, rtol=1e-4, atol=1e-5, kernel_shape=[k, k],
          group=group, offset_group=offset_group, pads=[pad] * 4, strides=[stride] * 2,
          dilations=[dilation] * 2)


def test_deform_conv_mask_bias_rectangular_kernel():
    n, c, h, w, oc, kh, kw, og = 1, 2, 4, 5, 3, 2, 3, 2
    oh, ow = h - kh + 1 + 1, w - kw + 1   # pads top/bottom 1 and 0 (asymmetric)
    inputs = {"x": randn(n, c, h, w), "w": randn(oc, c, kh, kw),
              "offset": randn(n, og * kh * kw * 2, oh, ow),
              "b": randn(oc), "mask": RNG.uniform(0, 1, (n, og * kh * kw, oh, ow)).astype(
                  np.float32)}
    check("DeformConv", inputs, opset=19, offset_group=og, pads=[1, 0, 0, 0])


def test_deform_conv_zero_offsets_is_conv():
    """With zero offsets and no mask, DeformConv is a plain convolution: integer inputs
    make the comparison exact."""
    x = RNG.integers(-3, 4, (1, 2, 4, 4)).astype(np.float32)
    w = RNG.integers(-2, 3, (3, 2, 2, 2)).astype(np.float32)
    (got,) = check("DeformConv", {"x": x, "w": w, "offset": np.zeros((1, 8, 3, 3), np.float32)},
                   opset=19)
    want = np.zeros((1, 3, 3, 3), np.float32)
    for i in range(3):
        for j in range(3):
            want[0, :, i, j] = np.tensordot(w, x[0, :, i:i + 2, j:j + 2], axes=3)
    np.testing.assert_array_equal(got, want)


def test_deform_conv_double():
    inputs = {"x": randn(1, 1, 3, 4, dtype=np.float64), "w": randn(2, 1, 2, 2, dtype=np.float64),
              "offset": randn(1, 8, 2, 3, dtype=np.float64)}
    check("DeformConv", inputs, opset=19, rtol=1e-6)


def test_deform_conv_float16_near_exact():
    """float16: compared with the reference evaluated in float64 on the same values (the
    float16 reference rounds each step; see the converter's docstring)."""
    inputs = {"x": randn(1, 2, 5, 5, dtype=np.float16), "w": randn(2, 2, 3, 3, dtype=np.float16),
              "offset": randn(1, 18, 3, 3, dtype=np.float16)}
    (exact,) = check("DeformConv", {k: v.astype(np.float64) for k, v in inputs.items()},
                     opset=19, rtol=1e-6)
    (got,) = run_onnxc("DeformConv", inputs, opset=19, out_dtype=np.float16,
                       out_shape=(1, 2, 3, 3))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2e-3, atol=2e-3)


def test_deform_conv_refuses_1d():
    inputs = {"x": randn(1, 2, 5), "w": randn(2, 2, 3), "offset": randn(1, 6, 3)}
    with pytest.raises(UnsupportedError, match="only 2-D"):
        run_onnxc("DeformConv", inputs, opset=19, out_shape=(1, 2, 3))


def test_deform_conv_refuses_inconsistent_offset():
    inputs = {"x": randn(1, 1, 4, 4), "w": randn(1, 1, 2, 2), "offset": randn(1, 8, 2, 2)}
    with pytest.raises(UnsupportedError, match="offset of shape"):
        run_onnxc("DeformConv", inputs, opset=19, out_shape=(1, 1, 3, 3))


@pytest.mark.parametrize("op,attrs,shape", [
    # HF EfficientNet's head: AvgPool2d(1280, ceil_mode=True) on a 7 x 7 map
    ("AveragePool", dict(kernel_shape=[1280, 1280], strides=[1280, 1280], ceil_mode=1,
                         count_include_pad=1), (1, 64, 7, 7)),
    ("AveragePool", dict(kernel_shape=[7, 7]), (1, 32, 7, 7)),
    ("MaxPool", dict(kernel_shape=[9, 9], strides=[9, 9], ceil_mode=1), (1, 16, 7, 5)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2]), (1, 8, 7, 7)),   # not global
])
def test_pool_with_one_window_over_the_input_is_global(op, attrs, shape):
    """A window covering the whole input is a global pool (a mean or max over the spatial
    dims): TVM's pool kernel walked all 1280 x 1280 taps of EfficientNet's (40 s a call).
    Compared with onnxruntime (and PyTorch, whose export this is): the part of a ceil_mode
    window past the input is not counted; onnx.reference divides by the whole window."""
    from tests.conftest import ort_run

    x = RNG.standard_normal(shape).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, list(shape))],
                          [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    want = ort_run(model, {"x": x})[0]
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info("y", F, list(want.shape))])
    got = compiler.compile(model).session().run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("corner", [np.nan, np.inf, 0.5], ids=["nan", "inf", "finite"])
def test_deform_conv_special_values_match_onnxruntime(corner):
    """NaN / Inf in X (issue #17): onnxruntime samples a neighbour outside the image as
    ``0 * X[b, c, 0, 0]``, so a non-finite top-left pixel makes every sample that touches
    the border NaN; other NaN spread through their bilinear neighbours (0 * NaN too)."""
    from tests.nan_helpers import check_against_ort, node_model

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    x[0, 0, 0, 0] = corner
    x[0, 1, 3, 2] = np.nan
    x[0, 1, 1, 4] = -np.inf
    feeds = {"x": x, "w": rng.standard_normal((3, 2, 2, 2)).astype(np.float32),
             "offset": (rng.standard_normal((1, 8, 4, 4)) * 1.5).astype(np.float32)}
    feeds["offset"][0, :, 1, 1] = 0.0  # integer positions: zero weights on the +1 neighbours
    check_against_ort(node_model("DeformConv", feeds, opset=19, kernel_shape=[2, 2]), feeds,
                      rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset, mask_type", [(7, F), (10, B), (12, B)])
def test_dropout_mask_in_inference_matches_onnxruntime(opset, mask_type):
    # onnxruntime's Dropout 7-11 returns a mask of zeros (typed T at 7-9, false at 10-11;
    # onnx.reference gives true), from 12 true
    from tests.conftest import assert_close, ort_run

    x = RNG.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Dropout", ["x"], ["y", "mask"],
                            **({"ratio": 0.3} if opset < 12 else {}))
    model = onnx_model(node, [value_info("x", F, [3, 4])],
                       [value_info("y", F, [3, 4]), value_info("mask", mask_type, [3, 4])], opset)
    assert_close(compiler.compile(model).session().run(None, {"x": x}), ort_run(model, {"x": x}))


def _batch_norm_spatial0(param_shape):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0,
                            epsilon=1e-3)
    inits = [initializer(n, RNG.uniform(0.5, 1.5, param_shape).astype(np.float32))
             for n in "sbmv"]
    return onnx_model(node, [value_info("x", F, [2, 3, 4, 5])],
                      [value_info("y", F, [2, 3, 4, 5])], 7, inits)


def test_batch_norm_opset7_spatial0_matches_onnxruntime():
    # spatial=0 (opsets 7-8): one mean/var/scale/bias per element of (C, H, W); TVM's
    # converter handed them to relax.nn.batch_norm, which refused the shapes
    from tests.conftest import assert_close, ort_run

    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    model = _batch_norm_spatial0([3, 4, 5])
    assert_close(compiler.compile(model).session().run(None, {"x": x}), ort_run(model, {"x": x}))
    # parameters of another shape: refused, as onnxruntime refuses them
    with pytest.raises(UnsupportedError, match=r"spatial=0 with scale of shape \[60\]"):
        compiler.compile(_batch_norm_spatial0([60]))


def _group_norm_model(opset, shape, groups, dtype=np.float32, stash=None):
    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(opset)
    n_affine = groups if opset < 21 else shape[1]
    et = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    extra = {} if stash is None else {"stash_type": stash}
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn",
                            num_groups=groups, epsilon=1e-5, **extra)
    g = helper.make_graph(
        [node], "gn", [helper.make_tensor_value_info("x", et, shape)],
        [helper.make_tensor_value_info("y", et, shape)],
        [numpy_helper.from_array(rng.standard_normal(n_affine).astype(dtype), "s"),
         numpy_helper.from_array(rng.standard_normal(n_affine).astype(dtype), "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("symbolic", [False, True])
def test_group_normalization_rows_on_the_row_rule(opset, symbolic):
    """GroupNormalization (opset 18's per-group affine, 21's per channel) as a layer norm
    over each group's row: cpu.row_reduction, not TVM's multi-axis group_norm (2.5x
    onnxruntime static, 1000x over a symbolic image); a symbolic image is one artifact."""
    from tests.conftest import assert_close, ort_run

    shape = ["batch", 32, "h", "w"] if symbolic else [2, 32, 9, 11]
    model = _group_norm_model(opset, shape, 8)
    dims = {"batch": (1, 2, 1), "h": (1, 40, 16), "w": (1, 40, 16)} if symbolic else None
    cm = compiler.compile(model, dims=dims)
    rules = {r["rule"] for r in cm.report["kernel_table"] if "gn" in r["nodes"]}
    assert "cpu.row_reduction" in rules, cm.report["kernel_table"]
    # GroupNormalization-18: deprecated in onnx (its checker refuses it), run as onnxruntime
    assert any("is deprecated at opset 18" in w for w in cm.report["warnings"]) == (
        opset == 18)
    sess = cm.session()
    for b, h, w in ([(2, 9, 11)] if not symbolic else [(1, 16, 16), (2, 3, 5), (1, 40, 33)]):
        x = (RNG.standard_normal((b, 32, h, w)) * 2 + 1).astype(np.float32)
        assert_close(sess.run(None, {"x": x}), ort_run(model, {"x": x}), rtol=1e-4, atol=2e-5)


def test_group_normalization_half_and_refusals():
    from tests.conftest import ort_run

    model = _group_norm_model(21, [1, 16, 6, 6], 4, np.float16)
    x = RNG.standard_normal((1, 16, 6, 6)).astype(np.float16)
    got = compiler.compile(model).session().run(None, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), ort_run(model, {"x": x})[0].astype(
        np.float32), rtol=1e-2, atol=1e-2)
    with pytest.raises((UnsupportedError, ModelError), match="num_groups"):
        compiler.compile(_group_norm_model(21, [1, 10, 4, 4], 4))
