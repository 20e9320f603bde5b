"""cpu.arg_reduction: structure under AVX-512 and AVX2 targets (parallel, the tile of the
innermost output dim inside the reduction), numerics against onnxruntime (tile that does
and does not divide the width, NaNs, ArgMin, keepdims, select_last_index), and the
reductions it must leave to other rules."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import compiler
from compiler.lowering import install
from schedules.cpu.arg_reduction import ArgReduction
from tests.hosts import CompileOnly
from tests.schedules.util import TARGET, fused_primfunc

AVX2 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


def _argmax(shape, axis):
    return fused_primfunc(lambda bb, x: bb.emit(relax.op.argmax(x, axis=axis)), [shape],
                          "argmax", legalize_map=install())


@pytest.mark.parametrize("target,lanes", [(TARGET, 16), (AVX2, 8)])
def test_structure_tile_inside_the_reduction(target, lanes):
    text = ArgReduction().apply(_argmax((1, 21, 64, 64), 1), target).mod["main"].script()
    assert "T.parallel" in text
    # the update: reduction loop over the 21 classes, then the tile of 2 vectors' outputs
    update = text[:text.index('"argmax_red_update"')]
    assert f"for k, i2_1 in T.grid(T.int64(21), T.int64({2 * lanes})):" in update
    assert '"argmax_red_init"' in text


def test_leaves_last_axis_and_plain_reductions():
    # over the last axis no output dim reads contiguous inputs (a decoder's vocabulary)
    assert ArgReduction().apply(_argmax((4, 1000), 1), TARGET) is None
    total = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(1, 16, 64)],
                           "sum")
    assert ArgReduction().apply(total, TARGET) is None


def _model(op, shape, axis, keepdims=1, last=0):
    out = list(shape)
    if keepdims:
        out[axis] = 1
    else:
        del out[axis]
    node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims,
                            select_last_index=last, name="head.argmax")
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, out)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _against_ort(cm, model, x):
    """onnxc's output equals onnxruntime's (nothing to run on a fabricated host,
    tests/hosts.py: the rule is the check there)."""
    try:
        got = cm.session().run(None, {"x": x})[0]
    except CompileOnly:
        return
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ref)


def _check(model, x):
    cm = compiler.compile(model, target="host")
    assert cm.report["schedules"].get("cpu.arg_reduction") == 1, cm.report["schedules"]
    _against_ort(cm, model, x)


@pytest.mark.parametrize("op,shape,axis,keepdims", [
    ("ArgMax", (1, 21, 32, 64), 1, 1),   # segmentation classes: whole tiles
    ("ArgMax", (2, 19, 7, 50), 1, 0),    # width 50: a tile of 10 (AVX2) / 25 (AVX-512)
    ("ArgMin", (3, 40, 24), 1, 1),       # over channels of a 1-D map
    ("ArgMax", (5, 6, 8, 16), 0, 0),     # the outermost axis
])
def test_numerics_against_onnxruntime(op, shape, axis, keepdims):
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    # ties: a few rows repeat a class's values
    x[..., :3] = np.round(x[..., :3])
    _check(_model(op, shape, axis, keepdims), x)


def test_nans_as_onnxruntime():
    """A NaN in the first class wins (index 0), NaNs after it are skipped."""
    x = np.random.default_rng(1).standard_normal((1, 9, 4, 32)).astype("float32")
    x[0, 0, 0, :5] = np.nan
    x[0, 3, 1, 3:9] = np.nan
    x[0, :, 2, 7] = np.nan
    _check(_model("ArgMax", x.shape, 1), x)


# A long last axis (a decoder's vocabulary) is reduced in two stages by the converter
# (compiler/lowering/legalize_reductions.arg_partial_compute): lanes of independent folds,
# which this rule tiles, then a merge of the lanes.

def _vocab_rows(shape, seed):
    """Small integers (many ties), NaNs scattered, one row led by a NaN, one all NaN."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, size=shape).astype("float32")
    flat = x.reshape(-1, shape[-1])
    flat[:, rng.integers(1, shape[-1], 40)] = np.nan
    if flat.shape[0] > 1:
        flat[1, 0] = np.nan
    if flat.shape[0] > 2:
        flat[2] = np.nan
    return x


@pytest.mark.parametrize("op,shape,keepdims,last", [
    ("ArgMax", (1, 32000), 1, 0),      # a multiple of the 64 lanes
    ("ArgMax", (3, 50257), 0, 0),      # GPT-2's vocabulary: a tail past the last full step
    ("ArgMin", (2, 3, 1030), 1, 1),    # select_last_index, just over the split threshold
])
def test_long_rows_in_two_stages(op, shape, keepdims, last):
    m = _model(op, shape, len(shape) - 1, keepdims, last)
    cm = compiler.compile(m, target="host")
    rules = {k["kernel"]: k["rule"] for k in cm.report["kernel_table"]}
    assert rules[f"{op.lower()}_lanes"] == "cpu.arg_reduction" and len(rules) == 2, rules
    _check(m, _vocab_rows(shape, 2))


@pytest.mark.parametrize("op,shape,keepdims,last", [
    ("ArgMax", (8400, 80), 0, 0),       # YOLO's class scores: 12.6x onnxruntime before
    ("ArgMax", (32, 1000), 1, 0),       # rows a multiple of the 16 folded together
    ("ArgMin", (3, 7, 300), 1, 1),      # 21 rows: a last block past the end; last index
    ("ArgMax", (13,), 0, 1),            # one row, a scalar result
])
def test_short_rows_folded_together(op, shape, keepdims, last):
    """Rows shorter than the split threshold: one kernel (cpu.arg_rows) folding 16 rows at
    a time, onnxruntime's fold (leading NaN wins, later NaN skipped, ties by index)."""
    m = _model(op, shape, len(shape) - 1, keepdims, last)
    cm = compiler.compile(m, target="host")
    assert [k["rule"] for k in cm.report["kernel_table"]] == ["cpu.arg_rows"]
    _against_ort(cm, m, _vocab_rows(shape, 3))


def test_short_rows_symbolic_row_count():
    node = helper.make_node("ArgMax", ["x"], ["y"], axis=-1, keepdims=0)
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 85])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, ["n"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m, dims={"n": (1, 9000)})
    sess = cm.session()
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 15, 16, 8400):
        x = _vocab_rows((n, 85), n)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])


def test_two_reduction_form_off_cpu_against_onnxruntime(monkeypatch):
    """Off CPU targets ArgMax / ArgMin are two plain reductions (the fold's value, then
    the first / last index holding it): the one-fold kernel did not build for CUDA.  Its
    numbers checked here on the host, the converter made to take that path; then a CUDA
    build (no GPU needed)."""
    from compiler.frontend.converters import reduction

    monkeypatch.setattr(reduction, "cpu_lanes", lambda: None)
    for op, shape, axis, keepdims, last in (("ArgMax", (6, 50), 1, 0, 0),
                                            ("ArgMin", (3, 7, 40), 2, 1, 1),
                                            ("ArgMax", (5, 9, 4), 0, 1, 1)):
        m = _model(op, shape, axis, keepdims, last)
        cm = compiler.compile(m, target="host")
        assert "cpu.arg_rows" not in cm.report["schedules"]
        _against_ort(cm, m, _vocab_rows(shape, 4))
    monkeypatch.undo()
    cm = compiler.compile(_model("ArgMax", (8400, 80), 1, 0), target="cuda:sm_90")
    assert all(k.startswith("dlight.gpu.") for k in cm.report["schedules"])
