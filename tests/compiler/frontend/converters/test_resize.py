"""Fixes to existing converters found by the ONNX backend tests, each against
onnx.reference.ReferenceEvaluator on a small model: Resize/Upsample computed exactly
(compiler/converters_resize.py), Pow with mixed types, reductions over empty tensors and of
bools, Split with empty parts, Mod's float edge cases, ConvTranspose's output_shape,
BatchNormalization in training mode, deterministic Dropout (compiler/converters.py),
RMSNormalization over all axes, MaxPool's Indices, MaxUnpool's output_shape
(compiler/converters_nn.py), the loader's per-operator opset check, function-op defaults
and STFT's omitted ``onesided`` (compiler/loader.py), and fold_onnx folding again after
shape inference on a folded graph (compiler/fold_onnx.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.errors import UnsupportedError

F, F16, I32, I64, B = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32,
                       TensorProto.INT64, TensorProto.BOOL)
RTOL, ATOL = 1e-4, 1e-5


def _model(node, inputs, outputs, opset, inits=()):
    g = helper.make_graph([node], "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _out(name):
    """An output typed later from the reference's result (see ``_typed``)."""
    return helper.make_empty_tensor_value_info(name)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _typed(model, feeds):
    """``model`` with its untyped outputs typed as the reference computes them, and the
    reference's outputs."""
    want = [np.asarray(w) for w in ReferenceEvaluator(model).run(None, feeds)]
    for vi, w in zip(model.graph.output, want):
        if not vi.type.HasField("tensor_type"):
            vi.CopyFrom(helper.make_tensor_value_info(
                vi.name, helper.np_dtype_to_tensor_dtype(w.dtype), list(w.shape)))
    return model, want


def _check(model, feeds, rtol=RTOL, atol=ATOL):
    model, want = _typed(model, feeds)
    got = compiler.compile(model).session().run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


_RNG = np.random.default_rng(0)


# --------------------------------------------------------------------------- #
# Resize / Upsample
# --------------------------------------------------------------------------- #


def _resize(x, scales=None, sizes=None, roi=None, opset=19, **attrs):
    inits, names = [], ["x", "", "", ""]
    for k, (name, v, dt) in enumerate((("roi", roi, np.float32), ("scales", scales, np.float32),
                                       ("sizes", sizes, np.int64)), start=1):
        if v is not None:
            inits.append(_init(name, np.array(v, dt)))
            names[k] = name
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    return _model(node, [_vi("x", elem, list(x.shape))], [_out("y")], opset, inits)


_X44 = _RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)

_RESIZE_CASES = {
    # a non-integral input size times scale: output 2 x 2, sampled with the scale, not 4/2
    "linear_scales_0.6": dict(scales=[1, 1, 0.6, 0.6], mode="linear"),
    "linear_align_corners_0.6": dict(scales=[1, 1, 0.6, 0.6], mode="linear",
                                     coordinate_transformation_mode="align_corners"),
    "linear_half_pixel_symmetric": dict(scales=[1, 1, 2.3, 1.7], mode="linear",
                                        coordinate_transformation_mode="half_pixel_symmetric"),
    "cubic_A_exclude_outside": dict(scales=[1, 1, 0.8, 1.6], mode="cubic", cubic_coeff_a=-0.5,
                                    exclude_outside=1),
    "cubic_antialias_sizes": dict(sizes=[1, 2, 3, 2], mode="cubic", antialias=1),
    "linear_antialias_scales": dict(scales=[1, 1, 0.6, 0.5], mode="linear", antialias=1),
    "nearest_tie_half_pixel": dict(sizes=[1, 2, 7, 9], mode="nearest"),
    "nearest_ceil_pytorch": dict(sizes=[1, 2, 3, 6], mode="nearest", nearest_mode="ceil",
                                 coordinate_transformation_mode="pytorch_half_pixel"),
    "nearest_axes_not_smaller": dict(sizes=[5, 3], axes=[3, 2], mode="nearest",
                                     keep_aspect_ratio_policy="not_smaller"),
    "nearest_axes_not_larger": dict(sizes=[7, 5], axes=[2, 3], mode="nearest",
                                    keep_aspect_ratio_policy="not_larger"),
    "tf_crop_and_resize_axes": dict(sizes=[3, 5], axes=[3, 2], roi=[0.2, 0.4, 0.9, 1.2],
                                    mode="linear", extrapolation_value=7.5,
                                    coordinate_transformation_mode="tf_crop_and_resize"),
}


