"""Resize and Upsample (compiler/frontend/converters/resize.py) against
onnx.reference.ReferenceEvaluator: computed exactly with constant scales, TVM's behind
the guards otherwise, and values bound by the specialising session."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import compiler
from compiler.errors import UnsupportedError
from tests.compiler.frontend.converters.reference import F
from tests.compiler.frontend.converters.reference import RNG
from tests.compiler.frontend.converters.reference import check_against_reference
from tests.compiler.frontend.converters.reference import initializer
from tests.compiler.frontend.converters.reference import onnx_model
from tests.compiler.frontend.converters.reference import typed
from tests.compiler.frontend.converters.reference import untyped_output
from tests.compiler.frontend.converters.reference import value_info


# --------------------------------------------------------------------------- #
# Resize / Upsample
# --------------------------------------------------------------------------- #


def _resize(x, scales=None, sizes=None, roi=None, opset=19, **attrs):
    inits, names = [], ["x", "", "", ""]
    for k, (name, v, dt) in enumerate((("roi", roi, np.float32), ("scales", scales, np.float32),
                                       ("sizes", sizes, np.int64)), start=1):
        if v is not None:
            inits.append(initializer(name, np.array(v, dt)))
            names[k] = name
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    return onnx_model(node, [value_info("x", elem, list(x.shape))], [untyped_output("y")], opset, inits)


_X44 = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)

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
    check_against_reference(_resize(_X44, **_RESIZE_CASES[case]), {"x": _X44})


def test_resize_nearest_on_integers_is_exact_and_linear_is_refused():
    # more than 64 elements: a small integer input would be bound as a value (specialize)
    x = np.arange(72, dtype=np.int32).reshape(1, 2, 6, 6) * 1000003
    check_against_reference(_resize(x, scales=[1, 1, 1.5, 0.75], mode="nearest",
                   nearest_mode="round_prefer_ceil",
                   coordinate_transformation_mode="asymmetric"), {"x": x}, rtol=0, atol=0)
    model, _ = typed(_resize(x, scales=[1, 1, 1.5, 0.75], mode="linear"), {"x": x})
    with pytest.raises(UnsupportedError, match="mode=linear on a int32 input"):
        compiler.compile(model)


def test_resize_float16_computed_in_float32():
    x = _X44.astype(np.float16)
    check_against_reference(_resize(x, scales=[1, 1, 0.6, 1.5], mode="cubic"), {"x": x}, rtol=2e-3, atol=1e-3)


def test_resize_roi_as_graph_input_is_bound_by_the_session():
    model = _resize(_X44, sizes=[1, 2, 3, 3], roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1],
                    mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1], np.float32)
    del model.graph.initializer[0]  # roi becomes a graph input
    model.graph.input.append(value_info("roi", F, [8]))
    check_against_reference(model, {"x": _X44, "roi": roi})


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("opset", [11, 13, 19])
def test_tf_crop_and_resize_matches_onnxruntime(mode, opset):
    # a roi reaching past the input on both sides: those samples are extrapolation_value
    from tests.conftest import assert_close, ort_run

    x = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    scales = [] if opset == 11 else None  # Resize-11's scales is not optional: empty
    model, _ = typed(_resize(x, sizes=[1, 2, 4, 7], roi=[0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3],
                             scales=scales, mode=mode, extrapolation_value=-3.5, opset=opset,
                             coordinate_transformation_mode="tf_crop_and_resize"), {"x": x})
    got = compiler.compile(model).session().run(None, {"x": x})
    want = ort_run(model, {"x": x})
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got[0] == np.float32(-3.5)).any()  # some samples lie outside the input


def test_upsample_opset9_nearest():
    x = RNG.standard_normal((1, 1, 2, 3)).astype(np.float32)
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    model = onnx_model(node, [value_info("x", F, [1, 1, 2, 3])], [untyped_output("y")], 9,
                   [initializer("scales", np.array([1, 1, 2, 3], np.float32))])
    got = check_against_reference(model, {"x": x})[0]
    np.testing.assert_array_equal(got, np.repeat(np.repeat(x, 2, axis=2), 3, axis=3))


# --------------------------------------------------------------------------- #
# Pow, Mod
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# Reductions over empty tensors and of bools
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# Split, RMSNormalization, MeanVarianceNormalization
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# MaxPool with Indices, MaxUnpool with output_shape, ConvTranspose with output_shape
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# BatchNormalization training mode, Dropout
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# The loader's per-operator opset range
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# fold_onnx: shapes inferred again after folding (CenterCropPad's expanded body)
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# The loader: STFT's omitted ``onesided`` is the spec's default, 1
# --------------------------------------------------------------------------- #




def test_resize_non_integral_scales_sample_with_the_scale():
    """TVM samples with the size ratio; compiler/frontend/converters/resize.py with the scale."""
    scales = helper.make_tensor("scales", F, [4], [1, 1, 0.6, 0.6])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = onnx_model(node, [value_info("x", F, [1, 1, 2, 4])], [value_info("y", F, [1, 1, 1, 2])], 19,
                   [scales])
    check_against_reference(model, {"x": np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)})


def test_resize_integral_scales_from_input_specialise():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = onnx_model(node, [value_info("x", F, [1, 1, 4, 4]), value_info("scales", F, [4])],
                   [value_info("y", F, [1, 1, 8, 8])], 19)
    check_against_reference(model, {"x": x, "scales": np.array([1, 1, 2, 2], np.float32)})


@pytest.mark.parametrize("mode,padding,align", [("linear", "zeros", 0), ("linear", "border", 1),
                                                ("nearest", "reflection", 0),
                                                ("cubic", "zeros", 1)])
def test_grid_sample_non_finite_coordinates_match_onnxruntime(mode, padding, align):
    """A NaN / +-Inf grid coordinate samples as the normalized -1, as onnxruntime 1.32
    does in every mode (issue #17); a NaN in the image still propagates."""
    from tests.nan_helpers import check_against_ort, node_model

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    x[0, 1, 2, 2] = np.nan
    grid = rng.uniform(-1.2, 1.2, (1, 3, 4, 2)).astype(np.float32)
    grid[0, 0, :, 0] = [np.nan, np.inf, -np.inf, 0.5]
    grid[0, 1, :, 1] = [np.nan, np.inf, -np.inf, -0.25]
    feeds = {"x": x, "grid": grid}
    m = node_model("GridSample", feeds, opset=20, mode=mode, padding_mode=padding,
                   align_corners=align)
    check_against_ort(m, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,mode,attrs", [
    ((1, 8, 6, 6), "linear", dict(coordinate_transformation_mode="align_corners")),  # DPT's
    ((1, 3, 5, 7), "linear", {}),
    ((1, 3, 5, 7), "cubic", {}),
])
def test_resize_few_taps_is_one_kernel_per_axis(shape, mode, attrs):
    # linear (2 taps) and cubic (4): per resized axis one kernel reading its taps through
    # the index table, no gather of k x the output and no reduction after it; the same
    # numbers as the reference, at sizes that are and are not multiples of the vector
    x = RNG.standard_normal(shape).astype(np.float32)
    m, _ = typed(_resize(x, scales=[1, 1, 2, 2], mode=mode, **attrs), {"x": x})
    cm = compiler.compile(m)
    kernels = [r["kernel"] for r in cm.report["kernel_table"]]
    assert len(kernels) == 2 and all(k.startswith("resize_taps") for k in kernels), kernels
    assert all(r["ops"] == "Resize" for r in cm.report["kernel_table"])  # provenance kept
    check_against_reference(m, {"x": x})


