"""compiler/lowering/legalize_reductions.py and nan_reducers.py: ReduceMax / ReduceMin /
ArgMax / ArgMin / Hardmax with onnxruntime's NaN fold, on the *scheduled* kernels.

onnxruntime 1.32 folds ``acc = x[0]; acc = max(acc, x[k])`` as ``std::max``: a leading
NaN is the result, any later NaN is skipped (ArgMax / ArgMin exactly so; ReduceMax over an
outer axis so, over the innermost axis Eigen's packet maxima also lose values next to a
NaN, which is not copied: see docs/conformance.md).  Each case below is compiled for
``host``: the report's kernel table names the schedule rule that ran, so the rules that
reorder, tile or vectorise reductions (``cpu.tiled_reduction``, ``dlight.reduction``,
``cpu.row_reduction``) are the ones checked, not only the unscheduled TIR.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from onnx import helper
from tvm import relax

import compiler
from compiler.driver import schedule_kernels
from tests.conftest import ort_run
from tests.nan_helpers import I64, assert_nan_equal, graph_model, legalized_text, nan_rows


def _fold(x, axes, kind):
    """onnxruntime's fold, in numpy: NaN where the leading element of the slice is NaN,
    else the max (min) over its non-NaN elements (NaN when it has none)."""
    axes = tuple(a % x.ndim for a in axes)
    lead = x[tuple(slice(0, 1) if i in axes else slice(None) for i in range(x.ndim))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        red = (np.nanmax if kind == "max" else np.nanmin)(x, axis=axes, keepdims=True)
    return np.where(np.isnan(lead), lead, red).squeeze(axes)


def _arg_fold(x, axis, kind, last=False):
    """ArgMax / ArgMin as onnxruntime folds: index 0 if x[0] is NaN, else the first (last)
    index of the max (min) over non-NaN values."""
    def row(r):
        best, bi = r[0], 0
        for i in range(1, len(r)):
            v = r[i]
            if (v > best if kind == "max" else v < best) or (last and v == best):
                best, bi = v, i
        return bi

    return np.apply_along_axis(row, axis, x).astype(np.int64)


def _compile(m):
    cm = compiler.compile(m, target="host")
    return cm, [k["rule"] for k in cm.report["kernel_table"]]


# (id, shape, axes, expected schedule rule)
REDUCE_CASES = [
    ("last_axis", [8, 256], [1], "fallback"),  # as before this change
    ("outer_axis", [256, 64], [0], "cpu.tiled_reduction"),
    ("two_axes", [8, 6, 40], [1, 2], None),
]


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("case", REDUCE_CASES, ids=[c[0] for c in REDUCE_CASES])
def test_reduce_fold_on_scheduled_kernel(case, kind):
    _, shape, axes, rule = case
    x = nan_rows(shape)
    if axes == [0]:
        x = np.ascontiguousarray(nan_rows(shape[::-1]).T)  # rows along axis 0
    out_shape = [d for i, d in enumerate(shape) if i not in axes]
    op = "ReduceMax" if kind == "max" else "ReduceMin"
    m = graph_model([helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=0, name="r")],
                    shape, out_shape)
    cm, rules = _compile(m)
    if rule is not None:
        assert rules == [rule]
    got = cm.session().run(None, {"x": x})[0]
    assert_nan_equal(got, _fold(x, axes, kind))


def test_reduce_outer_axis_matches_onnxruntime():
    """Over an outer axis onnxruntime's reduction is the plain fold: equal element-wise."""
    x = np.ascontiguousarray(nan_rows([64, 256]).T)
    m = graph_model([helper.make_node("ReduceMax", ["x"], ["y"], axes=[0], keepdims=0,
                                      name="r")], [256, 64], [64])
    got = compiler.compile(m, target="host").session().run(None, {"x": x})[0]
    assert_nan_equal(got, ort_run(m, {"x": x})[0])


def test_fused_reduce_max_subtract():
    """ReduceMax feeding its consumer (x - max(x), the start of a hand-written softmax):
    the NaN fold intact through fusion and scheduling."""
    x = nan_rows([8, 256])
    m = graph_model([helper.make_node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=1, name="r"),
                     helper.make_node("Sub", ["x", "m"], ["y"], name="s")], [8, 256], [8, 256])
    cm, _ = _compile(m)
    got = cm.session().run(None, {"x": x})[0]
    with np.errstate(invalid="ignore"):
        want = x - _fold(x, [1], "max")[:, None]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1])
def test_arg_fold_matches_onnxruntime(op, axis, last):
    x = nan_rows([16, 40])
    if axis == 0:
        x = np.ascontiguousarray(nan_rows([40, 16]).T)
    out_shape = [40] if axis == 0 else [16]
    m = graph_model([helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=0,
                                      select_last_index=last, name="a")],
                    [16, 40], out_shape, out_type=I64)
    got = compiler.compile(m, target="host").session().run(None, {"x": x})[0]
    kind = "max" if op == "ArgMax" else "min"
    np.testing.assert_array_equal(got, _arg_fold(x, axis, kind, bool(last)))
    np.testing.assert_array_equal(got, ort_run(m, {"x": x})[0])


def test_hardmax_leading_nan_row_is_zero():
    x = nan_rows([8, 12])
    m = graph_model([helper.make_node("Hardmax", ["x"], ["y"], axis=1, name="h")], [8, 12], [8, 12])
    got = compiler.compile(m, target="host").session().run(None, {"x": x})[0]
    want = np.zeros_like(x)
    idx = _arg_fold(x, 1, "max")
    want[np.arange(8), idx] = 1
    want[np.isnan(x[:, 0])] = 0
    np.testing.assert_array_equal(got, want)
    # onnxruntime agrees wherever its Eigen row maximum is the fold's (rows 0, 4-7 here)
    np.testing.assert_array_equal(got[[0, 4, 5, 6, 7]], ort_run(m, {"x": x})[0][[0, 4, 5, 6, 7]])


def test_float_max_and_argmax_lower_to_selects_int_keeps_tvm():
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    text = legalized_text(relax.op.max(x, axis=[1]), x)
    assert "T.max" not in text and "isnan" in text
    assert len(re.findall(r"^\s+with T.sblock\(", text, re.M)) == 1  # one block: any order
    text = legalized_text(relax.op.argmax(x, axis=1), x)
    assert "T.max" not in text and "isnan" in text
    i = relax.Var("i", relax.TensorType((8, 16), "int32"))
    assert "T.max" in legalized_text(relax.op.max(i, axis=[1]), i)


@pytest.mark.parametrize("case", REDUCE_CASES[:2], ids=[c[0] for c in REDUCE_CASES[:2]])
def test_scheduled_reduction_has_no_tir_max(case):
    """The schedule rules (rfactor, tiling) must not bring back ``T.max`` / ``T.min``."""
    _, shape, axes, _ = case
    out_shape = [d for i, d in enumerate(shape) if i not in axes]
    m = graph_model([helper.make_node("ReduceMax", ["x"], ["y"], axes=axes, keepdims=0,
                                      name="r")], shape, out_shape)
    mod, _, _ = schedule_kernels(m, "host")
    text = "\n".join(f.script() for _, f in mod.functions.items())
    assert "T.max(" not in text and "T.isnan" in text
