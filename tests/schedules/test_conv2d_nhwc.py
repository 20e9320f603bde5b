"""cpu.conv2d_nhwc (``--layout NHWC``): tile choice, structure under a Target, numerics
against onnxruntime through convert_layout, negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from schedules.cpu.conv2d_nhwc import Conv2dNHWC, tile
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def test_tile_choice():
    assert tile(14, 64, 16) == (7, 32)      # 7 pixels x 2 vectors (7 x 4 = 28 would spill)
    xt, ft = tile(56, 32, 16)
    assert 56 % xt == 0 and ft % 16 == 0 and xt * ft // 16 <= 20


def test_structure_register_tile_and_epilogue():
    func = fused_primfunc(
        lambda bb, x, w, b: bb.emit(relax.op.nn.relu(relax.op.add(bb.emit(relax.op.nn.conv2d(
            x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO")), b))),
        [(1, 14, 14, 32), (3, 3, 32, 64), (1, 1, 1, 64)], "conv2d")
    text = Conv2dNHWC().apply(func, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(16))" in text and "_local" in text
    assert 'T.sblock("T_add")' not in text and 'T.sblock("compute")' not in text


def test_rejects_nchw_conv():
    conv = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1)),
                          [(1, 16, 8, 8), (16, 16, 3, 3)], "conv2d")
    assert Conv2dNHWC().apply(conv, TARGET) is None


@pytest.mark.parametrize("k,stride,pad,c,f,hw", [
    (3, 1, 1, 16, 32, 13), (1, 1, 0, 32, 64, 7), (3, 2, 1, 3, 16, 15), (1, 2, 0, 16, 48, 10),
])
def test_numerics(k, stride, pad, c, f, hw):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((f, c, k, k)) * 0.2).astype("float32")
    b = rng.standard_normal(f).astype("float32")
    oh = (hw + 2 * pad - k) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k],
                              strides=[stride] * 2, pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    model = onnx_model(nodes, [("x", (1, c, hw, hw))], [("y", (1, f, oh, oh))],
                       {"w": w, "b": b})
    check_against_ort(model, {"x": rng.standard_normal((1, c, hw, hw)).astype("float32")},
                      "cpu.conv2d_nhwc", layout="NHWC")