@pytest.mark.parametrize("case", sorted(_RESIZE_CASES))
def test_resize_matches_reference(case):
    _check(_resize(_X44, **_RESIZE_CASES[case]), {"x": _X44})


def test_resize_nearest_on_integers_is_exact_and_linear_is_refused():
    # more than 64 elements: a small integer input would be bound as a value (specialize)
    x = np.arange(72, dtype=np.int32).reshape(1, 2, 6, 6) * 1000003
    _check(_resize(x, scales=[1, 1, 1.5, 0.75], mode="nearest",
                   nearest_mode="round_prefer_ceil",
                   coordinate_transformation_mode="asymmetric"), {"x": x}, rtol=0, atol=0)
    model, _ = _typed(_resize(x, scales=[1, 1, 1.5, 0.75], mode="linear"), {"x": x})
    with pytest.raises(UnsupportedError, match="mode=linear on a int32 input"):
        compiler.compile(model)


def test_resize_float16_computed_in_float32():
    x = _X44.astype(np.float16)
    _check(_resize(x, scales=[1, 1, 0.6, 1.5], mode="cubic"), {"x": x}, rtol=2e-3, atol=1e-3)


def test_resize_roi_as_graph_input_is_bound_by_the_session():
    model = _resize(_X44, sizes=[1, 2, 3, 3], roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1],
                    mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1], np.float32)
    del model.graph.initializer[0]  # roi becomes a graph input
    model.graph.input.append(_vi("roi", F, [8]))
    _check(model, {"x": _X44, "roi": roi})


def test_upsample_opset9_nearest():
    x = _RNG.standard_normal((1, 1, 2, 3)).astype(np.float32)
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    model = _model(node, [_vi("x", F, [1, 1, 2, 3])], [_out("y")], 9,
                   [_init("scales", np.array([1, 1, 2, 3], np.float32))])
    got = _check(model, {"x": x})[0]
    np.testing.assert_array_equal(got, np.repeat(np.repeat(x, 2, axis=2), 3, axis=3))


# --------------------------------------------------------------------------- #
# Pow, Mod
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("base,exp", [(np.float32, np.int64), (np.int32, np.float32),
                                      (np.int64, np.int32)])
def test_pow_mixed_types_has_the_base_type(base, exp):
    a = np.array([1.5, 2, 3, -2], base) if base == np.float32 else np.array([1, 2, 3, -2], base)
    b = np.array([2, 3, 0, 3], exp) if exp != np.float32 else np.array([2, 0.5, 3, 3], exp)
    node = helper.make_node("Pow", ["a", "b"], ["y"])
    at = helper.np_dtype_to_tensor_dtype(a.dtype)
    model = _model(node, [_vi("a", at, [4]), _vi("b", helper.np_dtype_to_tensor_dtype(b.dtype), [4])],
                   [_out("y")], 15)
    _check(model, {"a": a, "b": b})


def test_mod_float_edge_cases_as_numpy():
    x = np.array([0, -0.0, 0, -0.0, -3, 3, -1, 1, np.inf, -np.inf, 1, 1, np.nan, 1, 5.5, -5.5],
                 np.float32)
    y = np.array([-2, 2, 2, -2, np.inf, np.inf, -np.inf, -np.inf, 2, 2, 0, -0.0, 2, np.nan,
                  -2, 2], np.float32)
    node = helper.make_node("Mod", ["x", "y"], ["z"], fmod=0)
    model = _model(node, [_vi("x", F, [16]), _vi("y", F, [16])], [_vi("z", F, [16])], 13)
    got = compiler.compile(model).session().run(None, {"x": x, "y": y})[0]
    want = np.mod(x, y)
    np.testing.assert_array_equal(got, want)  # NaN where NaN, same infinities
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


# --------------------------------------------------------------------------- #
# Reductions over empty tensors and of bools
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("op,opset", [("ReduceSum", 13), ("ReduceMax", 20), ("ReduceMin", 20),
                                      ("ReduceProd", 18), ("ReduceLogSumExp", 18),
                                      ("ReduceMean", 18), ("ReduceL2", 18)])
def test_reduce_empty_gives_the_identity(op, opset):
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    model = _model(node, [_vi("x", F, [2, 0, 4])], [_out("y")], opset,
                   [_init("axes", np.array([1], np.int64))])
    x = np.zeros((2, 0, 4), np.float32)
    model, (want,) = _typed(model, {"x": x})
    got = compiler.compile(model).session().run(None, {"x": x})[0]
    assert got.shape == want.shape == (2, 1, 4)
    np.testing.assert_array_equal(got, want)