def test_resize_antialias_downscale_keeps_the_gather_and_reduction():
    # antialias at 0.25 widens the window beyond 4 taps: take + multiply-sum as before
    x = RNG.standard_normal((1, 2, 16, 16)).astype(np.float32)
    m, _ = typed(_resize(x, scales=[1, 1, 0.25, 0.25], mode="linear", antialias=1), {"x": x})
    cm = compiler.compile(m)
    assert not any(r["kernel"].startswith("resize_taps") for r in cm.report["kernel_table"])
    check_against_reference(m, {"x": x})


@pytest.mark.parametrize("scales,first", [
    ([1, 1, 2, 4], [1, 3, 5, 28]),     # upsampling: the last axis (gathers) first, small
    ([1, 1, 0.5, 0.5], [1, 3, 2, 7]),  # downsampling: in the given order, the last axis last
])
def test_resize_gathers_along_the_last_axis_over_the_smaller_tensor(scales, first):
    from compiler.frontend.importer import import_onnx
    from compiler.frontend.loader import load_model
    from passes.relax_util import bindings

    x = RNG.standard_normal((1, 3, 5, 7)).astype(np.float32)
    m, _ = typed(_resize(x, scales=scales, mode="linear"), {"x": x})
    shapes = [[int(d) for d in b.var.ty.shape] for b in bindings(import_onnx(load_model(m)))
              if "resize_taps" in str(b.value)]
    assert shapes[0] == first, shapes
    check_against_reference(m, {"x": x})


