"""cpu.elementwise: kernels without a reduction get the loop schedule under their own name;
structure under AVX-512 and AVX2 targets, numerics against onnxruntime, and what it leaves."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax

from schedules.cpu.elementwise import Elementwise
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

AVX2 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


def _swish(shape):
    return fused_primfunc(
        lambda bb, x: bb.emit(relax.op.multiply(x, relax.op.sigmoid(x))), [shape], "sigmoid")


@pytest.mark.parametrize("target,lanes", [(TARGET, 16), (AVX2, 8)])
def test_structure_vectorised_and_parallel(target, lanes):
    text = Elementwise().apply(_swish((1, 144, 56, 56)), target).mod["main"].script()
    assert "T.parallel" in text and f"T.vectorized(T.int64({lanes}))" in text
    blocks = text.count("T.sblock(") - text.count("T.sblock(\"root\")")
    assert blocks == 1  # sigmoid inlined into the multiply


def test_leaves_reductions():
    summed = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(64, 256)],
                            "sum")
    assert Elementwise().apply(summed, TARGET) is None


@pytest.mark.parametrize("shape", [(1, 144, 56, 56), (2, 5, 7, 3)])
def test_swish_against_onnxruntime(shape):
    # 56 x 56 divides the lanes after fusing; 7 x 3 does not (scalar inner loop)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    x = (np.random.default_rng(0).standard_normal(shape) * 30).astype(np.float32)
    x.flat[:5] = [np.nan, np.inf, -np.inf, -0.0, -100.0]
    check_against_ort(onnx_model(nodes, [("x", shape)], [("y", shape)]), {"x": x},
                      "cpu.elementwise")
