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


def test_unnamed_symbolic_dimension_export_is_refused_by_name(tmp_path):
    """A named dim stays symbolic (tests/compiler/test_symbolic.py); an unnamed one has no
    name to bind or range, so the model is compiled per shape and cannot be exported."""
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])])
    cm = compiler.compile(m)
    assert isinstance(cm, compiler.DynamicModel)
    assert "input 'x' has a symbolic dimension '?'" in cm.report["why"]
    with pytest.raises(compiler.CompileError, match="input_shapes"):
        cm.export("x.so")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    cm = compiler.compile(m)
    assert isinstance(cm, compiler.CompiledModel)
    cm.export(str(tmp_path / "x.so"))


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


# -- strings that are not UTF-8 (issue #19) ---------------------------------------------------
# protobuf hands such a field back as bytes: an identifier is refused naming the field, free
# text (doc_string, producer_name/version, metadata_props values) is read with escapes.

NOT_UTF8 = b"nan\xedodel"


def set_raw(msg, field: str, raw: bytes, index: int | None = None) -> None:
    """Set a string field of ``msg`` (element ``index`` of a repeated one) to ``raw`` bytes
    through the wire format: protobuf's setters refuse bytes that are not UTF-8."""
    number = msg.DESCRIPTOR.fields_by_name[field].number

    def varint(v):
        out = bytearray()
        while True:
            out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
            v >>= 7
            if not v:
                return bytes(out)

    def encode(b):
        return varint(number << 3 | 2) + varint(len(b)) + b

    if index is None:
        msg.MergeFromString(encode(raw))
        return
    values = [v if isinstance(v, bytes) else v.encode() for v in getattr(msg, field)]
    values[index] = raw
    msg.ClearField(field)
    msg.MergeFromString(b"".join(encode(v) for v in values))


