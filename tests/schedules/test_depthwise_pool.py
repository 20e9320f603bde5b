"""cpu.depthwise_conv2d_nchw and cpu.pool2d_nchw: structure under a Target, numerics
against onnxruntime, negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from schedules.cpu.depthwise import DepthwiseConv2dNCHW
from schedules.cpu.pool import Pool2dNCHW, Pool2dNCHWc, task_rows
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def _dw(c, stride=1, pad=1):
    def build(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=c))
        return bb.emit(relax.op.clip(relax.op.add(y, b), 0, 6))
    return build


def test_depthwise_structure_per_channel_tasks_epilogue_inlined():
    f = fused_primfunc(_dw(32), [(1, 32, 28, 28), (32, 1, 3, 3), (1, 32, 1, 1)], "conv2d")
    sch = DepthwiseConv2dNCHW().apply(f, TARGET)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "T.parallel(T.int64(32))" in text      # one task per (image, channel)
    assert "T.vectorized(T.int64(14))" in text     # 28 wide: two rows of 14 lanes
    assert "_local" in text and "T.unroll" in text
    assert 'T.sblock("T_add")' not in text and 'T.sblock("compute")' not in text


@pytest.mark.parametrize("k,stride,side,rows_loop", [
    (7, 2, 83, True),    # PNASNet-5-large: 7 x 7 x 7 rows of strided gathers
    (5, 2, 83, True),
    (3, 2, 83, False),   # small windows stay unrolled
    (5, 1, 42, False),   # stride 1: contiguous taps stay unrolled (a loop was slower)
])
def test_depthwise_large_strided_window_keeps_its_rows_a_loop(k, stride, side, rows_loop):
    """A strided window whose unrolled taps x rows exceed MAX_UNROLLED_STRIDED keeps the
    window's row loop (LLVM took 5.6 s on PNASNet's 7 x 7 stride-2 kernel; it ran 5.0 ->
    2.7 ms as a loop); the taps across a row and the tile's rows stay unrolled."""
    f = fused_primfunc(_dw(16, stride, k // 2), [(1, 16, side, side), (16, 1, k, k),
                                                 (1, 16, 1, 1)], "conv2d")
    text = DepthwiseConv2dNCHW().apply(f, TARGET).mod["main"].script()
    rows = next(ln for ln in text.splitlines() if ln.strip().startswith("for") and
                "ry in" in ln)  # "for rc, ry in T.grid(...)" when it is a loop
    assert ("T.unroll" not in rows) == rows_loop, rows
    assert any(ln.strip().startswith("for rx in T.unroll") for ln in text.splitlines())


def test_depthwise_rejects_dense_and_grouped_conv():
    dense = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1)),
                           [(1, 1, 8, 8), (4, 1, 3, 3)], "conv2d")   # C=1: rc=1 too
    assert DepthwiseConv2dNCHW().apply(dense, TARGET) is None
    grouped = fused_primfunc(
        lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=2)),
        [(1, 8, 8, 8), (8, 4, 3, 3)], "conv2d")
    assert DepthwiseConv2dNCHW().apply(grouped, TARGET) is None
    pool = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(x, (3, 3))),
                          [(1, 16, 8, 8)], "pool")
    assert DepthwiseConv2dNCHW().apply(pool, TARGET) is None


def test_pool_structure_and_negatives():
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), strides=2,
                                                                     padding=1)),
                       [(1, 16, 28, 28)], "pool")
    text = Pool2dNCHW().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(16))" in text and "T.vectorized(T.int64(14))" in text
    assert 'T.sblock("pool_avg")' not in text   # the division is in the write-back
    gap = fused_primfunc(lambda bb, x: bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True)),
                         [(1, 16, 7, 7)], "mean")
    assert Pool2dNCHW().apply(gap, TARGET) is None
    conv = fused_primfunc(_dw(16), [(1, 16, 8, 8), (16, 1, 3, 3), (1, 16, 1, 1)], "conv2d")
    assert Pool2dNCHW().apply(conv, TARGET) is None


@pytest.mark.parametrize("k,stride,pad,shape", [
    (3, 1, 1, (1, 24, 13, 11)),   # odd sizes
    (3, 2, 1, (1, 16, 15, 15)),   # strided, MobileNetV2's downsampling
    (5, 1, 2, (1, 8, 9, 20)),     # 5x5
    (3, 2, 0, (1, 8, 12, 12)),    # unpadded: no pad block
    (7, 2, 3, (1, 12, 83, 83)),   # PNASNet's 7 x 7 stride 2: the window's rows a loop
    (5, 2, 2, (1, 12, 31, 29)),
])
def test_depthwise_numerics(k, stride, pad, shape):
    rng = np.random.default_rng(0)
    c = shape[1]
    w = rng.standard_normal((c, 1, k, k)).astype("float32")
    b = rng.standard_normal((c,)).astype("float32")
    ho = (shape[2] + 2 * pad - k) // stride + 1
    wo = (shape[3] + 2 * pad - k) // stride + 1
    out = (1, c, ho, wo)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k],
                         strides=[stride] * 2, pads=[pad] * 4, group=c, name="dw"),
        helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="relu6"),
    ]
    model = onnx_model(nodes, [("x", shape)], [("y", out)],
                       {"w": w, "b": b, "lo": np.array(0, "float32"),
                        "hi": np.array(6, "float32")})
    check_against_ort(model, {"x": rng.standard_normal(shape).astype("float32")},
                      "cpu.depthwise_conv2d_nchw", layout="NCHW")