_RESIZE10_CASES = {
    "nearest_x2": ([1, 2, 4, 4], [1, 1, 2, 2], "nearest"),
    "nearest_fractional_up": ([1, 1, 4, 4], [1, 1, 1.5, 2.5], "nearest"),
    # downsampled axes take ceil(x / scale) in onnxruntime, upsampled ones floor
    "nearest_down_and_up": ([1, 2, 7, 5], [1, 1, 0.7, 1.3], "nearest"),
    "nearest_down": ([1, 1, 9, 9], [1, 1, 0.34, 0.75], "nearest"),
    "linear_x2": ([1, 2, 3, 4], [1, 1, 2, 2], "linear"),
    "linear_down": ([1, 2, 8, 9], [1, 1, 0.5, 0.6], "linear"),
    "linear_fractional_up": ([1, 1, 4, 4], [1, 1, 1.5, 2.5], "linear"),
}


@pytest.mark.parametrize("case", sorted(_RESIZE10_CASES))
def test_resize_opset10_matches_onnxruntime(case):
    # Resize-10's input 1 is scales (no roi) and its coordinates are asymmetric: TVM's
    # (Resize-18's) converter read scales as roi and failed; onnx.reference has no Resize-10
    from tests.conftest import assert_close, ort_run

    shape, scales, mode = _RESIZE10_CASES[case]
    x = RNG.standard_normal(shape).astype(np.float32)
    node = helper.make_node("Resize", ["x", "scales"], ["y"], mode=mode)
    model = onnx_model(node, [value_info("x", F, shape)], [untyped_output("y")], 10,
                       [initializer("scales", np.array(scales, np.float32))])
    want = ort_run(model, {"x": x})
    model.graph.output[0].CopyFrom(value_info("y", F, list(want[0].shape)))
    assert_close(compiler.compile(model).session().run(None, {"x": x}), want)


# --------------------------------------------------------------------------- #
# Resize over a symbolic image size (one artifact for every size)
# --------------------------------------------------------------------------- #


def _symbolic_resize(how: str, static_input: bool = False, **attrs):
    """Conv 3x3/2 over a [1, 3, h, w] image, then Resize of its map: to the image's own
    size (``how="sizes"``: ``Shape -> Slice -> Concat``, as torch exports
    ``F.interpolate(size=x.shape[-2:])``) or by constant ``scales`` [1, 1, 2, 3];
    ``static_input``: the map is first pooled to 1 x 1 (an ASPP pooling branch resized to
    a symbolic size)."""
    from onnx import TensorProto, numpy_helper

    n = helper.make_node
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array([4], np.int64), "four"),
             numpy_helper.from_array(np.array([1, 4], np.int64), "nc"),
             numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "scales")]
    nodes = [n("Conv", ["x", "w"], ["c"], pads=[1] * 4, strides=[2, 2])]
    src = "c"
    if static_input:
        nodes.append(n("GlobalAveragePool", ["c"], ["g"]))
        src = "g"
    if how == "sizes":
        nodes += [n("Shape", ["x"], ["s"]), n("Slice", ["s", "two", "four"], ["hw"]),
                  n("Concat", ["nc", "hw"], ["sz"], axis=0),
                  n("Resize", [src, "", "", "sz"], ["y"], **attrs)]
    else:
        nodes.append(n("Resize", [src, "", "scales"], ["y"], **attrs))
    g = helper.make_graph(
        nodes, "symbolic_resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("how,static_input,attrs", [
    ("sizes", False, dict(mode="linear")),  # FCN / DeepLab heads (half_pixel)
    ("sizes", False, dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel")),
    ("sizes", False, dict(mode="linear", coordinate_transformation_mode="align_corners")),
    ("sizes", False, dict(mode="cubic")),
    ("sizes", False, dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                          nearest_mode="floor")),  # torchvision FPN's F.interpolate(size=)
    ("sizes", True, dict(mode="linear")),  # ASPP pooling: 1 x 1 -> the image's size
    ("scales", False, dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                           nearest_mode="floor")),  # nn.Upsample(scale_factor=...)
    ("scales", False, dict(mode="linear")),
], ids=["sizes_linear", "sizes_linear_pytorch", "sizes_align_corners", "sizes_cubic", "sizes_nearest",
        "pooled_to_sizes", "scales_nearest", "scales_linear"])