def _named_model():
    """Add -> Resize(mode) -> If (a subgraph), with an initializer and metadata."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["y"], ["t"], name="inner")], "body", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 1, 2, 4])])
    m = _model([helper.make_node("Add", ["x", "b"], ["s"], name="add"),
                helper.make_node("Resize", ["s", "", "scales"], ["y"], name="resize",
                                 mode="nearest"),
                helper.make_node("If", ["c"], ["z"], name="if0", then_branch=body,
                              else_branch=body)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
                helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 4]),
                helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 2, 4])],
               [numpy_helper.from_array(np.ones(2, "f4"), "b"),
                numpy_helper.from_array(np.array([1, 1, 1, 2], "f4"), "scales")])
    helper.set_model_props(m, {"author": "someone"})
    m.producer_name = "exporter"
    return m


@pytest.mark.parametrize("where, corrupt", [
    ("graph name", lambda m: set_raw(m.graph, "name", NOT_UTF8)),
    (r"node #0 \(Add\) name", lambda m: set_raw(m.graph.node[0], "name", NOT_UTF8)),
    (r"node 'add' \(#0\) input 1", lambda m: set_raw(m.graph.node[0], "input", NOT_UTF8, 1)),
    ("input 0 name", lambda m: set_raw(m.graph.input[0], "name", NOT_UTF8)),
    ("output 1 name", lambda m: set_raw(m.graph.output[1], "name", NOT_UTF8)),
    ("initializer #1 name", lambda m: set_raw(m.graph.initializer[1], "name", NOT_UTF8)),
    (r"node 'resize' \(#1\) attribute 'mode' value",
     lambda m: set_raw(m.graph.node[1].attribute[0], "s", NOT_UTF8)),
    (r"node 'resize' \(#1\) attribute #0 name",
     lambda m: set_raw(m.graph.node[1].attribute[0], "name", NOT_UTF8)),
    ("metadata_props #0 key", lambda m: set_raw(m.metadata_props[0], "key", NOT_UTF8)),
    (r"node 'if0' \(#2\) attribute 'else_branch' subgraph > node #0 \(Identity\) name",
     lambda m: set_raw(m.graph.node[2].attribute[0].g.node[0], "name", NOT_UTF8)),
    ("opset_import #0 domain", lambda m: set_raw(m.opset_import[0], "domain", NOT_UTF8)),
])
def test_identifier_not_utf8_is_refused_naming_the_field(where, corrupt):
    m = _named_model()
    corrupt(m)
    with pytest.raises(ModelError, match=rf"^model: {where} is not valid UTF-8 "
                                         r"\('nan\\xedodel': byte 0xed at offset 3\)"):
        compiler.compile(m)


def test_bit_flip_in_a_name_in_a_file_is_refused(tmp_path):
    data = _named_model().SerializeToString()
    i = data.index(b"resize")  # the node name (its first occurrence)
    path = tmp_path / "flipped.onnx"
    path.write_bytes(data[:i + 2] + bytes([data[i + 2] ^ 0x80]) + data[i + 3:])
    with pytest.raises(ModelError, match=rf"^{path}: node #1 \(Resize\) name is not valid "
                                         r"UTF-8 \('re\\xf3ize': byte 0xf3 at offset 2\)"):
        compiler.compile(str(path))


def test_free_text_not_utf8_is_read_with_escapes_and_one_warning():
    from compiler.frontend.loader import load_model

    m = _named_model()
    set_raw(m, "producer_name", NOT_UTF8)
    set_raw(m.graph.node[0], "doc_string", b"\xff")
    set_raw(m.metadata_props[0], "value", NOT_UTF8)
    warnings: list = []
    proto = load_model(m, warnings)
    assert proto.producer_name == "nan\\xedodel"
    assert proto.graph.node[0].doc_string == "\\xff"
    assert proto.metadata_props[0].value == "nan\\xedodel"
    assert warnings == ["model: 3 free-text field(s) not valid UTF-8, read with backslash "
                        "escapes: model producer_name, node 'add' (#0) doc_string, "
                        "metadata_props #0 value"]
    assert isinstance(m.producer_name, bytes)  # the caller's model is left as it was


def test_free_text_not_utf8_compiles_and_reaches_the_manifest_escaped(tmp_path):
    m = _relu()
    set_raw(m, "producer_name", NOT_UTF8)
    cm = compiler.compile(m)
    assert cm.report["warnings"][0].startswith("model: 1 free-text field(s) not valid UTF-8")
    path = cm.export(str(tmp_path / "m.so"))
    import runtime

    sess = runtime.load(path)
    assert sess.run(None, {"x": -np.ones((2, 3), "f4")})[0].tolist() == [[0.0] * 3] * 2
    from runtime.artifact import read_artifact

    assert read_artifact(path)[0]["manifest"]["model"]["producer"] == "nan\\xedodel"


def test_cli_compile_of_a_name_not_utf8_exits_1_with_one_line(tmp_path):
    import subprocess
    import sys

    m = _relu()
    set_raw(m.graph, "name", NOT_UTF8)
    path = tmp_path / "bad.onnx"
    path.write_bytes(m.SerializeToString())
    out = tmp_path / "out.so"
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(path), "-o",
                        str(out)], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"onnxc compile: error: {path}: graph name is not valid UTF-8 "
                                "('nan\\xedodel': byte 0xed at offset 3); names and other "
                                "identifiers of an ONNX model must be UTF-8 text: the file is "
                                "corrupted or its exporter is broken; re-export the model or "
                                "set the field to UTF-8 text")
    assert "Traceback" not in r.stderr + r.stdout and not out.exists()


# -- large initializers: onnx.checker and shape inference see them as inputs -----------------
def _weighted_model(ir3=False):
    """A 256x128 float weight (128 KB, above LARGE_INITIALIZER_BYTES) into MatMul, a small
    shape constant into Reshape (shape inference reads its value), a small bias."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 128)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([4, 32, 4], np.int64), "shape")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])
    inputs = [x] + ([helper.make_tensor_value_info("b", TensorProto.FLOAT, [128]),  # IR 3:
                     helper.make_tensor_value_info("w", TensorProto.FLOAT, [256, 128]),
                     helper.make_tensor_value_info("shape", TensorProto.INT64, [3])]
                    if ir3 else [])  # every initializer is an input
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
                helper.make_node("Reshape", ["hb", "shape"], ["y"], name="r")],
               inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
               [b, w, shape])
    if ir3:
        m.ir_version = 3
    return m


@pytest.mark.parametrize("ir3", [False, True])
def test_large_initializers_load_as_with_full_inference(ir3, monkeypatch):
    from compiler.frontend import loader

    model = _weighted_model(ir3)
    light, large = loader.without_large_initializers(model)
    assert large == ["w"]
    assert [t.name for t in light.graph.initializer] == ["b", "shape"]
    assert ("w" in {vi.name for vi in light.graph.input})
    fast = loader.load_model(model)
    monkeypatch.setattr(loader, "LARGE_INITIALIZER_BYTES", 1 << 62)
    assert loader.without_large_initializers(model) == (model, [])
    full = loader.load_model(model)
    assert fast.SerializeToString() == full.SerializeToString()
    assert [t.name for t in fast.graph.initializer] == ["b", "w", "shape"]
    assert [vi.name for vi in fast.graph.input] == (["x", "b", "w", "shape"] if ir3 else ["x"])
    y = [vi for vi in fast.graph.output if vi.name == "y"][0]  # Reshape read the constant
    assert [d.dim_value for d in y.type.tensor_type.shape.dim] == [4, 32, 4]
    assert len(model.graph.input) == (4 if ir3 else 1)  # the caller's model is untouched


