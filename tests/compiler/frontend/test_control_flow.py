"""If / Loop / Scan unrolled at import (compiler/frontend/control_flow.py), against onnx's reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.frontend import control_flow
from tests.conftest import assert_close, ort_run

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds, reference="onnx", **kw):
    """Compile (specialising if needed), run, compare with onnx's reference evaluator or
    (where that lacks a feature, e.g. Scan's axes and directions) onnxruntime."""
    cm = compiler.compile(model, **kw)
    got = cm.session().run(None, feeds)
    want = ReferenceEvaluator(model).run(None, feeds) if reference == "onnx" else \
        ort_run(model, feeds)
    assert_close(got, want)
    return cm


# ------------------------------------------------------------------------------ If


def _if_model(cond_init=None, else_shape=(3,)):
    """y = If(cond) then x * 2 else x + outer (outer: a tensor of the main graph)."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"], name="dbl")], "then", [],
        [_vi("t", F, [3])], [numpy_helper.from_array(np.float32(2), "two")])
    else_nodes = [helper.make_node("Add", ["x", "outer"], ["e0"], name="add")]
    if else_shape != (3,):
        else_nodes.append(helper.make_node("Concat", ["e0", "e0"], ["e"], axis=0))
    else:
        else_nodes.append(helper.make_node("Identity", ["e0"], ["e"]))
    else_g = helper.make_graph(else_nodes, "else", [], [_vi("e", F, list(else_shape))])
    nodes = [helper.make_node("Neg", ["x"], ["outer"], name="neg"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g,
                              else_branch=else_g)]
    inputs = [_vi("x", F, [3])]
    inits = []
    if cond_init is None:
        inputs.append(_vi("cond", B, []))
    else:
        inits.append(numpy_helper.from_array(np.array(cond_init), "cond"))
    return _model(nodes, inputs, [_vi("y", F, ["n"])], inits)


@pytest.mark.parametrize("cond", [True, False])
def test_if_constant_condition_inlines_the_taken_branch(cond):
    x = np.array([1, -2, 3], np.float32)
    cm = _check(_if_model(cond_init=cond), {"x": x})
    assert isinstance(cm, compiler.CompiledModel)


def test_if_input_condition_selects_with_where():
    m = _if_model()
    cm = compiler.compile(m)
    assert isinstance(cm, compiler.CompiledModel)  # no specialisation needed
    sess = cm.session()
    x = np.array([1, -2, 3], np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        assert_close(sess.run(None, feeds), ReferenceEvaluator(m).run(None, feeds))


def test_if_branches_of_different_shapes_specialise_on_the_condition():
    m = _if_model(else_shape=(6,))
    with pytest.raises(compiler.UnsupportedError, match=r"'branch' \(If.*not a compile-time"):
        compiler.driver.compile_static(m)  # what the specialising session catches
    sess = compiler.compile(m).session()
    x = np.array([1, -2, 3], np.float32)
    for cond in (True, False, True):
        feeds = {"x": x, "cond": np.array(cond)}
        (y,) = sess.run(None, feeds)
        assert y.shape == ((3,) if cond else (6,))
        assert_close([y], ReferenceEvaluator(m).run(None, feeds))
    assert sess.compiles == 3  # shapes alone fail once, then one variant per value


def test_errors_inside_a_branch_name_the_parent_node():
    then_g = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["t"], name="inner",
                                                 domain="com.acme")],
                               "then", [], [_vi("t", F, [3])])
    m = _model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g,
                                 else_branch=then_g)],
               [_vi("x", F, [3])], [_vi("y", F, [3])],
               [numpy_helper.from_array(np.array(True), "c")])
    m.opset_import.append(helper.make_opsetid("com.acme", 1))
    with pytest.raises(compiler.UnsupportedError, match="branch > inner"):
        compiler.compile(m)


# ---------------------------------------------------------------------------- Loop


def _loop_model(trip=None, cond=None, body_cond="Identity"):
    """Loop carrying y (y += x[i]) with scan output y; optionally while i < 2."""
    nodes = [helper.make_node("Unsqueeze", ["i", "zero"], ["i1"]),
             helper.make_node("Add", ["i1", "one"], ["i2"]),
             helper.make_node("Slice", ["xs", "i1", "i2"], ["xi"]),
             helper.make_node("Add", ["y_in", "xi"], ["y_out"], name="acc"),
             helper.make_node("Identity", ["y_out"], ["scan"])]
    if body_cond == "Identity":
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:  # keep going while i < 2: a value known per iteration once unrolled
        nodes.append(helper.make_node("Less", ["i", "two"], ["c_out"]))
    body = helper.make_graph(
        nodes, "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("y_in", F, [1])],
        [_vi("c_out", B, []), _vi("y_out", F, [1]), _vi("scan", F, [1])],
        [numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.int64(2), "two")])
    inits = [numpy_helper.from_array(np.arange(1, 9, dtype=np.float32), "xs")]
    inputs = [_vi("y0", F, [1])]
    names = []
    for name, value, dtype in (("M", trip, I64), ("cond", cond, B)):
        if value is None:
            names.append("")
        elif value == "input":
            inputs.append(_vi(name, dtype, []))
            names.append(name)
        else:
            inits.append(numpy_helper.from_array(np.array(value), name))
            names.append(name)
    node = helper.make_node("Loop", names + ["y0"], ["y", "ys"], name="loop", body=body)
    return _model([node], inputs, [_vi("y", F, [1]), _vi("ys", F, ["n", 1])], inits)


def test_loop_with_constant_trip_count_unrolls():
    _check(_loop_model(trip=np.int64(4), cond=True), {"y0": np.array([0.5], np.float32)})


def test_loop_stops_when_its_condition_folds_to_false():
    # no trip count: iterations 0, 1, 2 (after which i < 2 is false)
    cm = _check(_loop_model(cond=True, body_cond="less"), {"y0": np.array([0], np.float32)})
    assert cm.meta["manifest"]["outputs"][1]["shape"] == [3, 1]
    # trip count and condition: the first to end the loop wins
    _check(_loop_model(trip=np.int64(2), cond=True, body_cond="less"),
           {"y0": np.array([0], np.float32)})
    # a false condition runs no iteration
    _check(_loop_model(trip=np.int64(2), cond=False), {"y0": np.array([0], np.float32)},
           reference="onnxruntime")


def test_loop_trip_count_input_specialises_on_its_value():
    m = _loop_model(trip="input", cond=True)
    cm = compiler.compile(m)
    assert isinstance(cm, compiler.DynamicModel)
    sess = cm.session()
    y0 = np.array([0.5], np.float32)
    for n in (2, 5, 2):
        feeds = {"y0": y0, "M": np.array(n, np.int64)}
        got = sess.run(None, feeds)
        assert got[1].shape == (n, 1)
        assert_close(got, ReferenceEvaluator(m).run(None, feeds))
    assert sess.compiles == 3


def test_loop_zero_iterations_gives_empty_scan_output():
    _check(_loop_model(trip=np.int64(0), cond=True), {"y0": np.array([0.5], np.float32)},
           reference="onnxruntime")  # the reference evaluator cannot run zero iterations


def test_loop_refusals_name_the_node(monkeypatch):
    with pytest.raises(compiler.UnsupportedError, match="'loop'.*never ends"):
        compiler.compile(_loop_model(), input_shapes={"y0": [1]})
    monkeypatch.setattr(control_flow, "MAX_ITERATIONS", 3)
    with pytest.raises(compiler.UnsupportedError, match="'loop'.*4 iterations.*up to 3"):
        compiler.compile(_loop_model(trip=np.int64(4), cond=True))


# ---------------------------------------------------------------------------- Scan


def _scan9(axes=None, directions=None, out_axes=None, out_directions=None, x_shape=(3, 4)):
    """state += x_t; scan outputs: the running state and x_t * 2."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["run"]),
         helper.make_node("Mul", ["x_t", "two"], ["dbl"])], "body",
        [_vi("s_in", F, ["d"]), _vi("x_t", F, ["d"])],
        [_vi("s_out", F, ["d"]), _vi("run", F, ["d"]), _vi("dbl", F, ["d"])],
        [numpy_helper.from_array(np.float32(2), "two")])
    attrs = {k: v for k, v in dict(scan_input_axes=axes, scan_input_directions=directions,
                                   scan_output_axes=out_axes,
                                   scan_output_directions=out_directions).items()
             if v is not None}
    s_shape = [d for k, d in enumerate(x_shape) if k != ((axes or [0])[0] % len(x_shape))]
    node = helper.make_node("Scan", ["s0", "x"], ["s", "runs", "dbls"], name="scan", body=body,
                            num_scan_inputs=1, **attrs)
    return _model([node], [_vi("s0", F, s_shape), _vi("x", F, list(x_shape))],
                  [_vi("s", F, ["d"]), _vi("runs", F, ["a", "b"]), _vi("dbls", F, ["a", "b"])])


