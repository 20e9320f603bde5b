"""Dynamic shapes: per-key specialisation with a bounded cache; never a guessed value."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from tests.conftest import assert_close, ort_run


def _symbolic_mlp():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4))
                                .astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _reshape_by_input():
    """The target shape is a graph input: it must be known to plan memory."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
         helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=-1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_symbolic_batch_compiles_once():
    """A symbolic dim stays symbolic (tests/compiler/test_symbolic.py): no per-shape path."""
    m = _symbolic_mlp()
    cm = compiler.compile(m)
    assert isinstance(cm, compiler.CompiledModel)
    assert cm.report["dims"] == [{"name": "batch", "min": 1, "max": 128, "opt": 128,
                                  "declared": False}]
    sess = cm.session()
    assert sess.get_inputs()[0].shape == ["batch", 8]
    rng = np.random.default_rng(1)
    for batch in (1, 3, 1, 5, 3):
        feeds = {"x": rng.standard_normal((batch, 8)).astype(np.float32)}
        assert_close(sess.run(None, feeds), ort_run(m, feeds))


def test_cache_is_bounded():
    sess = compiler.compile(_reshape_by_input(), max_variants=2).session()
    x = np.ones((2, 6), np.float32)
    for shape in ([3, 4], [4, 3], [2, 6], [3, 4]):
        sess.run(None, {"x": x, "shape": np.array(shape, np.int64)})
    # one shapes-only attempt that fails, then one per value; [3, 4] was evicted
    assert sess.compiles == 5 and sess.evictions == 2


def test_shape_input_specialises_on_its_value():
    m = _reshape_by_input()
    sess = compiler.compile(m).session()
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [4, 3], [3, 4]):
        feeds = {"x": x, "shape": np.array(shape, np.int64)}
        (y,) = sess.run(None, feeds)
        assert y.shape == tuple(shape)
        assert_close([y], ort_run(m, feeds))
    assert sess.compiles == 3  # shapes-only attempt fails once, then one per value


def test_input_values_fix_it_for_export(tmp_path):
    cm = compiler.compile(_reshape_by_input(), input_values={"shape": np.array([3, 4])})
    assert isinstance(cm, compiler.CompiledModel)
    assert [i["name"] for i in cm.meta["manifest"]["inputs"]] == ["x"]
    cm.export(str(tmp_path / "m.so"))


def test_input_shapes_fix_symbolic_dims():
    cm = compiler.compile(_symbolic_mlp(), input_shapes={"x": [2, 8]})
    assert isinstance(cm, compiler.CompiledModel)
    assert cm.session().get_inputs()[0].shape == [2, 8]


@pytest.mark.parametrize("kw, message", [
    (dict(input_shapes={"nope": [1, 8]}), "unknown input 'nope'"),
    (dict(input_shapes={"x": [1, 8, 1]}), "rank 3"),
])
def test_bad_specialisation_arguments(kw, message):
    with pytest.raises(ValueError, match=message):
        compiler.compile(_symbolic_mlp(), **kw)


def test_feed_checked_against_declared_signature():
    sess = compiler.compile(_symbolic_mlp()).session()
    with pytest.raises(ValueError, match=r"input 'x': axis 1 must be 8, got 7 \(shape \[2, 7\]; "
                                         r"expected \['batch', 8\]\)"):
        sess.run(None, {"x": np.ones((2, 7), np.float32)})
    with pytest.raises(ValueError, match="missing input 'x'"):
        sess.run(None, {})


def test_unsupported_ops_are_not_deferred():
    m = _symbolic_mlp()
    m.graph.node[1].op_type = "NoSuchOp"
    m.graph.node[1].domain = "com.acme"
    m.opset_import.append(helper.make_opsetid("com.acme", 1))
    with pytest.raises(compiler.UnsupportedError, match="NoSuchOp"):
        compiler.compile(m)


