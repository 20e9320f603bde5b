"""cpu.tiled_reduction: structure under AVX-512 and AVX2 targets, numerics against
onnxruntime, and the reductions it must leave to other rules."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax

from schedules.cpu.tiled_reduction import TiledReduction, tile
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

AVX2 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


def _sum_axis1(shape):
    return fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1], keepdims=True)),
                          [shape], "sum")


def _dw_conv1d(c, w, k):
    return fused_primfunc(
        lambda bb, x, wt: bb.emit(relax.op.nn.conv1d(x, wt, padding=k // 2, groups=c)),
        [(1, c, w), (c, 1, k)], "conv1d")


@pytest.mark.parametrize("target,lanes", [(TARGET, 16), (AVX2, 8)])
def test_structure_vectorised_register_tile(target, lanes):
    text = TiledReduction().apply(_sum_axis1((1, 512, 3000)), target).mod["main"].script()
    assert "T.parallel" in text and "_local" in text
    assert f"T.vectorized(T.int64({lanes}))" in text or "T.vectorized(T.int64(" in text
    text = TiledReduction().apply(_dw_conv1d(64, 500, 31), target).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized" in text and "T.unroll" in text


def test_tile_fits_budget():
    assert tile(512, 3000, 8, 12) == (8, 8)        # 375 vectors: 1 per row, 8 rows
    assert tile(6, 64, 8, 12) == (3, 32)           # 4 vectors x 3 rows = 12 accumulators
    yt, xt = tile(64, 500, 16, 24)
    assert 500 % xt == 0 and yt * -(-xt // 16) <= 24


def test_leaves_row_reductions_and_strided_windows():
    # a row sum reads x[i, k]: vectorising i would gather
    row = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(64, 256)], "sum")
    assert TiledReduction().apply(row, TARGET) is None
    # a stride-2 window reads x[2 i + r]: a gather too
    pool = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool1d(x, 3, 2, padding=1)),
                          [(1, 16, 400)], "max_pool1d")
    assert TiledReduction().apply(pool, TARGET) is None


@pytest.mark.parametrize("op,shape,axes", [
    ("ReduceSum", (1, 96, 301), [1]),       # non-last axis, odd length
    ("ReduceMax", (2, 33, 64), [1]),
    ("ReduceMean", (1, 8, 5, 40), [1, 2]),
])
def test_numerics_reductions(op, shape, axes):
    rng = np.random.default_rng(0)
    out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    if op == "ReduceSum":  # axes is an input from opset 13
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1, name="r")
        inits = {"axes": np.array(axes, np.int64)}
    else:
        node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=1, name="r")
        inits = {}
    model = onnx_model([node], [("x", shape)], [("y", out)], inits)
    check_against_ort(model, {"x": rng.standard_normal(shape).astype("float32")},
                      "cpu.tiled_reduction")


@pytest.mark.parametrize("c,w,k", [(64, 500, 31), (24, 77, 5)])
def test_numerics_depthwise_conv1d(c, w, k):
    rng = np.random.default_rng(1)
    wt = rng.standard_normal((c, 1, k)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k], pads=[k // 2] * 2,
                              group=c, name="dw"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = onnx_model(nodes, [("x", (1, c, w))], [("y", (1, c, w))], {"w": wt})
    check_against_ort(model, {"x": rng.standard_normal((1, c, w)).astype("float32")},
                      "cpu.tiled_reduction")