@pytest.mark.parametrize("op,attrs,shape", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2]), (1, 8, 111, 111)),   # SqueezeNet
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]), (1, 8, 28, 28)),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), (1, 4, 14, 14)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 8, 13, 13)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]), (1, 8, 28, 28)),
])
def test_pool_numerics(op, attrs, shape):
    rng = np.random.default_rng(1)
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    import onnx
    from onnx import TensorProto

    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m)
    # stride-2 windows go to cpu.pool_strided (listed first), stride 1 stays here
    rule = "cpu.pool_strided" if attrs["strides"][1] > 1 else "cpu.pool2d_nchw"
    check_against_ort(m, {"x": rng.standard_normal(shape).astype("float32")}, rule,
                      layout="NCHW")


def test_pool_nchwc_structure_and_negatives():
    """ResNet's stem pool in NCHW16c: parallel over (image, channel block, output row),
    the 16-lane channel block vectorised, a register row of pixels, taps unrolled."""
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(
        x, (3, 3), strides=2, padding=1, layout="NCHW16c")), [(1, 4, 112, 112, 16)], "pool")
    sch = Pool2dNCHWc().apply(f, TARGET)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "T.parallel(T.int64(224))" in text           # 4 channel blocks x 56 rows
    assert "T.vectorized(T.int64(16))" in text and "T.unroll" in text
    # the tile's accumulators in a task's stack buffer ("global" below 1 KB), not a
    # "local" one (a workspace call per task, which LLVM cannot keep in registers)
    assert "pool_max_global" in text and "_local" not in text
    # per pixel of the row tile, its taps innermost: the accumulator stays in a register
    # (taps outside the pixels left a max pool's NaN-initialised tile in memory: 6.5x slower)
    lines = text.splitlines()
    pixel = next(i for i, t in enumerate(lines) if "3_1 in T.unroll(T.int64(8))" in t)
    taps = next(i for i, t in enumerate(lines) if "for rv0 in T.unroll(T.int64(3))" in t)
    assert pixel < taps
    assert Pool2dNCHW().apply(f, TARGET) is None        # the NCHW rule does not take it
    nchw = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(x, (3, 3))),
                          [(1, 16, 8, 8)], "pool")
    assert Pool2dNCHWc().apply(nchw, TARGET) is None
    gap = fused_primfunc(lambda bb, x: bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True)),
                         [(1, 2, 7, 7, 16)], "mean")
    assert Pool2dNCHWc().apply(gap, TARGET) is None


def test_pool_nchwc_tasks_of_several_rows():
    """A stride-1 3x3 pool over 12 blocks of 28 x 28 (GoogLeNet's inception branch pool):
    tasks of 14 output rows, whose 16 padded input rows are built once per task."""
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(
        x, (3, 3), strides=1, padding=1, layout="NCHW16c")), [(1, 12, 28, 28, 16)], "pool")
    text = Pool2dNCHWc().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(24))" in text            # 12 blocks x 2 tasks of 14 rows
    assert task_rows(12, 28, 31, 3, 16, 1, 2) == 14
    assert task_rows(4, 56, 115, 3, 16, 2, 2) == 1      # the stem pool's rows fill L1
    assert task_rows(2, 8, 10, 3, 16, 1, 2) == 2        # 4 tasks per core first


@pytest.mark.parametrize("pool, attrs, side", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), 12),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]), 23),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), 12),
])
def test_pool_nchwc_matches_onnxruntime(pool, attrs, side):
    """conv -> pool -> conv: convert_layout keeps the pool in NCHW16c, our rule schedules it."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.2
    model = onnx_model(
        [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node(pool, ["a"], ["p"], **attrs),
         helper.make_node("Conv", ["p", "w2"], ["y"])],
        [("x", [1, 3, 23, 23])], [("y", [1, 32, side, side])], {"w1": w1, "w2": w2})
    feeds = {"x": rng.standard_normal((1, 3, 23, 23)).astype(np.float32)}
    check_against_ort(model, feeds, "cpu.pool2d_nchwc")


def test_uint8_max_pool_takes_the_pool_rule():
    """A MaxPool over 8-bit activations (onnxruntime's QOperator ResNet-50 pools its uint8
    stem output: 1.96 ms on the fallback, onnxruntime 0.07): the window rule, exact."""
    import compiler
    import onnxruntime as ort
    from onnx import TensorProto

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1], name="pool")
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 16, 56, 56])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 16, 28, 28])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(model, target="host")
    rules = {r["rule"] for r in cm.report["kernel_table"]}
    assert rules & {"cpu.pool2d_nchw", "cpu.pool2d_nchwc"} and "fallback" not in rules, rules
    x = np.random.default_rng(0).integers(0, 256, (1, 16, 56, 56)).astype(np.uint8)
    (got,) = cm.session().run(None, {"x": x})
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