def _range_by_float_inputs():
    """n = ceil((limit - start) / delta) computed in the graph, then Range: the float
    inputs determine the output shape through the nodes computing it."""
    f = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("Sub", ["limit", "start"], ["span"]),
         helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
         helper.make_node("Shape", ["x"], ["xs"]),
         helper.make_node("Cast", ["xs"], ["xf"], to=f),
         helper.make_node("ReduceSum", ["xf"], ["xsum"], keepdims=1),
         helper.make_node("Add", ["span", "xsum"], ["off"]),
         helper.make_node("Add", ["r", "off"], ["y"])], "g",
        [helper.make_tensor_value_info("start", f, []),
         helper.make_tensor_value_info("limit", f, []),
         helper.make_tensor_value_info("delta", f, []),
         helper.make_tensor_value_info("x", f, [2, 3])],
        [helper.make_tensor_value_info("y", f, ["n"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_determining_inputs_are_traced_through_the_graph():
    from compiler.specialize import _shape_value_inputs

    # start/limit/delta reach Range; x only through Shape (its values never matter)
    assert _shape_value_inputs(_range_by_float_inputs()) == {"start", "limit", "delta"}


def test_float_range_inputs_specialise_on_their_values():
    m = _range_by_float_inputs()
    cm = compiler.compile(m)
    assert isinstance(cm, compiler.DynamicModel)
    sess = cm.session()
    x = np.zeros((2, 3), np.float32)
    for start, limit, delta in ((0.0, 2.0, 0.5), (1.0, 2.5, 0.5), (0.0, 2.0, 0.5)):
        feeds = {"start": np.float32(start), "limit": np.float32(limit),
                 "delta": np.float32(delta), "x": x}
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        (y,) = sess.run(None, feeds)
        assert_close([y], ort_run(m, feeds))
    assert sess.compiles == 3  # shapes alone fail once, then one variant per value


def test_bool_condition_of_if_is_bound_only_when_needed():
    """An If whose branches agree in shape compiles once (where); the condition of one
    whose branches differ is bound per value."""
    f = TensorProto.FLOAT

    def model(else_node):
        then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "t", [],
                                   [helper.make_tensor_value_info("t", f, ["a"])])
        else_g = helper.make_graph([else_node], "e", [],
                                   [helper.make_tensor_value_info("e", f, ["a"])])
        g = helper.make_graph(
            [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
            "g", [helper.make_tensor_value_info("x", f, [4]),
                  helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
            [helper.make_tensor_value_info("y", f, ["a"])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    same = model(helper.make_node("Abs", ["x"], ["e"]))
    assert isinstance(compiler.compile(same), compiler.CompiledModel)
    differ = model(helper.make_node("Concat", ["x", "x"], ["e"], axis=0))
    sess = compiler.compile(differ).session()
    x = np.array([1, -2, 3, -4], np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        assert_close(sess.run(None, feeds), ort_run(differ, feeds))
    assert sess.compiles == 3


def _integer_cumsum_of_reshape():
    """y = CumSum(Reshape(x, shape)): ``shape`` fixes a shape, ``x`` (a small integer input)
    does not."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
         helper.make_node("CumSum", ["r", "axis"], ["y"], name="cumsum")], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["a", "b"])],
        [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_only_shape_determining_inputs_are_bound():
    # Before: every small integer input was bound, so x became a constant and
    # onnx.reference computed the CumSum at compile time, once per value of x.
    from compiler.specialize import _shape_value_inputs

    m = _integer_cumsum_of_reshape()
    assert _shape_value_inputs(m) == {"shape"}
    sess = compiler.compile(m).session()
    rng = np.random.default_rng(0)
    for shape in ([2, 3], [2, 3], [3, 2]):
        feeds = {"x": rng.integers(-9, 9, 6).astype(np.int32), "shape": np.array(shape)}
        assert_close(sess.run(None, feeds), ort_run(m, feeds))
    assert len(sess.reports) == 2  # one variant per shape value, not per x
    for r in sess.reports:  # the CumSum kernel ran on x
        assert r["constant_outputs"] == [] and r["kernels"] >= 1


def test_export_refusal_names_the_dims_left_at_the_default_range():
    """A model that does not compile over its symbolic dims' default range (a wav2vec2
    export needs 400+ samples for one frame) is told to declare their ranges too, naming
    the undeclared dims; a declared dim is not named."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(compiler.CompileError, match=r"--dim n=MIN\.\.MAX.*default 1\.\.128"):
        compiler.compile(m).export("never.so")
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile(m, dims={"n": (1, 4)}).export("never.so")
    assert "--dim" not in str(e.value)
