"""compiler/frontend/importer.py: registry dispatch, binding tags, errors that name every
unsupported node, and the public subgraph entry used by control flow."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from tvm import relax

import compiler  # noqa: F401  (registers onnxc's converters)
from compiler.errors import UnsupportedError
from compiler.frontend.importer import graph_inputs, import_onnx, input_signature
from compiler.frontend.loader import load_model

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, opsets=(("", 17),)):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _relu_add():
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("Add", ["r", "x"], ["y"], name="add")],
                  [helper.make_tensor_value_info("x", F, [2, 3])],
                  [helper.make_tensor_value_info("y", F, [2, 3])])


def test_main_takes_the_inputs_and_bindings_are_tagged_with_node_indices():
    mod = import_onnx(load_model(_relu_add()))
    main = mod["main"]
    assert [p.name for p in main.params] == ["x"]
    names = [b.var.name for blk in main.body.blocks for b in blk.bindings]
    assert "n0" in names and "n1" in names  # Relu is node 0, Add node 1 (provenance tags)


def test_every_unsupported_node_is_reported_at_once():
    m = _model([helper.make_node("NoSuchOp", ["x"], ["a"], name="first"),
                helper.make_node("AlsoMissing", ["a"], ["y"], name="second")],
               [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(UnsupportedError, match=r"2 node\(s\) cannot be converted") as e:
        import_onnx(m, "m.onnx")
    assert "'first'" in str(e.value) and "'second'" in str(e.value)


def test_input_signature_names_shapes_and_dtypes():
    m = load_model(_relu_add())
    assert [vi.name for vi in graph_inputs(m)] == ["x"]
    (sig,) = input_signature(m)
    assert sig["name"] == "x" and sig["shape"] == [2, 3] and sig["dtype"] == "float32"


def test_if_with_a_constant_condition_converts_one_branch_through_the_public_entry():
    """control_flow converts subgraphs with _Importer.convert_subgraph: the outer
    scope's ``x`` is visible inside the branch, and only the taken branch is converted."""
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [2])])
    cond = helper.make_node("Constant", [], ["c"],
                            value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    m = _model([cond, helper.make_node("If", ["c"], ["y"], then_branch=then_g,
                                       else_branch=else_g)],
               [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    text = import_onnx(load_model(m)).script()
    assert "R.negative" in text and "R.abs" not in text
    x = np.array([1.5, -2.0], np.float32)
    (y,) = compiler.compile(m).session().run(None, {"x": x})
    np.testing.assert_array_equal(y, -x)


def test_the_result_is_a_relax_module():
    assert isinstance(import_onnx(load_model(_relu_add()))["main"], relax.Function)


def test_constant_scalars_of_tvms_shape_handling_reach_tensor_ops_as_tensors():
    """TVM's frontend keeps some shape arithmetic as bare scalars (EnCodec's padding,
    ``ceil((len - k) / stride + 1)``, reached Ceil as ``T.float64(24000.0)``, which relax.ceil
    refuses): a constant one is fed to a tensor op as a 0-D tensor of the tensor's declared
    ONNX type; a symbolic one is left as it was."""
    from tvm import tirx

    from tvm.ir.expr import GenericConst

    from compiler.frontend.importer import _Importer

    imp = _Importer.__new__(_Importer)
    imp._known = {}
    imp._declared_vis = {"f": helper.make_tensor_value_info("f", TensorProto.FLOAT, [])}
    n = tirx.Var("n", "int64")
    out = imp._shape_values_as_tensors(
        [tirx.FloatImm("float64", 24000.0), tirx.IntImm("int64", 7), n], "Ceil", ["f", "i", "s"])
    assert isinstance(out[0], GenericConst) and str(out[0].ty.dtype) == "float32"
    assert out[0].value.numpy() == np.float32(24000.0) and out[0].value.numpy().ndim == 0
    assert isinstance(out[1], GenericConst) and str(out[1].ty.dtype) == "int64"
    assert out[2].same_as(n)


def _seq_model(nodes, n_inputs, out_name="y", out_type=None, opset=18):
    inputs = [helper.make_tensor_value_info(f"x{i}", F, [2, 3]) for i in range(n_inputs)]
    out = out_type or helper.make_tensor_value_info(out_name, F, None)
    return _model(nodes, inputs, [out], opsets=(("", opset),))


def _run_both(model, n_inputs):
    from tests.conftest import assert_close, ort_run

    model.ir_version = 8
    rng = np.random.default_rng(0)
    feeds = {f"x{i}": rng.standard_normal((2, 3)).astype(np.float32) for i in range(n_inputs)}
    # isolated with a timeout: TVM's ConcatFromSequence looped forever over a tensor
    cm = compiler.compile(model, isolate=True, timeout=120)
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds))


@pytest.mark.parametrize("new_axis", [0, 1])
def test_a_sequence_is_one_value_for_the_ops_that_read_it(new_axis):
    """SequenceConstruct's one output is the whole sequence: it was bound to its first
    tensor (ConcatFromSequence then hung, SequenceAt / SequenceInsert failed)."""
    nodes = [helper.make_node("SequenceConstruct", ["x0", "x1"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "x2"], ["s2"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=1, new_axis=new_axis)]
    _run_both(_seq_model(nodes, 3), 3)


def test_split_to_sequence_then_sequence_at():
    pos = helper.make_tensor("pos", TensorProto.INT64, [], [1])
    nodes = [helper.make_node("SplitToSequence", ["x0"], ["s"], axis=1, keepdims=1),
             helper.make_node("Constant", [], ["p"], value=pos),
             helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    _run_both(_seq_model(nodes, 1), 1)


def test_a_sequence_graph_output_is_refused_by_name():
    seq_type = helper.make_tensor_sequence_value_info("s", F, [2, 3])
    model = _seq_model([helper.make_node("SequenceConstruct", ["x0", "x1"], ["s"])], 2,
                       out_type=seq_type)
    with pytest.raises(UnsupportedError, match="graph output 's' is an ONNX sequence"):
        compiler.compile(model)


def test_an_empty_optional_has_no_element():
    tensor_type = helper.make_tensor_type_proto(F, [2, 3])
    nodes = [helper.make_node("Optional", [], ["o"], type=tensor_type),
             helper.make_node("OptionalHasElement", ["o"], ["y"])]
    model = _model(nodes, [], [helper.make_tensor_value_info("y", TensorProto.BOOL, [])],
                   opsets=(("", 18),))
    assert compiler.compile(model).session().run(None, {})[0].item() is False
