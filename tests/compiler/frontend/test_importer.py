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
