"""End to end: tiny HuggingFace BERT and GPT-2 exports passed through onnxruntime's
transformer optimizer (com.microsoft fused ops), compiled by
onnxc and compared with onnxruntime on the same optimized file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import compiler

DATA = Path(__file__).resolve().parents[1] / "data"
B, S = 2, 8


def _config(model: onnx.ModelProto) -> tuple[int, int]:
    """(num_heads, hidden_size) read from the export: hidden = the first LayerNorm's width,
    head size = the last constant of the reshape that splits the heads."""
    inits = {t.name: t for t in model.graph.initializer}
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    hidden = int(inits[ln.input[1]].dims[0])
    producer = {o: n for n in model.graph.node for o in n.output}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t)
              for n in model.graph.node if n.op_type == "Constant"}

    def value(name):
        node = producer.get(name)
        while node is not None and node.op_type == "Unsqueeze":
            name, node = node.input[0], producer.get(node.input[0])
        return consts.get(name)

    for n in model.graph.node:
        shape = producer.get(n.input[1]) if n.op_type == "Reshape" else None
        if shape is not None and shape.op_type == "Concat" and len(shape.input) == 4:
            head = value(shape.input[3])
            if head is not None and int(head.reshape(-1)[0]) > 0:
                return hidden // int(head.reshape(-1)[0]), hidden
    raise AssertionError("no head-splitting reshape in the export")


def _optimized(name: str, model_type: str, tmp_path) -> tuple[str, set]:
    from onnxruntime.transformers import optimizer

    path = DATA / f"{name}.onnx"
    heads, hidden = _config(onnx.load(str(path)))
    # opt_level=0: the optimizer's own fusions only (levels >= 1 first run onnxruntime's
    # graph optimizer, whose wrapper imports torch)
    opt = optimizer.optimize_model(str(path), model_type=model_type, num_heads=heads,
                                   hidden_size=hidden, opt_level=0)
    out = tmp_path / f"{name}_ort_optimized.onnx"
    opt.save_model_to_file(str(out))
    ops = {n.op_type for n in opt.model.graph.node if n.domain == "com.microsoft"}
    return str(out), ops


def _feeds(names):
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 1000, (B, S)).astype(np.int64),
             "attention_mask": np.array([[1] * S, [1] * (S - 3) + [0] * 3], np.int64),
             "token_type_ids": np.concatenate([np.zeros((B, S // 2), np.int64),
                                               np.ones((B, S // 2), np.int64)], axis=1)}
    return {n: feeds[n] for n in names}


@pytest.mark.parametrize("name,model_type,expected", [
    ("hf_bert_tiny", "bert", {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization",
                              "BiasGelu"}),
    ("hf_gpt2_tiny", "gpt2", {"SkipLayerNormalization", "FastGelu"}),
])
def test_ort_optimized_export_matches_onnxruntime(name, model_type, expected, tmp_path):
    path, ops = _optimized(name, model_type, tmp_path)
    assert expected <= ops, ops          # the optimizer really fused: not a vacuous pass
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    feeds = _feeds(names)
    cm = compiler.compile(path, input_shapes={n: [B, S] for n in names})
    rules = {(k["ops"], k["rule"]) for k in cm.report["kernel_table"]}
    assert ("SkipLayerNormalization", "cpu.row_reduction") in rules   # our layer_norm kernel
    got = cm.session().run(None, feeds)
    want = sess.run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * float(np.abs(w).max()))


def test_onnxruntime_graph_optimizer_rms_norm(tmp_path):
    """onnxruntime's own graph optimizer (ORT_ENABLE_EXTENDED, saved with
    ``optimized_model_filepath``) turns a T5 / LLaMA RMSNorm into SimplifiedLayerNormalization
    in the default domain, which onnx does not define: onnxc reads it as onnxruntime does."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    hidden = 48
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["one", "rms"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["xn"]),
             helper.make_node("Mul", ["w", "xn"], ["y"])]
    g = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [B, S, hidden])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [B, S, hidden])], inits)
    src, out = tmp_path / "rms.onnx", tmp_path / "rms_ort.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(src))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(out))
    assert [(n.domain, n.op_type) for n in optimized.graph.node] == [
        ("", "SimplifiedLayerNormalization")]
    x = rng.standard_normal((B, S, hidden)).astype(np.float32)
    want = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    cm = compiler.compile(str(out))
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], want[0], rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("per_channel", [False, True])
def test_ort_optimized_then_dynamic_int8_bert(per_channel, tmp_path):
    """onnxruntime's BERT deployment recipe: its transformer optimizer, then quantize_dynamic
    (QAttention, QEmbedLayerNormalization, DynamicQuantizeLinear + MatMulInteger)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path, _ = _optimized("hf_bert_tiny", "bert", tmp_path)
    qpath = str(tmp_path / "bert_dyn.onnx")
    quantize_dynamic(path, qpath, weight_type=QuantType.QInt8, per_channel=per_channel,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    ops = {n.op_type for n in onnx.load(qpath).graph.node if n.domain == "com.microsoft"}
    assert {"QAttention", "QEmbedLayerNormalization"} <= ops, ops
    sess = ort.InferenceSession(qpath, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    feeds = _feeds(names)
    cm = compiler.compile(qpath, input_shapes={n: [B, S] for n in names})
    for g, w in zip(cm.session().run(None, feeds), sess.run(None, feeds)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * float(np.abs(w).max()))
