"""cpu.row_reduction: structure under a Target, numerics against onnxruntime, negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from schedules.cpu.row_reduction import RowReduction
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def _layer_norm(bb, x, g, b):
    return bb.emit(relax.op.nn.layer_norm(x, g, b, axes=[-1]))


def test_structure_layer_norm_rows_parallel_reductions_vectorised():
    f = fused_primfunc(_layer_norm, [(2, 64, 768), (768,), (768,)], "layer_norm")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(128))" in text  # the two leading axes fused: 128 rows
    # each reduction keeps 2 vectors of partial sums, the epilogue is vectorised
    assert text.count("T.vectorized(T.int64(32))") >= 2 and "_rf" in text
    assert "T.vectorized(T.int64(16))" in text


def test_structure_softmax_max_and_sum_rfactored():
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)),
                       [(12, 128, 128)], "softmax")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "T_softmax_maxelem_rf" in text and "T_softmax_expsum_rf" in text
    assert "T.parallel(T.int64(1536))" in text


def test_short_rows_stay_scalar_but_scheduled():
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)), [(6, 10)],
                       "softmax")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "_rf" not in text and "T.parallel" in text


def test_rejects_matmul_and_non_last_axis_reductions():
    mm = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                        [(8, 16), (16, 32)], "matmul")
    assert RowReduction().apply(mm, TARGET) is None
    sm0 = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=0)),
                         [(64, 32)], "softmax")
    assert RowReduction().apply(sm0, TARGET) is None
    red = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(8, 64)], "sum")
    assert RowReduction().apply(red, TARGET) is None  # ends in a reduction: no row epilogue


@pytest.mark.parametrize("shape", [(2, 12, 16, 128), (3, 10), (4, 96), (3, 197), (2, 41)])
def test_numerics_softmax(shape):
    rng = np.random.default_rng(0)
    model = onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="sm")],
                       [("x", shape)], [("y", shape)])
    x = (rng.standard_normal(shape) * 8).astype("float32")
    x.reshape(-1, shape[-1])[0, :] = -np.inf  # fully masked row: NaN as onnxruntime
    x.reshape(-1, shape[-1])[1, 1:] = -np.inf  # one live logit: exactly 1 and 0s
    check_against_ort(model, {"x": x}, "cpu.row_reduction")


@pytest.mark.parametrize("shape", [(1, 128, 768), (5, 48), (7, 20), (3, 197)])
def test_numerics_layer_norm(shape):
    rng = np.random.default_rng(1)
    n = shape[-1]
    model = onnx_model(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                          epsilon=1e-5, name="ln")],
        [("x", shape)], [("y", shape)],
        {"g": rng.standard_normal(n).astype("float32"),
         "b": rng.standard_normal(n).astype("float32")})
    x = (rng.standard_normal(shape) * 3 + 5).astype("float32")  # |mean| > std
    check_against_ort(model, {"x": x}, "cpu.row_reduction")

