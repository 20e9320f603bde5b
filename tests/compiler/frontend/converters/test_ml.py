"""onnxc's converters in compiler/frontend/converters/ml.py (Binarizer, ArrayFeatureExtractor,
TreeEnsemble, TfIdfVectorizer, RoiAlign mode=max) against onnx.reference, RoiAlign mode=avg
against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import compiler
from compiler.errors import UnsupportedError
from tests.compiler.onnx_check import check, run_onnxc

RNG = np.random.default_rng(0)
ML = {"domain": "ai.onnx.ml", "extra_opsets": {"ai.onnx.ml": 3}}


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("threshold", [0.0, 0.7])
def test_binarizer(threshold):
    check("Binarizer", {"x": _f(3, 4)}, threshold=threshold, **ML)


@pytest.mark.parametrize("shape,idx", [((3, 5), [4, 0, 2]), ((2, 2, 6), [[1, 5]]), ((5,), [3])])
def test_array_feature_extractor(shape, idx):
    check("ArrayFeatureExtractor", {"x": _f(*shape), "i": np.array(idx, np.int64)}, **ML)


def _tree_attrs(modes, agg, membership=None, dtype=np.float32):
    # two trees: tree 0 = nodes 0..2 (root 0), tree 1 = node 3 (root 3); 6 leaves
    attrs = dict(
        nodes_featureids=[0, 1, 2, 1], nodes_modes=numpy_helper.from_array(
            np.array(modes, np.uint8), "m"),
        nodes_splits=numpy_helper.from_array(np.array([0.1, -0.3, 0.5, 0.0], dtype), "s"),
        nodes_truenodeids=[1, 0, 2, 4], nodes_trueleafs=[0, 1, 1, 1],
        nodes_falsenodeids=[2, 1, 3, 5], nodes_falseleafs=[0, 1, 1, 1],
        leaf_targetids=[0, 1, 0, 1, 0, 1],
        leaf_weights=numpy_helper.from_array(
            np.array([1.5, -2.0, 0.25, 3.0, -1.0, 0.5], dtype), "w"),
        tree_roots=[0, 3], n_targets=2, aggregate_function=agg, post_transform=0)
    if membership is not None:
        attrs["membership_values"] = numpy_helper.from_array(np.array(membership, dtype), "v")
    return attrs


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
def test_tree_ensemble_aggregates(agg):
    x = _f(16, 3)
    check("TreeEnsemble", {"x": x}, domain="ai.onnx.ml", extra_opsets={"ai.onnx.ml": 5},
          **_tree_attrs([0, 3, 1, 2], agg))


def test_tree_ensemble_membership_and_double():
    x = RNG.integers(0, 4, (12, 3)).astype(np.float64)
    check("TreeEnsemble", {"x": x}, domain="ai.onnx.ml", extra_opsets={"ai.onnx.ml": 5},
          **_tree_attrs([6, 4, 5, 0], 1, membership=[1.0, 3.0, np.nan], dtype=np.float64))


def test_tree_ensemble_refuses_post_transform():
    attrs = _tree_attrs([0, 3, 1, 2], 1)
    attrs["post_transform"] = 1
    with pytest.raises(UnsupportedError, match="post_transform"):
        run_onnxc("TreeEnsemble", {"x": _f(4, 3)}, domain="ai.onnx.ml", domain_opset=5,
                  out_shape=[4, 2],
                  **attrs)


POOL = dict(ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5, 6],
            pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])


@pytest.mark.parametrize("mode,lo,hi,skip,weights", [
    ("TF", 1, 2, 0, None), ("TF", 2, 2, 3, None), ("IDF", 1, 2, 1, [0.5] * 7),
    ("TFIDF", 1, 2, 2, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]), ("TF", 1, 1, 0, None),
])
@pytest.mark.parametrize("shape", [(12,), (2, 6)])
def test_tfidf_vectorizer(mode, lo, hi, skip, weights, shape):
    x = RNG.integers(2, 9, shape).astype(np.int32)
    attrs = dict(POOL, mode=mode, min_gram_length=lo, max_gram_length=hi, max_skip_count=skip)
    if weights:
        attrs["weights"] = weights
    check("TfIdfVectorizer", {"x": x}, opset=9, **attrs)


@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_max(ctm):
    x = _f(2, 3, 8, 9)
    rois = np.array([[0.5, 1.0, 6.0, 7.0], [2.0, 0.2, 8.5, 5.0], [-1.0, -0.5, 3.0, 9.5]],
                    np.float32)
    check("RoiAlign", {"x": x, "rois": rois, "b": np.array([1, 0, 1], np.int64)}, opset=16,
          mode="max", output_height=3, output_width=2, sampling_ratio=2, spatial_scale=0.9,
          coordinate_transformation_mode=ctm)


def test_roi_align_max_refuses_adaptive_sampling():
    with pytest.raises(UnsupportedError, match="sampling_ratio=0"):
        run_onnxc("RoiAlign", {"x": _f(1, 1, 4, 4), "rois": np.array([[0, 0, 3, 3]], np.float32),
                               "b": np.array([0], np.int64)}, opset=16, out_shape=[1, 1, 2, 2],
                  mode="max", output_height=2, output_width=2)


@pytest.mark.parametrize("opset,ctm", [(16, None), (16, "output_half_pixel"), (10, None)])
@pytest.mark.parametrize("ratio", [2, 0])
def test_roi_align_avg(opset, ctm, ratio):
    """mode=avg against onnxruntime (onnx's reference reads opset 10 with opset 16's
    half-pixel default) at a spatial scale other than 1 (an FPN level): the half-pixel
    offset comes after the scale (TVM's converter put it before: every output off).  ROIs
    valid, inverted, empty, and reaching outside the image; an adaptive grid over an
    inverted or empty ROI gives 0."""
    from onnx import TensorProto
    from tests.conftest import ort_run

    x = _f(2, 3, 14, 15)
    rois = np.array([[2.0, 4.0, 40.0, 30.0], [50.0, 20.0, 10.0, 5.0], [8.0, 8.0, 8.0, 8.0],
                     [-10.0, -6.0, 70.0, 66.0]], np.float32)
    attrs = dict(output_height=3, output_width=4, sampling_ratio=ratio, spatial_scale=0.25)
    if ctm:
        attrs["coordinate_transformation_mode"] = ctm
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs)],
                          "g", [vi("x", TensorProto.FLOAT, list(x.shape)),
                                vi("rois", TensorProto.FLOAT, [4, 4]),
                                vi("b", TensorProto.INT64, [4])],
                          [vi("y", TensorProto.FLOAT, [4, 3, 3, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {"x": x, "rois": rois, "b": np.array([1, 0, 1, 0], np.int64)}
    got = compiler.compile(m).session().run(None, feeds)[0]
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-5)