@pytest.mark.parametrize("kw", [
    {},
    dict(axes=[1], directions=[1]),
    dict(axes=[-1], out_axes=[1, 1], out_directions=[0, 1]),
    dict(directions=[1], out_axes=[-1, 0], out_directions=[1, 0]),
])
def test_scan9_axes_and_directions(kw):
    m = _scan9(**kw)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    s0 = rng.standard_normal((4,) if kw.get("axes", [0])[0] == 0 else (3,)).astype(np.float32)
    _check(m, {"s0": s0, "x": x}, reference="onnxruntime")


def test_scan8_batched_with_sequence_lens():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["run"])], "body",
        [_vi("s_in", F, [2]), _vi("x_t", F, [2])], [_vi("s_out", F, [2]), _vi("run", F, [2])])
    node = helper.make_node("Scan", ["lens", "s0", "x"], ["s", "runs"], name="scan8", body=body,
                            num_scan_inputs=1, directions=[1])
    m = _model([node], [_vi("s0", F, [2, 2]), _vi("x", F, [2, 3, 2])],
               [_vi("s", F, [2, 2]), _vi("runs", F, [2, 3, 2])],
               [numpy_helper.from_array(np.array([3, 3], np.int64), "lens")], opset=8)
    rng = np.random.default_rng(1)
    _check(m, {"s0": rng.standard_normal((2, 2)).astype(np.float32),
               "x": rng.standard_normal((2, 3, 2)).astype(np.float32)}, reference="onnxruntime")
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([3, 2], np.int64), "lens"))
    with pytest.raises(compiler.UnsupportedError, match="'scan8'.*sequence_lens"):
        compiler.compile(m)


def test_unroll_budget_refuses_long_scans(monkeypatch):
    monkeypatch.setattr(control_flow, "MAX_UNROLLED_NODES", 8)
    with pytest.raises(compiler.UnsupportedError, match="'scan'.*3 iterations of a 3-node body"):
        compiler.compile(_scan9())


def test_unrolled_kernels_are_attributed_to_the_parent_node():
    cm = compiler.compile(_scan9())
    assert {n for c in cm.meta["graph"]["calls"] for n in c["nodes"]} == {"scan"}
