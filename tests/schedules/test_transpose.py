"""cpu.transpose_tiled: structure under AVX-512 / AVX2 Targets, numerics against
onnxruntime (tiles that do and do not divide), negatives."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax

from schedules.cpu.transpose import TransposeTiled
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

ZNVER3 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


@pytest.mark.parametrize("target,lanes", [(TARGET, 16), (ZNVER3, 8)])
def test_structure_nchw_to_nhwc_square_tiles_channels_vectorised(target, lanes):
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1])),
                       [(1, 64, 28, 32)], "transpose")
    text = TransposeTiled().apply(f, target).mod["main"].script()
    assert f"T.vectorized(T.int64({lanes}))" in text     # a whole vector of channels
    assert "T.parallel(T.int64(28))" in text             # (image, row) tasks
    # the x tile sits between the channel tiles and the channel lanes
    assert f"T.grid(T.int64({64 // lanes}), T.int64({32 // lanes}), T.int64({lanes}))" in text


def test_rejects_last_dim_kept_reductions_and_narrow_tiles():
    heads = fused_primfunc(lambda bb, x: bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3])),
                           [(1, 16, 4, 64)], "transpose")
    assert TransposeTiled().apply(heads, TARGET) is None   # innermost dim unchanged
    red = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(8, 64)], "sum")
    assert TransposeTiled().apply(red, TARGET) is None
    narrow = fused_primfunc(lambda bb, x: bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1])),
                            [(1, 3, 16, 16)], "transpose")
    assert TransposeTiled().apply(narrow, TARGET) is None  # 3 channels: no vector


@pytest.mark.parametrize("shape,perm", [
    ((1, 64, 14, 16), [0, 2, 3, 1]),   # NCHW -> NHWC, tiles divide
    ((2, 20, 7, 12), [0, 2, 3, 1]),    # odd: 20 channels, 12 wide (partial vectors)
    ((48, 40), [1, 0]),                # a matrix transpose
    ((1, 14, 14, 96), [0, 3, 1, 2]),   # NHWC -> NCHW
])
def test_numerics_against_onnxruntime(shape, perm):
    out = [shape[p] for p in perm]
    model = onnx_model([helper.make_node("Transpose", ["x"], ["y"], perm=perm, name="t")],
                       [("x", shape)], [("y", out)])
    x = np.random.default_rng(4).standard_normal(shape).astype("float32")
    check_against_ort(model, {"x": x}, "cpu.transpose_tiled")
