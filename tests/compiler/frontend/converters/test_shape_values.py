"""Ops whose output shape depends on an input's values (compiler/frontend/converters/shape_values.py,
compiler/lowering/legalize_topk.py), against onnx's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import compiler
from tests.conftest import assert_close

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(node, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph([node], "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _check(model, feeds):
    cm = compiler.compile(model)
    got = cm.session().run(None, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
    assert_close(got, want)
    return cm


def _topk(shape, k, dtype=F, **attrs):
    return _model(helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", **attrs),
                  [_vi("x", dtype, list(shape))],
                  [_vi("v", dtype, ["a"] * len(shape)), _vi("i", I64, ["a"] * len(shape))],
                  [numpy_helper.from_array(np.array([k], np.int64), "k")])


@pytest.mark.parametrize("attrs", [{}, dict(largest=0), dict(axis=0), dict(axis=-2, largest=0)])
def test_topk_ties_go_to_the_lower_index(attrs):
    x = np.array([[3, 1, 3, 2, 1], [0, 0, 0, 0, 0], [5, -1, 7, 7, -1]], np.float32)
    _check(_topk(x.shape, 2, **attrs), {"x": x})


def test_topk_nan_counts_as_the_greatest_value():
    x = np.array([[1, np.nan, 3, -2], [np.nan, 0, np.nan, 5]], np.float32)
    _check(_topk(x.shape, 3), {"x": x})
    _check(_topk(x.shape, 3, largest=0), {"x": x})


def test_topk_integers_and_the_whole_axis():
    x = np.array([4, -9, 4, 12, 0, 4], np.int64)
    _check(_topk(x.shape, 6, dtype=I64), {"x": x})


def test_topk_off_cpu_refuses_axes_past_the_rank_count_limit(monkeypatch):
    from compiler.frontend.converters import shape_values as converters_shape_values

    monkeypatch.setattr(converters_shape_values, "TOPK_MAX_AXIS", 4)
    with pytest.raises(compiler.UnsupportedError, match=r"'topk'.*axis of 5 elements"):
        compiler.compile(_topk((2, 5), 2), target="cuda:sm_90")


def _rule_of_topk(cm):
    return {r["rule"] for r in cm.report["kernel_table"] if r["ops"] == "TopK"}


@pytest.mark.parametrize("shape,k,attrs", [
    ((64, 1000), 5, {}),                       # classifier top-5
    ((2, 50257), 50, {}),                      # a decoder's vocabulary (was refused)
    ((2, 3000), 100, dict(largest=0)),         # the heap form
    ((3, 40, 7), 40, dict(axis=1, largest=0)),  # the whole axis, in the middle
    ((4, 1, 9, 2), 1, dict(axis=2)),
])
def test_topk_cpu_selection_kernel(shape, k, attrs):
    """Integers drawn from a small range: many ties, which must come out by lower index."""
    rng = np.random.default_rng(0)
    x = rng.integers(-50, 50, size=shape).astype(np.float32)
    cm = _check(_topk(shape, k, **attrs), {"x": x})
    assert _rule_of_topk(cm) == {"cpu.topk"}


@pytest.mark.parametrize("k", [17, 40, 120])  # the insertion form, then the heap form
def test_topk_cpu_kernel_rows_sorted_either_way_and_nan(k):
    """Rows where every element enters the top K (the kernel's worst case), and rows with
    NaNs (the greatest value: first when largest, last when smallest), tied values
    among them, more NaNs than K in one row."""
    x = np.tile(np.arange(300, dtype=np.float32), (5, 1))
    x[1, ::7] = np.nan
    x[2] = x[2][::-1]
    x[3] = np.random.default_rng(2).integers(0, 9, 300)
    x[3, ::5] = np.nan
    x[4, ::2] = np.nan
    for largest in (1, 0):
        _check(_topk(x.shape, k, largest=largest), {"x": x})


def test_topk_cpu_kernel_symbolic_batch():
    """One artifact over a symbolic leading dim: the kernel's extents are its buffers'."""
    m = _model(helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", axis=1),
               [_vi("x", F, ["b", 300])], [_vi("v", F, ["b", 3]), _vi("i", I64, ["b", 3])],
               [numpy_helper.from_array(np.array([3], np.int64), "k")])
    cm = compiler.compile(m, dims={"b": (1, 8)})
    rng = np.random.default_rng(1)
    for b in (1, 5, 8):
        x = rng.standard_normal((b, 300)).astype(np.float32)
        got = cm.session().run(None, {"x": x})
        want = ReferenceEvaluator(m).run(None, {"x": x})
        assert_close(got, want)


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_compress_with_constant_condition(axis):
    cond = np.array([True, False, True], bool)
    attrs = {} if axis is None else {"axis": axis}
    m = _model(helper.make_node("Compress", ["x", "c"], ["y"], name="cmp", **attrs),
               [_vi("x", F, [3, 3])], [_vi("y", F, ["a"] * (1 if axis is None else 2))],
               [numpy_helper.from_array(cond, "c")])
    _check(m, {"x": np.arange(9, dtype=np.float32).reshape(3, 3)})


def test_compress_with_input_condition_specialises():
    m = _model(helper.make_node("Compress", ["x", "c"], ["y"], name="cmp", axis=0),
               [_vi("x", F, [4, 2]), _vi("c", B, [4])], [_vi("y", F, ["n", 2])])
    with pytest.raises(compiler.UnsupportedError, match=r"'cmp'.*input 'c'"):
        compiler.driver.compile_static(m)
    sess = compiler.compile(m).session()
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    for c in ([1, 0, 1, 1], [0, 1, 0, 0]):
        feeds = {"x": x, "c": np.array(c, bool)}
        assert_close(sess.run(None, feeds), ReferenceEvaluator(m).run(None, feeds))


@pytest.mark.parametrize("axis, idtype", [(-1, I64), (1, F), (0, TensorProto.INT32)])
def test_onehot_with_input_values(axis, idtype):
    m = _model(helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="oh", axis=axis),
               [_vi("i", idtype, [2, 3]), _vi("v", F, [2])], [_vi("y", F, ["a", "b", "c"])],
               [numpy_helper.from_array(np.float32(5), "d")], opset=11)
    i = np.array([[0, 4, -1], [7, -5, 2]]).astype(helper.tensor_dtype_to_np_dtype(idtype))
    _check(m, {"i": i, "v": np.array([-1.5, 3], np.float32)})


def test_reshape_allowzero_keeps_literal_zeros():
    m = _model(helper.make_node("Reshape", ["x", "s"], ["y"], name="r", allowzero=1),
               [_vi("x", F, [0, 3, 4])], [_vi("y", F, [3, 4, 0])],
               [numpy_helper.from_array(np.array([3, 4, 0], np.int64), "s")], opset=14)
    _check(m, {"x": np.zeros((0, 3, 4), np.float32)})


def test_unsqueeze_with_rank0_axes():
    m = _model(helper.make_node("Unsqueeze", ["x", "a"], ["y"], name="u"),
               [_vi("x", F, [2, 3])], [_vi("y", F, [2, 3, 1])],
               [numpy_helper.from_array(np.array(-1, np.int64), "a")])
    _check(m, {"x": np.ones((2, 3), np.float32)})


def test_nonzero_binds_a_small_input_and_refuses_a_large_one():
    # NonZero's indices pick elements of x, a graph input: the GatherND kernel computes
    # the output (the bound condition only fixes which); checked against onnxruntime
    from tests.conftest import ort_run

    nodes = [helper.make_node("NonZero", ["c"], ["nz"], name="nz"),
             helper.make_node("Transpose", ["nz"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["y"])]
    g = helper.make_graph(nodes, "g", [_vi("c", B, [2, 3]), _vi("x", F, [2, 3])],
                          [_vi("y", F, ["n"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    sess = compiler.compile(m).session()
    for c in (np.array([[1, 0, 1], [0, 0, 1]], bool), np.array([[0, 1, 1], [1, 1, 0]], bool)):
        feeds = {"c": c, "x": np.arange(6, dtype=np.float32).reshape(2, 3) * 1.5 - 2}
        assert_close(sess.run(None, feeds), ort_run(m, feeds))
    assert sess.compiles == 3  # shapes alone (fails), then one variant per condition
    assert all(r["kernels"] >= 1 and r["constant_outputs"] == [] for r in sess.reports)
    big = _model(helper.make_node("NonZero", ["c"], ["y"], name="nz"),
                 [_vi("c", B, [16, 16])], [_vi("y", I64, [2, "n"])], opset=13)
    with pytest.raises(compiler.UnsupportedError, match=r"g: node 'nz'.*input 'c'.*not known"):
        compiler.compile(big)  # 256 elements: too many to bind, so not deferred


# Unique-11: rows 0 and 2 repeat, columns 1 and 2 are distinct; values repeat within rows
_UNIQUE_X = np.array([[2, 1, 1], [3, 4, 3], [2, 1, 1], [0, 4, 3]], np.float32)


def _unique(shape, n_outputs=4, **attrs):
    names = ["y", "idx", "inv", "cnt"][:n_outputs]
    types = [F, I64, I64, I64][:n_outputs]
    return _model(helper.make_node("Unique", ["x"], names, name="uq", **attrs),
                  [_vi("x", F, list(shape))],
                  [_vi(n, t, d) for n, t, d in zip(names, types, [
                      ["u"] if "axis" not in attrs else [f"d{k}" for k in range(len(shape))],
                      ["u"], ["n"], ["u"]])], opset=11)


@pytest.mark.parametrize("sort", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_unique_matches_onnxruntime(sort, axis):
    from tests.conftest import ort_run

    attrs = {"sorted": sort} if axis is None else {"sorted": sort, "axis": axis}
    m = _unique(_UNIQUE_X.shape, **attrs)
    feeds = {"x": _UNIQUE_X}
    got = compiler.compile(m).session().run(None, feeds)
    want = ort_run(m, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    if sort:  # onnx.reference agrees where it is right (sorted=0 it is not: onnx 1.20)
        assert_close(got, ReferenceEvaluator(m).run(None, feeds))


def test_unique_one_output_of_a_constant():
    m = _model(helper.make_node("Unique", ["c"], ["y"], name="uq", sorted=0),
               [], [_vi("y", I64, ["u"])],
               [numpy_helper.from_array(np.array([5, 1, 5, 7, 1, 0], np.int64), "c")], opset=11)
    cm = compiler.compile(m)
    np.testing.assert_array_equal(cm.session().run(None, {})[0], [5, 1, 7, 0])


def test_unique_refuses_nan_and_large_inputs_by_name():
    x = _UNIQUE_X.copy()
    x[1, 1] = np.nan
    with pytest.raises(compiler.UnsupportedError, match=r"node 'uq'.*holds NaN"):
        compiler.compile(_unique(x.shape)).session().run(None, {"x": x})
    with pytest.raises(compiler.UnsupportedError, match=r"node 'uq'.*input 'x'.*not known"):
        compiler.compile(_unique([16, 16]))  # 256 elements: too many to bind


@pytest.mark.parametrize("count", [None, 0, 2])
def test_nms_with_its_optional_inputs_omitted(count):
    """onnx.reference's NonMaxSuppression failed on an omitted max_output_boxes_per_class
    (ONNX's default 0: nothing selected), on a count of 0 and on an omitted iou_threshold:
    the session refused the model ("could not evaluate")."""
    from tests.conftest import ort_run

    names, inits = ["boxes", "scores"], []
    if count is not None:
        names.append("count")
        inits.append(numpy_helper.from_array(np.array([count], np.int64), "count"))
    node = helper.make_node("NonMaxSuppression", names, ["sel"])
    model = _model(node, [_vi("boxes", F, [1, 4, 4]), _vi("scores", F, [1, 1, 4])],
                   [_vi("sel", I64, None)], inits, opset=11)
    model.ir_version = 8
    rng = np.random.default_rng(0)
    feeds = {"boxes": rng.random((1, 4, 4)).astype(np.float32),
             "scores": rng.random((1, 1, 4)).astype(np.float32)}
    got = compiler.compile(model).session().run(None, feeds)
    assert_close(got, ort_run(model, feeds))
