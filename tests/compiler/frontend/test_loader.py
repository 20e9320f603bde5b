"""Bad models fail at load with a message naming the file, node or tensor."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, TensorProto

import compiler
from compiler.errors import ModelError, UnsupportedError
from tests.compiler.frontend.converters.reference import (B, F, check_against_reference, onnx_model,
                                                          value_info)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _relu(shape=(2, 3), opset=17):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                  opset=opset)


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="nope.onnx: no such file"):
        compiler.compile(str(tmp_path / "nope.onnx"))


def test_garbage_file(tmp_path):
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\xff\x00garbage" * 10)
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        compiler.compile(str(p))


def test_truncated_file(tmp_path):
    data = _relu().SerializeToString()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelError, match="cut.onnx"):
        compiler.compile(str(p))


def test_dangling_input_names_the_tensor():
    m = _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add0")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(ModelError, match="ghost"):
        compiler.compile(m)


def test_opset_out_of_range():
    with pytest.raises(UnsupportedError, match="opset 99 is outside the supported range"):
        compiler.compile(_relu(opset=99))


def test_symbolic_dimension_export_is_refused_by_name():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    cm = compiler.compile(m)
    assert isinstance(cm, compiler.DynamicModel)
    assert "input 'x' has a symbolic dimension 'batch'" in cm.report["why"]
    with pytest.raises(compiler.CompileError, match="input_shapes"):
        cm.export("x.so")


def test_unsupported_ops_all_reported_at_once():
    m = _model([helper.make_node("FancyOp", ["x"], ["t"], name="fancy1", domain="com.acme"),
                helper.make_node("Relu", ["t"], ["u"], name="relu0"),
                helper.make_node("OtherOp", ["u"], ["y"], name="other2", domain="com.acme")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m.opset_import.append(helper.make_opsetid("com.acme", 1))
    with pytest.raises(UnsupportedError) as e:
        compiler.compile(m)
    msg = str(e.value)
    assert "2 node(s)" in msg and "node 'fancy1': FancyOp (domain com.acme, model opset 1" in msg
    assert "'other2': OtherOp" in msg and "no converter is registered" in msg
    assert "onnxc ops" in msg and "register_op" in msg
    assert "relu0" not in msg


def test_wrong_initializer_type():
    w = numpy_helper.from_array(np.ones((2,), np.int64), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add0")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    with pytest.raises(ModelError, match="add0|Add"):
        compiler.compile(m)


def test_not_a_model():
    with pytest.raises(ModelError, match="expected a path or onnx.ModelProto, got int"):
        compiler.compile(42)


def test_accepts_model_proto_and_path(tmp_path):
    p = tmp_path / "relu.onnx"
    onnx.save(_relu(), str(p))
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    for m in (_relu(), str(p)):
        (y,) = compiler.compile(m).session().run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_opset_below_7_accepted_when_every_op_is_unchanged():
    x = np.array([[True, False], [False, True]])
    node = helper.make_node("Not", ["x"], ["y"])
    check_against_reference(onnx_model(node, [value_info("x", B, [2, 2])], [value_info("y", B, [2, 2])], 1), {"x": x})
    # Add changed at opset 7 (broadcasting): an opset-6 Add is still refused, by name
    node = helper.make_node("Add", ["x", "x"], ["y"])
    model = onnx_model(node, [value_info("x", F, [2])], [value_info("y", F, [2])], 6)
    with pytest.raises(UnsupportedError, match=r"opset 6 is outside .*Add"):
        compiler.compile(model)