def test_resize_over_a_symbolic_image_is_one_artifact(how, static_input, attrs, tmp_path):
    """Every size from one exported artifact (TVM's converter refused sizes it could not
    read as integers: FCN's and DeepLabV3's heads with a dynamic image), against
    onnxruntime at sizes odd, prime and below the opt."""
    from tests.conftest import assert_close, ort_run
    import runtime

    model = _symbolic_resize(how, static_input, **attrs)
    cm = compiler.compile(model, dims={"h": (5, 96, 64), "w": (5, 96, 64)})
    assert "kernel_table" in cm.report, cm.report  # not a per-shape (deferred) build
    cm.export(str(tmp_path / "m.so"))
    sess = runtime.load(str(tmp_path / "m.so"))
    for hw in [(64, 64), (17, 31), (5, 96), (41, 8)]:
        x = RNG.standard_normal((1, 3, *hw)).astype(np.float32)
        got = sess.run(None, {"x": x})
        assert_close(got, ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_resize_over_a_symbolic_image_refuses_non_integer_scales():
    """floor(n * 1.5) over a symbolic n would not sample at ONNX's coordinates: refused,
    naming the node; the model then compiles per shape (a DynamicModel saying why)."""
    model = _symbolic_resize("scales", mode="linear")
    model.graph.initializer[-1].CopyFrom(
        initializer("scales", np.array([1, 1, 1.5, 2], np.float32)))
    cm = compiler.compile(model, dims={"h": (5, 96, 64), "w": (5, 96, 64)})
    assert "kernel_table" not in cm.report
    assert "Resize" in cm.report["why"] and "integer scales only" in cm.report["why"], \
        cm.report["why"]


def test_tf_crop_and_resize_5d_with_a_roi_input_extrapolates_in_depth():
    """TVM's resize3d dropped the depth test of tf_crop_and_resize's extrapolation: with a
    roi input reaching outside the volume in depth only, interpolated values came out where
    onnxruntime gives extrapolation_value."""
    from tests.conftest import assert_close, ort_run

    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear",
                            coordinate_transformation_mode="tf_crop_and_resize")
    model = onnx_model(node, [value_info("x", F, [1, 1, 3, 4, 5]), value_info("roi", F, [10])],
                       [value_info("y", F, [1, 1, 6, 8, 10])], 18,
                       [initializer("scales", np.array([1, 1, 2, 2, 2], np.float32))])
    x = np.random.default_rng(0).standard_normal((1, 1, 3, 4, 5)).astype(np.float32)
    roi = np.array([0, 0, -0.3, 0.1, 0.1, 1, 1, 1.4, 0.9, 0.9], np.float32)
    got = compiler.compile(model).session().run(None, {"x": x, "roi": roi})
    assert_close(got, ort_run(model, {"x": x, "roi": roi}))


def test_a_roi_that_only_tf_crop_and_resize_reads_is_ignored_by_the_others():
    """A roi whose length fits no axis count, given with coordinate_transformation_mode
    half_pixel (which ignores roi, as onnxruntime does), was refused."""
    from tests.conftest import assert_close, ort_run

    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="cubic")
    model = onnx_model(node, [value_info("x", F, [1, 3, 8, 8])],
                       [value_info("y", F, [1, 3, 16, 16])], 18,
                       [initializer("roi", np.array([0.1, 0.2, 0.9, 0.8], np.float32)),
                        initializer("scales", np.array([1, 1, 2, 2], np.float32))])
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_close(compiler.compile(model).session().run(None, {"x": x}), ort_run(model, {"x": x}))
