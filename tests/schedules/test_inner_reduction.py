"""cpu.inner_reduction: structure under AVX-512 / AVX2 Targets, numerics against
onnxruntime (shapes that do and do not divide the vector tile), negatives."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax
from tvm.script import tirx as T

from schedules.cpu.inner_reduction import InnerReduction, vector_width
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

ZNVER3 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


@T.prim_func(s_tir=True)
def _max_from_minus_inf(x: T.Buffer((T.int64(3), T.int64(96)), "float32"),
                        r: T.Buffer((T.int64(3),), "float32")):
    for i0, k in T.grid(T.int64(3), T.int64(96)):
        with T.sblock("r"):
            v0, vk = T.axis.remap("SR", [i0, k])
            with T.init():
                r[v0] = T.float32("-inf")
            r[v0] = T.max(r[v0], x[v0, vk])


def _sum(axis, keepdims):
    return lambda bb, x: bb.emit(relax.op.sum(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("target,width", [(TARGET, 64), (ZNVER3, 32)])
def test_structure_last_axis_rows_parallel_partial_sums_vectorised(target, width):
    f = fused_primfunc(_sum([2], True), [(4, 8, 512)], "sum")
    text = InnerReduction().apply(f, target).mod["main"].script()
    assert "T.parallel(T.int64(32))" in text            # one task per output row
    assert f"T.vectorized(T.int64({width}))" in text    # 4 vectors of partial sums
    assert "_rf_init" in text and "_rf_update" in text  # init hoisted out of the loop


@pytest.mark.parametrize("target", [TARGET, ZNVER3])
def test_structure_reduce_all_half_vectors_when_no_whole_vector_divides(target):
    # 3000 has no multiple of 16 among its divisors: AVX-512 takes 3 x 8 lanes, as AVX2
    f = fused_primfunc(_sum(None, False), [(1, 64, 3000)], "sum")
    text = InnerReduction().apply(f, target).mod["main"].script()
    assert "T.vectorized(T.int64(24))" in text and "T.parallel" not in text
    assert vector_width(3000, 16) == 24 and vector_width(3000, 8) == 24


def test_structure_rms_norm_epilogue_vectorised():
    def rms(bb, x, g):
        ms = relax.op.mean(relax.op.multiply(x, x), axis=[-1], keepdims=True)
        return bb.emit(relax.op.multiply(relax.op.divide(x, relax.op.sqrt(ms)), g))
    f = fused_primfunc(rms, [(128, 1024), (1024,)], "mean")
    text = InnerReduction().apply(f, TARGET).mod["main"].script()
    assert "T.vectorized(T.int64(64))" in text and "T.vectorized(T.int64(16))" in text
    assert text.count("T.parallel") == 2  # the partial sums per row, the normalisation


def test_rejects_non_last_axis_strided_and_odd_reductions():
    ax1 = fused_primfunc(_sum([1], False), [(8, 64, 32)], "sum")
    assert InnerReduction().apply(ax1, TARGET) is None   # tiled_reduction's
    odd = fused_primfunc(_sum([1], False), [(8, 37)], "sum")
    assert InnerReduction().apply(odd, TARGET) is None   # no whole or half vector
    mm = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                        [(8, 64), (64, 32)], "matmul")
    assert InnerReduction().apply(mm, TARGET) is None    # B read [k, j]: a gather over k
    # ONNX ReduceMax starts from -inf, which rfactor's reducer registry does not know
    assert InnerReduction().apply(_max_from_minus_inf, TARGET) is None
    sm = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)),
                        [(8, 64)], "softmax")
    assert InnerReduction().apply(sm, TARGET) is None    # two reductions: row_reduction's


@pytest.mark.parametrize("op,shape,axes,keepdims", [
    ("ReduceSum", (1, 64, 3000), None, 0),    # reduce-all, 3 x 8 lanes
    ("ReduceSumSquare", (3, 5, 96), [-1], 1),
    ("ReduceMean", (2, 7, 40), [2], 0),
])
def test_numerics_against_onnxruntime(op, shape, axes, keepdims):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    ref_shape = np.sum(x, axis=None if axes is None else tuple(axes),
                       keepdims=bool(keepdims)).shape
    if op == "ReduceSum":
        ins = ["x"] if axes is None else ["x", "axes"]
        node = helper.make_node(op, ins, ["y"], keepdims=keepdims, name="r")
    else:
        node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims, name="r")
    inits = {} if axes is None or op != "ReduceSum" else {"axes": np.array(axes, "int64")}
    model = onnx_model([node], [("x", shape)], [("y", list(ref_shape))], inits)
    check_against_ort(model, {"x": x}, "cpu.inner_reduction")


def test_numerics_rms_norm_and_undivided_row_left_to_other_rules():
    import compiler

    rng = np.random.default_rng(1)
    for n in (1024, 37):  # 37: no vector divides the row, another rule must take it
        nodes = [
            helper.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1, name="ms"),
            helper.make_node("Sqrt", ["ms"], ["rms"], name="rms"),
            helper.make_node("Div", ["x", "rms"], ["y"], name="norm"),
        ]
        model = onnx_model(nodes, [("x", (16, n))], [("y", (16, n))])
        x = rng.standard_normal((16, n)).astype("float32")
        if n % 8 == 0:
            check_against_ort(model, {"x": x}, "cpu.inner_reduction")
        else:
            cm = compiler.compile(model, target="host")
            assert "cpu.inner_reduction" not in cm.report["schedules"]
            got = cm.session().run(None, {"x": x})[0]
            ref = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
