"""cpu.pool_strided: structure under AVX-512 / AVX2 Targets, numerics against onnxruntime
(1-D, 2-D, 3-D; odd sizes, padding, ceil mode), negatives."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from schedules.cpu.pool_strided import PoolStrided, x_tile
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc

ZNVER3 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


@pytest.mark.parametrize("target", [TARGET, ZNVER3])
def test_structure_3d_avg_per_plane_tasks_phase_split_division_in_write_back(target):
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.avg_pool3d(x, 2, strides=2)),
                       [(1, 16, 8, 28, 28)], "pool")
    text = PoolStrided().apply(f, target).mod["main"].script()
    assert "T.parallel(T.int64(64))" in text           # (image, channel, output plane)
    # the task's input planes copied as 2 phases of 14 columns: [.., w % 2, .., w // 2]
    assert "T.sblock_alloc_buffer((T.int64(1), T.int64(16), T.int64(2), T.int64(8), " \
        "T.int64(28), T.int64(14)))" in text
    assert "T.vectorized(T.int64(14))" in text          # a row of outputs, TIR-vectorised
    assert text.count("T.unroll(T.int64(2))") >= 4      # z, y taps, x taps' phases, copy
    assert "pool_sum_init" in text and 'scope="local"' in text   # register accumulators
    # the division is the write-back's, inside the task
    assert 'T.sblock("pool_avg")' not in text
    assert text.index("T.parallel") < text.index("/ T.Cast")


@pytest.mark.parametrize("target", [TARGET, ZNVER3])
def test_structure_1d_and_padded_2d(target):
    from compiler import lowering

    lowering.install()  # onnxc's max pool: int32 order keys (legalize_pool)
    f1 = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool1d(x, 3, strides=2)),
                        [(1, 32, 100)], "pool")
    t1 = PoolStrided().apply(f1, target).mod["main"].script()
    assert "T.parallel(T.int64(32))" in t1 and "T.vectorized(T.int64(49))" in t1
    f2 = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(x, 3, strides=2,
                                                                      padding=1)),
                        [(1, 16, 28, 28)], "pool")
    t2 = PoolStrided().apply(f2, target).mod["main"].script()
    assert "T.parallel(T.int64(16))" in t2
    # the padded plane is built inside the channel's task, split into 2 phases of 15
    assert t2.index("T.parallel") < t2.index('T.sblock("pad_temp")')
    # (of the max pool's int32 order keys: compiler/lowering/legalize_pool.py)
    assert "T.sblock_alloc_buffer((T.int64(1), T.int64(16), T.int64(2), T.int64(30), " \
        'T.int64(15)), "int32")' in t2
    # taps rx = 2q + r: phase r at x + q (the window's 3 of 2 x 2 under a predicate)
    assert "T.where(" in t2 and "T.vectorized(T.int64(14))" in t2


def test_rows_of_no_vector_tile_keep_the_plain_loop():
    # 199 outputs per row (a prime above 4 vectors): no tile of whole vectors, the x loop
    # is left to LLVM's loop vectoriser as before
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool1d(x, 3, strides=2)),
                       [(1, 8, 400)], "pool")
    text = PoolStrided().apply(f, TARGET).mod["main"].script()
    assert "T.vectorized" not in text and "T.unroll(T.int64(3))" in text


def test_x_tile():
    assert x_tile(56, 16) == 56 and x_tile(49, 8) == 49       # whole rows up to 64
    assert x_tile(2000, 16) == 16 and x_tile(2000, 8) == 40   # divisors of whole vectors
    assert x_tile(199, 16) == 0 and x_tile(66, 16) == 0       # none: LLVM's path


def test_rejects_stride_1_global_and_depthwise():
    s1 = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(x, 3, padding=1)),
                        [(1, 16, 28, 28)], "pool")
    assert PoolStrided().apply(s1, TARGET) is None   # contiguous: pool2d_nchw vectorises
    s1d = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.avg_pool1d(x, 3)),
                         [(1, 16, 64)], "pool")
    assert PoolStrided().apply(s1d, TARGET) is None  # tiled_reduction's
    gap = fused_primfunc(lambda bb, x: bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True)),
                         [(1, 16, 7, 7)], "mean")
    assert PoolStrided().apply(gap, TARGET) is None
    dw = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, strides=2,
                                                                     groups=8)),
                        [(1, 8, 16, 16), (8, 1, 3, 3)], "conv2d")
    assert PoolStrided().apply(dw, TARGET) is None   # two inputs: a depthwise conv


def _pool_model(op, attrs, shape):
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("op,attrs,shape", [
    ("MaxPool", dict(kernel_shape=[3], strides=[2]), (1, 16, 4001)),             # odd length
    ("AveragePool", dict(kernel_shape=[4], strides=[4], pads=[1, 2]), (2, 8, 30)),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 8, 57, 57)),
    ("AveragePool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), (1, 8, 8, 28, 28)),
    ("MaxPool", dict(kernel_shape=[3, 3, 3], strides=[1, 2, 2], pads=[1] * 6, ceil_mode=1),
     (1, 4, 5, 13, 13)),
    ("AveragePool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6,
                         count_include_pad=1), (1, 4, 7, 9, 11)),
])
def test_numerics_against_onnxruntime(op, attrs, shape):
    rng = np.random.default_rng(2)
    check_against_ort(_pool_model(op, attrs, shape),
                      {"x": rng.standard_normal(shape).astype("float32")},
                      "cpu.pool_strided", layout="NCHW")


def _asm(sch, target):
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                      target=target)
    mods = [lib.mod] if hasattr(lib, "mod") else [lib]
    for m in mods + list(getattr(mods[0], "imports", [])):
        try:
            return m.inspect_source("asm")
        except Exception:  # noqa: BLE001 - a module without assembly (the host wrapper)
            continue
    raise AssertionError("no assembly")


def test_llvm_vectorises_the_plain_strided_x_loop():
    """The rule relies on LLVM's loop vectoriser for the stride-2 reads: packed maxima
    on ymm registers (AVX2) and the shuffles of an interleaved load group."""
    import re

    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool1d(x, 3, strides=2)),
                       [(1, 8, 400)], "pool")
    src = _asm(PoolStrided().apply(f, ZNVER3), ZNVER3)
    # packed maxima, or the packed compare + blend of the NaN-skipping max (legalize_pool)
    assert re.search(r"(vmaxps|vblendvps)\s+[^\n]*ymm", src)
    assert re.search(r"vperm|vshuf|vunpck", src)
