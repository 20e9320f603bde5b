"""compiler/frontend/lenient.py: models onnxruntime runs but the ONNX checker refuses are
compiled as onnxruntime reads them, with one warning naming what was lenient."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, TensorProto

import compiler
from compiler.errors import ModelError
from compiler.frontend import lenient
from tests.conftest import REPO, assert_close, ort_run

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _relu(in_shape, out_vi):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")],
                  [helper.make_tensor_value_info("x", F, in_shape)], [out_vi])


def _layer_norm(opset, extra=(), out_shape=(2, 3, 8)):
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["ln"], name="ln0",
                              axis=-1, epsilon=1e-5), *extra]
    out = extra[-1].output[0] if extra else "ln"
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 8])],
                  [helper.make_tensor_value_info(out, F, list(out_shape))],
                  [numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "s"),
                   numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "b")],
                  opset=opset)


def _compile_like_ort(model, feeds):
    """Compile ``model`` (onnxruntime must run it), check the numbers against onnxruntime
    and return the report's warnings."""
    want = ort_run(model, feeds)
    cm = compiler.compile(model)
    assert_close(cm.session().run(None, feeds), want)
    return cm.report["warnings"]


def _untyped(name):
    vi = onnx.ValueInfoProto()
    vi.name = name
    return vi


def _shapeless(name):
    vi = _untyped(name)
    vi.type.tensor_type.elem_type = F
    return vi


X = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}


@pytest.mark.parametrize("out_vi, what", [
    (_untyped("y"), "output 'y' is declared without a type"),
    (_shapeless("y"), "output 'y' is declared without a shape"),
    (helper.make_tensor_value_info("y", F, [-1, 3]),
     "output 'y' declares dimension -1 at axis 0 (read as unknown)"),
])
def test_output_declarations_onnxruntime_accepts(out_vi, what):
    m = _relu([2, 3], out_vi)
    with pytest.raises(onnx.checker.ValidationError if "-1" not in what else
                       onnx.shape_inference.InferenceError):  # what onnx says (before: refused)
        onnx.checker.check_model(m)
        onnx.shape_inference.infer_shapes(m, strict_mode=True)
    warnings = _compile_like_ort(m, X)
    assert len(warnings) == 1 and "accepted as onnxruntime does" in warnings[0]
    assert what in warnings[0]


def test_minus_one_input_dimension_is_symbolic():
    m = _relu([-1, 3], helper.make_tensor_value_info("y", F, [-1, 3]))
    cm = compiler.compile(m)
    # a name the loader made up has no range: per shape, and the reason says how to range it
    assert isinstance(cm, compiler.DynamicModel)
    assert "(read as 'x_dim0'): compiled per shape" in cm.report["why"]
    assert "dims={'x_dim0': (min, max)}" in cm.report["why"]
    assert [d for d in cm.report["inputs"][0]["shape"]] == ["x_dim0", 3]
    (w,) = cm.report["warnings"]
    assert "input 'x' declares dimension -1 at axis 0 (read as symbolic 'x_dim0')" in w
    sess = cm.session()
    for rows in (1, 5):
        x = {"x": RNG.standard_normal((rows, 3)).astype(np.float32)}
        assert_close(sess.run(None, x), ort_run(m, x))
    # fixed up front, one artifact; the warning says what -1 was read as
    cm = compiler.compile(m, input_shapes={"x": [4, 3]})
    assert any("'x_dim0'" in w for w in cm.report["warnings"])
    x = {"x": RNG.standard_normal((4, 3)).astype(np.float32)}
    assert_close(cm.session().run(None, x), ort_run(m, x))

    # given a range, the loader's name stays symbolic: one artifact for every row count
    cm = compiler.compile(m, dims={"x_dim0": (1, 8)})
    assert isinstance(cm, compiler.CompiledModel)
    assert [d["name"] for d in cm.report["dims"]] == ["x_dim0"]
    sess = cm.session()
    for rows in (1, 8):
        x = {"x": RNG.standard_normal((rows, 3)).astype(np.float32)}
        assert_close(sess.run(None, x), ort_run(m, x))


@pytest.mark.parametrize("opset", [14, 11])
def test_layer_normalization_below_its_first_opset(opset):
    x = {"x": RNG.standard_normal((2, 3, 8)).astype(np.float32)}
    m = _layer_norm(opset)
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered"):
        onnx.checker.check_model(m)
    (w,) = _compile_like_ort(m, x)
    assert ("node 'ln0' (LayerNormalization) is defined from opset 17 on, the model imports "
            f"opset {opset}") in w


def test_other_ops_keep_the_models_opset():
    # Unsqueeze-11 takes axes as an attribute (13 made it an input): the LayerNormalization
    # is read at 17, the Unsqueeze still at the model's opset 11.
    x = {"x": RNG.standard_normal((2, 3, 8)).astype(np.float32)}
    m = _layer_norm(11, [helper.make_node("Unsqueeze", ["ln"], ["y"], axes=[0])],
                    out_shape=(1, 2, 3, 8))
    (w,) = _compile_like_ort(m, x)
    assert "LayerNormalization" in w and "Unsqueeze" not in w


