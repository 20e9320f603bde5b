"""cpu.conv2d_nchw: structure under a Target, numerics against onnxruntime, negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from schedules.cpu.conv2d import Conv2dNCHW
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def _conv(stride=1, pad=1, groups=1, epilogue=True):
    def build(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=groups))
        if epilogue:
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, b)))
        return y
    return build


def test_structure_3x3_with_epilogue_inlined():
    f = fused_primfunc(_conv(), [(1, 16, 14, 14), (32, 16, 3, 3), (1, 32, 1, 1)], "conv2d")
    sch = Conv2dNCHW().apply(f, TARGET)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "T.parallel" in text and "T.vectorized" in text and "T.unroll" in text
    assert "_local" in text  # register tile
    # bias + relu applied in the tile's write-back: no separate epilogue blocks left
    assert 'T.sblock("T_add")' not in text and 'T.sblock("compute")' not in text


def test_structure_1x1_is_one_gemm_axis():
    f = fused_primfunc(_conv(pad=0, epilogue=False), [(1, 32, 8, 8), (64, 32, 1, 1), (1,)],
                       "conv2d")
    text = Conv2dNCHW().apply(f, TARGET).mod["main"].script()
    assert "T.vectorized(T.int64(32))" in text  # 8x8 fused, two 16-lane vectors


def test_structure_1x1_rows_no_vector_divides_take_whole_vectors_of_rows():
    # 28-pixel rows under 16 lanes: neither 16 nor 32 pixels are whole rows or part of
    # one, so the tile takes 112 pixels (4 rows, 7 vectors) of the flattened GEMM axis,
    # not 14-lane row vectors (ShuffleNetV2's 58-channel 1x1 convs: a third of
    # onnxruntime's speed)
    from schedules.cpu.conv2d import _pixel_tile

    assert _pixel_tile(28, 28, 16) == 112 and _pixel_tile(56, 56, 16) == 112
    assert _pixel_tile(28, 28, 8) == 56 and _pixel_tile(8, 8, 16) == 32
    assert _pixel_tile(14, 14, 16) == 14  # no whole vector: a row, one 14-lane vector
    f = fused_primfunc(_conv(pad=0), [(1, 58, 28, 28), (58, 58, 1, 1), (1, 58, 1, 1)], "conv2d")
    text = Conv2dNCHW().apply(f, TARGET).mod["main"].script()
    assert "T.vectorized(T.int64(16))" in text and "T.vectorized(T.int64(14))" not in text
    assert "T.unroll(T.int64(7))" in text  # the tile's 7 vectors


def test_rejects_pool_and_matmul():
    pool = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(x, (3, 3))),
                          [(1, 16, 8, 8)], "pool")
    assert Conv2dNCHW().apply(pool, TARGET) is None
    mm = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                        [(8, 16), (16, 32)], "matmul")
    assert Conv2dNCHW().apply(mm, TARGET) is None


@pytest.mark.parametrize("k,stride,pad,shape,f,g", [
    (3, 1, 1, (1, 8, 13, 11), 24, 1),   # odd widths, channels not a multiple of 16
    (1, 1, 0, (1, 16, 7, 7), 32, 1),    # 1x1 GEMM form, 49 columns
    (1, 1, 0, (1, 8, 12, 12), 16, 1),   # 1x1: a 16-wide tile would cross rows of 12
    (1, 1, 0, (1, 8, 4, 8), 16, 1),     # 1x1: tiles of whole rows
    (1, 1, 0, (1, 58, 28, 28), 58, 1),  # 1x1: tiles of 4 rows of 28 (ShuffleNetV2's 58 ch)
    (1, 1, 0, (1, 20, 14, 28), 12, 1),  # 1x1: 4 rows of 28 do not divide 14: row tiles
    (3, 2, 1, (1, 4, 15, 15), 16, 1),   # strided
    (7, 2, 3, (1, 3, 20, 20), 8, 1),    # ResNet stem shape, small
    (3, 1, 1, (1, 16, 9, 9), 16, 16),   # depthwise (legalized with a unit channel reduction)
])
def test_numerics_conv_bias_relu_add(k, stride, pad, shape, f, g):
    rng = np.random.default_rng(0)
    c = shape[1]
    w = rng.standard_normal((f, c // g, k, k)).astype("float32") * 0.3
    b = rng.standard_normal((f,)).astype("float32")
    ho = (shape[2] + 2 * pad - k) // stride + 1
    wo = (shape[3] + 2 * pad - k) // stride + 1
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[stride] * 2,
            pads=[pad] * 4, group=g, name="conv"),
        helper.make_node("Add", ["c", "r"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    out = (1, f, ho, wo)
    model = onnx_model(nodes, [("x", shape), ("r", out)], [("y", out)], {"w": w, "b": b})
    feeds = {"x": rng.standard_normal(shape).astype("float32"),
             "r": rng.standard_normal(out).astype("float32")}
    # pack_conv_weights would hand the conv to cpu.conv2d_packed; depthwise has its own rule
    check_against_ort(model, feeds, "cpu.depthwise_conv2d_nchw" if g > 1 else "cpu.conv2d_nchw",
                      disabled_passes=["pack_conv_weights"], layout="NCHW")


def test_structure_1x1_large_input_runs_over_packed_panels():
    # 64 channels x 64x64 pixels = 1 MB of input > PANEL_BYTES: panels of whole rows
    f = fused_primfunc(_conv(pad=0, epilogue=False), [(1, 64, 64, 64), (24, 64, 1, 1), (1,)],
                       "conv2d")
    text = Conv2dNCHW().apply(f, TARGET).mod["main"].script()
    assert "_global" in text  # the contiguous panel copy
    # parallel over the panels (one loop per panel), the channel blocks inside
    assert text.count("T.parallel") >= 1
    from schedules.cpu.conv2d import PANEL_BYTES, _panel
    p = _panel(64 * 64, 64, 32, 64)
    assert p and p % 64 == 0 and 64 * p * 4 <= PANEL_BYTES and (64 * 64) % p == 0


def test_small_1x1_keeps_the_plain_gemm_order():
    # the whole input (32 x 8 x 8) fits in L2: no panel copy
    f = fused_primfunc(_conv(pad=0, epilogue=False), [(1, 32, 8, 8), (64, 32, 1, 1), (1,)],
                       "conv2d")
    assert "_global" not in Conv2dNCHW().apply(f, TARGET).mod["main"].script()
    from schedules.cpu.conv2d import _panel
    assert _panel(64, 8, 32, 32) == 0
    # no panel divides a prime pixel count into whole tiles: the plain order is kept
    assert _panel(127 * 127, 127, 127, 1024) == 0


@pytest.mark.parametrize("c,f,hw", [
    (64, 24, (64, 64)),    # panels of whole rows, 24 output channels
    (96, 10, (45, 45)),    # odd width: tiles and panels of odd sizes
    (256, 150, (32, 32)),  # Segformer's classifier channels (150 classes), smaller image
])
def test_numerics_1x1_panels(c, f, hw):
    rng = np.random.default_rng(1)
    shape, out = (1, c) + hw, (1, f) + hw
    w = rng.standard_normal((f, c, 1, 1)).astype("float32") * 0.1
    b = rng.standard_normal((f,)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = onnx_model(nodes, [("x", shape)], [("y", out)], {"w": w, "b": b})
    feeds = {"x": rng.standard_normal(shape).astype("float32")}
    check_against_ort(model, feeds, "cpu.conv2d_nchw",
                      disabled_passes=["pack_conv_weights"], layout="NCHW")
