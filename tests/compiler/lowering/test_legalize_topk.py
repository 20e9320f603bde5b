"""legalize_topk: TopK as a rank count, against onnxruntime: ties (lower index first),
NaN, largest / smallest, any axis, integers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from tests.conftest import ort_run


def _topk(shape, k, axis, largest, dtype=np.float32):
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.INT32
    out = list(shape)
    out[axis] = k
    g = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)], "t",
        [helper.make_tensor_value_info("x", et, shape)],
        [helper.make_tensor_value_info("v", et, out),
         helper.make_tensor_value_info("i", TensorProto.INT64, out)],
        [numpy_helper.from_array(np.array([k], np.int64), "k")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("k", [1, 5, 40])
@pytest.mark.parametrize("largest", [1, 0])
def test_ties_and_nan_against_onnxruntime(k, largest):
    rng = np.random.default_rng(k)
    x = rng.integers(-4, 5, (6, 40)).astype(np.float32)  # many ties
    x[1, [3, 17]] = np.nan
    x[2, :] = 1.0                                         # a row of one value
    x[3, 5] = -np.inf
    m = _topk([6, 40], k, -1, largest)
    got = compiler.compile(m).session().run(None, {"x": x})
    want = ort_run(m, {"x": x})
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("axis", [0, 1])
def test_integers_and_other_axes(axis):
    x = np.random.default_rng(3).integers(-50, 50, (12, 9, 5)).astype(np.int32)
    m = _topk([12, 9, 5], 3, axis, 1, np.int32)
    got = compiler.compile(m).session().run(None, {"x": x})
    for g, w in zip(got, ort_run(m, {"x": x})):
        np.testing.assert_array_equal(g, w)