def test_reduce_empty_over_a_non_empty_axis_and_on_bools():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    model = _model(node, [_vi("x", F, [2, 0, 4])], [_out("y")], 13,
                   [_init("axes", np.array([2], np.int64))])
    _check(model, {"x": np.zeros((2, 0, 4), np.float32)})
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)
    model = _model(node, [_vi("x", B, [2, 0, 4])], [_out("y")], 20,
                   [_init("axes", np.array([1], np.int64))])
    _check(model, {"x": np.zeros((2, 0, 4), bool)})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_of_bools(op):
    x = np.array([[True, True], [True, False], [False, True], [False, False]])
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    model = _model(node, [_vi("x", B, [4, 2])], [_out("y")], 20,
                   [_init("axes", np.array([1], np.int64))])
    _check(model, {"x": x})


# --------------------------------------------------------------------------- #
# Split, RMSNormalization, MeanVarianceNormalization
# --------------------------------------------------------------------------- #


def test_split_with_empty_parts():
    x = np.arange(5, dtype=np.float32)
    node = helper.make_node("Split", ["x", "split"], ["a", "b", "c", "d"])
    model = _model(node, [_vi("x", F, [5])], [_out(n) for n in "abcd"], 13,
                   [_init("split", np.array([0, 2, 0, 3], np.int64))])
    got = _check(model, {"x": x})
    assert [g.shape for g in got] == [(0,), (2,), (0,), (3,)]


@pytest.mark.parametrize("axis", [0, -3])
def test_rms_normalization_over_all_axes(axis):
    x = _RNG.standard_normal((2, 3, 4)).astype(np.float32)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-3)
    model = _model(node, [_vi("x", F, [2, 3, 4])], [_out("y")], 23,
                   [_init("s", _RNG.standard_normal((2, 3, 4)).astype(np.float32))])
    _check(model, {"x": x})


def test_mean_variance_normalization_default_axes():
    x = _RNG.standard_normal((3, 3, 3, 1)).astype(np.float32)
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"])
    _check(_model(node, [_vi("x", F, [3, 3, 3, 1])], [_vi("y", F, [3, 3, 3, 1])], 13),
           {"x": x})


# --------------------------------------------------------------------------- #
# MaxPool with Indices, MaxUnpool with output_shape, ConvTranspose with output_shape
# --------------------------------------------------------------------------- #


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

    x = _RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    x[0, 0, :2, :2] = 4  # a tie: the first maximum in row-major order wins
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    model = _model(node, [_vi("x", F, [2, 3, 5, 6])], [_out("y"), _out("i")], 22)
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
    model = _model(node, [_vi("x", F, [1, 1, 2, 2]), _vi("i", I64, [1, 1, 2, 2])],
                   [_out("y")], 22, [_init("shape", np.array([1, 1, 5, 6], np.int64))])
    _check(model, {"x": x, "i": np.array([[[[5, 7], [13, 15]]]], np.int64)})


@pytest.mark.parametrize("attrs", [
    dict(output_shape=[10, 8], strides=[3, 2]),                       # larger: zero fill
    dict(output_shape=[7, 6], strides=[3, 2], pads=[1, 0, 1, 1]),     # cropped by pads
    dict(output_shape=[9, 6], strides=[3, 2], auto_pad="SAME_UPPER", output_padding=[1, 1]),
    dict(output_shape=[10, 7], strides=[3, 2], auto_pad="SAME_LOWER"),
])
def test_conv_transpose_output_shape(attrs):
    x = _RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = _RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)
    bias = _RNG.standard_normal(3).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    model = _model(node, [_vi("x", F, [1, 2, 3, 3])], [_out("y")], 22,
                   [_init("w", w), _init("b", bias)])
    _check(model, {"x": x})


# --------------------------------------------------------------------------- #
# BatchNormalization training mode, Dropout
# --------------------------------------------------------------------------- #


def test_batch_norm_training_mode_outputs():
    x = _RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv"], training_mode=1, momentum=0.8, epsilon=1e-2)
    inits = [_init(n, _RNG.uniform(0.5, 1.5, 3).astype(np.float32)) for n in "sbmv"]
    model = _model(node, [_vi("x", F, [2, 3, 4, 5])], [_out(n) for n in ("y", "rm", "rv")],
                   15, inits)
    _check(model, {"x": x})


def _dropout(ratio, training):
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=0)
    return _model(node, [_vi("x", F, [3, 4])], [_out("y"), _out("mask")], 22,
                  [_init("r", np.array(ratio, np.float32)), _init("t", np.array(training))])