def test_several_lenient_things_make_one_warning():
    x = {"x": RNG.standard_normal((2, 3, 8)).astype(np.float32)}
    m = _layer_norm(14, [helper.make_node("Relu", ["ln"], ["y"])])
    m.graph.output[0].CopyFrom(_untyped("y"))
    m.graph.value_info.append(helper.make_tensor_value_info("ln", F, [-1, 3, 8]))
    (w,) = _compile_like_ort(m, x)
    assert "LayerNormalization" in w and "output 'y' is declared without a type" in w
    assert "value_info 'ln' declares dimension -1" in w


def test_strict_models_get_no_warning():
    m = _relu([2, 3], helper.make_tensor_value_info("y", F, [2, 3]))
    assert _compile_like_ort(m, X) == []
    fixed, leniency = lenient.prepare(m, "model")
    assert fixed is m and leniency.warning("model") is None


def test_cli_prints_the_warning(tmp_path):
    path = tmp_path / "ln14.onnx"
    onnx.save(_layer_norm(14), path)
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(path), "-o",
                        str(tmp_path / "ln.so")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "LayerNormalization" in lines[0], r.stderr


# -- what stays refused --------------------------------------------------------------------

def test_unknown_op_is_still_refused():
    m = _model([helper.make_node("NoSuchOp", ["x"], ["y"], name="bad")],
               [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(ModelError, match="NoSuchOp"):
        compiler.compile(m)


def test_op_removed_before_the_models_opset_is_not_late():
    assert lenient.first_version("LayerNormalization", 14) == 17
    assert lenient.first_version("LayerNormalization", 17) is None
    assert lenient.first_version("Relu", 14) is None       # defined at 14: no leniency
    assert lenient.first_version("NoSuchOp", 14) is None   # not an ONNX op


def test_shapeless_output_whose_rank_cannot_be_inferred_is_refused_by_name():
    # Reshape to a shape fed at run time, of unknown length: no rank to declare
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
               [helper.make_tensor_value_info("x", F, [2, 3]),
                helper.make_tensor_value_info("shape", TensorProto.INT64, ["n"])],
               [_shapeless("y")])
    with pytest.raises(ModelError, match="output 'y' is declared without a shape and shape "
                       "inference cannot find its element type and rank"):
        compiler.compile(m)


def test_other_negative_dimensions_are_still_refused():
    # onnxruntime reads any negative dimension as unknown; only -1 is an exporter's
    # convention for "unknown", anything else is taken as a corrupted model
    m = _relu([-2, 3], helper.make_tensor_value_info("y", F, [2, 3]))
    with pytest.raises(ModelError, match="negative dimension -2"):
        compiler.compile(m)


def test_value_info_contradicting_its_initializer_reads_the_initializer():
    # transformers' OnnxExporter(ort_fusions="cpu") declares its [1] attention scale
    # initializer as a scalar; strict inference refused ("differ in rank: (1) vs (0)")
    model = _model([helper.make_node("Mul", ["x", "s"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2, 3])],
                   [numpy_helper.from_array(np.array([0.25], np.float32), "s")])
    model.graph.value_info.append(helper.make_tensor_value_info("s", F, []))
    warnings = _compile_like_ort(model, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
    assert any("value_info 's' declares shape [], its initializer has [1]" in w
               for w in warnings)


def _out_of_order(cycle: bool = False):
    """x -> Relu -> Neg -> If(cond, then: Add(neg, x)) written consumers first (what
    onnxruntime's fp16 converter writes); ``cycle``: Relu reads Neg's output too."""
    then = helper.make_graph([helper.make_node("Add", ["neg", "x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    other = helper.make_graph([helper.make_node("Sub", ["neg", "x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then,
                              else_branch=other),  # reads neg inside its branches only
             helper.make_node("Neg", ["relu"], ["neg"], name="neg"),
             helper.make_node("Relu", ["neg" if cycle else "x"], ["relu"], name="relu")]
    g = helper.make_graph(nodes, "unsorted",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_out_of_topological_order_are_sorted():
    m = _out_of_order()
    cm = compiler.compile(m)
    assert any("not in topological order (2 moved" in w for w in cm.report["warnings"])
    for cond in (True, False):
        feeds = {"x": np.array([-1.0, 2.0, -3.0], np.float32), "cond": np.array(cond)}
        assert_close(cm.session().run(None, feeds), ort_run(m, feeds))


def test_a_cycle_is_still_refused():
    with pytest.raises(ModelError, match="topologically sorted"):
        compiler.compile(_out_of_order(cycle=True))


def test_ir3_initializer_not_a_graph_input_reads_as_a_constant():
    # onnxruntime's older test models (mul_1.onnx: IR 3, W an initializer only); the
    # checker refused "W in initializer but not in graph input"
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2, 3])],
                   [numpy_helper.from_array(RNG.standard_normal((2, 3)).astype(np.float32),
                                            "w")], opset=7)
    model.ir_version = 3
    warnings = _compile_like_ort(model, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
    assert any("initializer(s) 'w' are not graph inputs, which IR version 3 requires" in w
               for w in warnings)


def test_ir3_initializer_listed_as_an_input_is_not_lenient():
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [2, 3]),
                    helper.make_tensor_value_info("w", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2, 3])],
                   [numpy_helper.from_array(np.ones((2, 3), np.float32), "w")], opset=7)
    model.ir_version = 3
    assert not lenient.prepare(model, "m")[1].notes