def test_large_initializer_with_short_data_is_still_refused():
    model = _weighted_model()
    w = [t for t in model.graph.initializer if t.name == "w"][0]
    w.raw_data = w.raw_data[:-4]
    with pytest.raises(ModelError, match="initializer 'w' has 131068 bytes of data"):
        compiler.compile(model)


def test_manifest_model_sha256_is_the_files(tmp_path):
    import hashlib

    p = tmp_path / "w.onnx"
    onnx.save(_weighted_model(), str(p))
    cm = compiler.compile(str(p))
    assert cm.meta["manifest"]["model"]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    inits = {t.name: numpy_helper.to_array(t) for t in _weighted_model().graph.initializer}
    (y,) = cm.session().run(None, {"x": x})
    np.testing.assert_allclose(y, (x @ inits["w"] + inits["b"]).reshape(4, 32, 4),
                               rtol=1e-4, atol=1e-4)


def test_inferred_fields_move_into_a_model_the_caller_gives_up():
    """with_initializers(reuse_model=True) moves value_info / inputs / outputs into the
    model (no copy of its initializers): the very model comes back, serialized as the copy
    would be.  Where inference changed anything else, it copies as before."""
    from compiler.frontend import loader

    model = loader.load_model(_weighted_model())
    light, large = loader.without_large_initializers(model)
    inferred = loader._inferred(light, "m")
    want = loader.with_initializers(_copy(inferred), _copy(model), large).SerializeToString()
    mine = _copy(model)
    got = loader.with_initializers(_copy(inferred), mine, large, reuse_model=True)
    assert got is mine and got.SerializeToString() == want
    other = _copy(inferred)
    other.doc_string = "changed by inference"  # not a field inference fills in: copied
    mine = _copy(model)
    got = loader.with_initializers(other, mine, large, reuse_model=True)
    assert got is not mine and got.doc_string == "changed by inference"
    assert mine.SerializeToString() == model.SerializeToString()


def test_loading_a_file_equals_loading_its_proto(tmp_path):
    """A path (the proto read here: inferred fields moved into it) and the caller's proto
    (left untouched) load to the same bytes."""
    p = tmp_path / "w.onnx"
    model = _weighted_model()
    onnx.save(model, str(p))
    before = model.SerializeToString()
    from compiler.frontend.loader import load_model

    assert load_model(str(p)).SerializeToString() == load_model(model).SerializeToString()
    assert model.SerializeToString() == before


def _copy(m):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return out


def test_an_optional_sequence_graph_output_is_refused_by_name():
    """If -> optional(seq) (onnxruntime's optional_sequence_tensor.onnx): refused at load,
    naming the output, not by a bare AttributeError from the If converter."""
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [5]))
    opt = helper.make_optional_type_proto(seq)
    x = numpy_helper.from_array(np.arange(5, dtype=np.float32))
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["x"], value=x),
         helper.make_node("SequenceConstruct", ["x"], ["s"]),
         helper.make_node("Optional", ["s"], ["o"])], "else", [],
        [helper.make_value_info("o", opt)])
    then_g = helper.make_graph([helper.make_node("Optional", [], ["e"], type=seq)], "then", [],
                               [helper.make_value_info("e", opt)])
    g = helper.make_graph([helper.make_node("If", ["c"], ["out"], then_branch=then_g,
                                            else_branch=else_g)], "g",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_value_info("out", opt)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    with pytest.raises(UnsupportedError, match="graph output 'out' is an optional ONNX sequence"):
        compiler.compile(model).session().run(None, {"c": np.array(True)})


def test_model_local_functions_are_inlined():
    """A call of a model-local function (torch.onnx dynamo exports call onnxscript's
    torch_lib functions; onnxruntime's function_with_variadics.onnx) compiles as its body,
    also inside an If branch; it was refused as an op with no converter."""
    from tests.conftest import assert_close, ort_run

    fn = helper.make_function(
        "my.domain", "axpy", ["a", "x"], ["y"],
        [helper.make_node("Mul", ["a", "x"], ["ax"]), helper.make_node("Add", ["ax", "x"], ["y"])],
        [helper.make_opsetid("", 17)])
    branch = helper.make_graph([helper.make_node("axpy", ["x", "y"], ["z"], domain="my.domain")],
                               "b", [], [helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                                       [2, 3])])
    nodes = [helper.make_node("axpy", ["a", "x"], ["y"], domain="my.domain"),
             helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=branch)]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                     helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(True), "c")])
    model = helper.make_model(g, functions=[fn], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 1)])
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((2, 3)).astype(np.float32) for k in ("a", "x")}
    assert_close(compiler.compile(model).session().run(None, feeds), ort_run(model, feeds))
