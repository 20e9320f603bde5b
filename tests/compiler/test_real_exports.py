"""Real exports: PyTorch TorchScript-exported HuggingFace models and a zoo mirror of them.

The committed ``tests/data/hf_*_tiny.onnx`` are tiny random BERT / GPT-2 / DistilBERT
models written by ``scripts/export_hf.py`` (torch.onnx.export, opset 17, dynamo=False,
dynamic ``batch`` and ``sequence`` axes).  Their attention masks and position ids are
computed from Shape/Gather/Unsqueeze/Concat/Range/Slice/ConstantOfShape/Equal/Where/Expand,
which TVM 0.27's converters mishandle (compiler/frontend/converters/tensor.py says how).  ``bert_torch_style``
(scripts/zoo.py) builds the same structure with onnx.helper, so these tests need no torch.

Each model must: compile with its ``batch`` / ``sequence`` symbolic to one artifact that
matches onnxruntime at several shapes; compile with fixed
``input_shapes`` to an artifact that round-trips through ``runtime.load``; and fold all of
its shape arithmetic at compile time (no kernel computes a node that depends on shapes only).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

import compiler
import runtime
from tests.conftest import REPO, assert_close, ort_run, zoo

DATA = REPO / "tests" / "data"
EXPORTS = sorted(DATA.glob("hf_*.onnx"))
MODELS = [p.stem for p in EXPORTS] + ["zoo_bert_torch_style", "zoo_bert_torch_style_10000"]
VOCAB = 1000
# the second (batch, sequence) has batch 1: there ONNX shape inference leaves the exporter's
# broadcasts symbolic, so the shape arithmetic must be folded from Relax's static shapes
SHAPES = [(2, 7), (1, 12)]


@functools.lru_cache(maxsize=None)
def _model(name: str) -> onnx.ModelProto:
    if name == "zoo_bert_torch_style":
        return zoo.build("bert_torch_style", dynamic=True)
    if name == "zoo_bert_torch_style_10000":
        return zoo.build("bert_torch_style", dynamic=True, mask_value="-10000", layers=1)
    return onnx.load(str(DATA / f"{name}.onnx"))


def _path(name: str, tmp_path: Path) -> str:
    if name.startswith("zoo_"):
        path = tmp_path / f"{name}.onnx"
        onnx.save(_model(name), str(path))
        return str(path)
    return str(DATA / f"{name}.onnx")


def _feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int) -> dict:
    """Seeded int64 inputs; the mask pads the tail of the last row with zeros."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        if vi.name == "input_ids":
            feeds[vi.name] = rng.integers(0, VOCAB, (batch, seq), dtype=np.int64)
        elif vi.name == "attention_mask":
            mask = np.ones((batch, seq), np.int64)
            mask[-1, seq - max(1, seq // 3):] = 0
            feeds[vi.name] = mask
        elif vi.name == "token_type_ids":
            feeds[vi.name] = (np.arange(seq)[None, :] >= seq // 2).repeat(batch, 0).astype(np.int64)
        else:
            raise AssertionError(f"unexpected input {vi.name!r}")
    return feeds


def _shape_only_nodes(model: onnx.ModelProto) -> set:
    """Names of the nodes whose outputs do not depend on any input's values (only on
    shapes and constants): with static shapes they must all be folded at compile time."""
    inits = {t.name for t in model.graph.initializer}
    data = {vi.name for vi in model.graph.input if vi.name not in inits}
    shape_only = set()
    for node in model.graph.node:
        if node.op_type not in ("Shape", "Size") and any(i in data for i in node.input):
            data.update(o for o in node.output if o)
        else:
            shape_only.add(node.name)
    return shape_only


def test_exports_are_committed_and_small():
    assert {p.stem for p in EXPORTS} >= {"hf_bert_tiny", "hf_gpt2_tiny", "hf_distilbert_tiny"}
    for p in EXPORTS:
        assert p.stat().st_size < 1_000_000, p
        m = onnx.load(str(p))
        assert [(o.domain or "", o.version) for o in m.opset_import] == [("", 17)]
        ops = {n.op_type for n in m.graph.node}
        # what makes them hard: mask / position arithmetic from shapes
        assert {"Shape", "Gather", "Unsqueeze", "Concat", "Expand", "Where", "ConstantOfShape",
                "Equal", "Cast", "LayerNormalization"} <= ops, p.name
        for vi in m.graph.input:
            dims = vi.type.tensor_type.shape.dim
            assert [d.dim_param for d in dims] == ["batch", "sequence"], (p.name, vi.name)


def test_zoo_mirror_has_the_exporter_structure():
    m = _model("zoo_bert_torch_style")
    onnx.checker.check_model(m, full_check=True)
    ops = {n.op_type for n in m.graph.node}
    assert {"Shape", "Gather", "Unsqueeze", "Concat", "Expand", "Where", "ConstantOfShape",
            "Equal", "Cast", "Sub", "Mul", "Range", "Slice", "Erf",
            "LayerNormalization"} <= ops
    # torch.full((), v): a ConstantOfShape of an empty shape (a rank-0 result)
    assert any(n.op_type == "ConstantOfShape" and n.input[0] == "shape.scalar"
               for n in m.graph.node)


@pytest.mark.parametrize("name", MODELS)
def test_symbolic_matches_onnxruntime(name, tmp_path):
    """The dynamic ``batch`` / ``sequence`` stay symbolic (compiler/frontend/shape_arith.py
    evaluates the mask and position arithmetic on them): one artifact, no per-shape
    compilation, matching onnxruntime at every shape and at other values of a shape."""
    model = _model(name)
    cm = compiler.compile(_path(name, tmp_path))
    assert isinstance(cm, compiler.CompiledModel)  # not the per-shape DynamicModel
    assert [d["name"] for d in cm.report["dims"]] == ["batch", "sequence"]
    sess = cm.session()
    for batch, seq in SHAPES:
        feeds = _feeds(model, batch, seq, seed=seq)
        assert_close(sess.run(None, feeds), ort_run(model, feeds))
    batch, seq = SHAPES[0]
    feeds = _feeds(model, batch, seq, seed=99)
    assert_close(sess.run(None, feeds), ort_run(model, feeds))


@pytest.mark.parametrize("name", MODELS)
def test_static_compile_export_load(name, tmp_path):
    model = _model(name)
    batch, seq = 2, 9
    shapes = {vi.name: [batch, seq] for vi in model.graph.input}
    cm = compiler.compile(_path(name, tmp_path), input_shapes=shapes)
    assert isinstance(cm, compiler.CompiledModel)
    so = cm.export(str(tmp_path / f"{name}.so"))
    loaded = runtime.load(so)
    assert [i.shape for i in loaded.get_inputs()] == [[batch, seq]] * len(shapes)
    for seed in (0, 1):
        feeds = _feeds(model, batch, seq, seed)
        want = ort_run(model, feeds)
        assert_close(loaded.run(None, feeds), want)
        assert_close(cm.session().run(None, feeds), want)

    # shape arithmetic folded at compile time: no kernel computes a shape-only node
    calls = cm.meta["graph"]["calls"]
    assert cm.report["kernels"] == len(calls)
    shape_only = _shape_only_nodes(model)
    computed = {n for c in calls for n in c.get("nodes", [])}
    assert not computed & shape_only, sorted(computed & shape_only)[:10]
    ops = {op for c in calls for op in c.get("ops", "").split("+")}
    assert not ops & {"Shape", "ConstantOfShape", "Range"}, ops


def test_batch_one_sequence_one(tmp_path):
    """The degenerate shapes: every broadcast in the mask arithmetic has a 1 on both sides."""
    for name in ("hf_bert_tiny", "zoo_bert_torch_style"):
        if name not in MODELS:
            continue
        model = _model(name)
        cm = compiler.compile(_path(name, tmp_path),
                              input_shapes={vi.name: [1, 1] for vi in model.graph.input})
        feeds = _feeds(model, 1, 1, seed=0)
        assert_close(cm.session().run(None, feeds), ort_run(model, feeds))


def test_out_of_range_token_ids_are_refused_not_crashed():
    """Token ids index the embedding table; the gather kernel does no bounds check, so the
    session refuses them with a message instead of reading outside the table."""
    cm = compiler.compile(zoo.build("bert_torch_style"))
    sess = cm.session()
    feeds = {i.name: np.ones(i.shape, np.int64) for i in sess.get_inputs()}
    sess.run(None, feeds)
    feeds["input_ids"] = feeds["input_ids"] * 10**6
    with pytest.raises(ValueError, match=r"input 'input_ids': values are indices into node"):
        sess.run(None, feeds)