def test_dropout_training_with_zero_ratio_is_the_identity():
    x = _RNG.standard_normal((3, 4)).astype(np.float32)
    _check(_dropout(0.0, True), {"x": x})
    _check(_dropout(0.5, False), {"x": x})
    model, _ = _typed(_dropout(0.5, True), {"x": x})
    with pytest.raises(UnsupportedError, match="random dropout"):
        compiler.compile(model)


def test_dropout_training_mode_as_graph_input_is_bound_by_the_session():
    x = _RNG.standard_normal((3, 4)).astype(np.float32)
    model, _ = _typed(_dropout(0.0, True), {"x": x})
    del model.graph.initializer[:]
    model.graph.input.extend([_vi("r", F, []), _vi("t", B, [])])
    sess = compiler.compile(model).session()
    y, mask = sess.run(None, {"x": x, "r": np.array(0.0, np.float32), "t": np.array(True)})
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == bool and mask.all()
    with pytest.raises(UnsupportedError, match="random dropout"):
        sess.run(None, {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)})


# --------------------------------------------------------------------------- #
# The loader's per-operator opset range
# --------------------------------------------------------------------------- #


def test_opset_below_7_accepted_when_every_op_is_unchanged():
    x = np.array([[True, False], [False, True]])
    node = helper.make_node("Not", ["x"], ["y"])
    _check(_model(node, [_vi("x", B, [2, 2])], [_vi("y", B, [2, 2])], 1), {"x": x})
    # Add changed at opset 7 (broadcasting): an opset-6 Add is still refused, by name
    node = helper.make_node("Add", ["x", "x"], ["y"])
    model = _model(node, [_vi("x", F, [2])], [_vi("y", F, [2])], 6)
    with pytest.raises(UnsupportedError, match=r"opset 6 is outside .*Add"):
        compiler.compile(model)


# --------------------------------------------------------------------------- #
# fold_onnx: shapes inferred again after folding (CenterCropPad's expanded body)
# --------------------------------------------------------------------------- #


def _pad_then_slice_by_shape():
    """y = padded[h // 2:, w // 2:] where padded = Pad(x, max(p, 0)): Pad's output shape is
    static only once ``p`` is bound and ``max(p, 0)`` folded (shape inference does not
    propagate values through Max)."""
    nodes = [helper.make_node("Max", ["p", "zero"], ["pads"]),
             helper.make_node("Pad", ["x", "pads"], ["padded"]),
             helper.make_node("Shape", ["padded"], ["sh"]),
             helper.make_node("Div", ["sh", "two"], ["half"]),
             helper.make_node("Slice", ["padded", "half", "sh"], ["y"])]
    g = helper.make_graph(nodes, "g", [_vi("x", F, [3, 4]), _vi("p", I64, [4])], [_out("y")],
                          [_init("zero", np.zeros(4, np.int64)), _init("two", np.int64(2))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_fold_onnx_refolds_after_shape_inference():
    from compiler.frontend.fold_onnx import fold_constants
    from compiler.frontend.loader import load_model
    from compiler.specialize import specialize_model

    x = _RNG.standard_normal((3, 4)).astype(np.float32)
    p = np.array([1, -2, 2, 3], np.int64)
    model, (want,) = _typed(_pad_then_slice_by_shape(), {"x": x, "p": p})
    folded, n = fold_constants(load_model(specialize_model(model, values={"p": p})))
    assert [node.op_type for node in folded.graph.node] == ["Pad", "Slice"] and n == 3
    inits = {t.name for t in folded.graph.initializer}
    assert {"pads", "half", "sh"} <= inits
    (got,) = compiler.compile(model, input_values={"p": p}).session().run(None, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- #
# The loader: STFT's omitted ``onesided`` is the spec's default, 1
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("window", [False, True])
def test_stft_omitted_onesided_with_constant_frames(window):
    x = _RNG.standard_normal((1, 64, 1)).astype(np.float32)
    inits = [_init("step", np.int64(8)), _init("length", np.int64(16))]
    if window:
        inits.append(_init("w", np.hanning(16).astype(np.float32)))
    node = helper.make_node("STFT", ["x", "step", "w" if window else "", "length"], ["y"])
    model = _model(node, [_vi("x", F, [1, 64, 1])], [_vi("y", F, [1, 7, 9, 2])], 17, inits)
    got = _check(model, {"x": x})[0]
    assert got.shape == (1, 7, 9, 2)
    assert not any(a.name == "onesided" for a in model.graph.node[0].attribute)  # not mutated
