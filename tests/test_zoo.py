"""Fast checks of the model zoo (scripts/zoo.py) on its small variants."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import zoo  # noqa: E402

ort = pytest.importorskip("onnxruntime")

# Small variants: every zoo entry, sized to keep the whole file well under 30 s.
SMALL: dict[str, dict] = {
    "mlp": {},
    "cnn": {},
    "dwsep": {},
    "transformer": {},
    "bert": dict(layers=1, seq=16),
    "resnet50": dict(blocks=(1, 1, 1, 1), image=64),
    "mobilenetv2": dict(image=64),
    "squeezenet": dict(image=64),
    "inception": dict(image=64),
    "densenet": dict(blocks=(2, 2, 2, 2), image=64),
    "bert_torch_style": {},
}
# models fed token ids and masks (int64), as PyTorch exports of text models are
INT_INPUTS = {"bert_torch_style"}


@functools.lru_cache(maxsize=None)
def _model(name: str) -> onnx.ModelProto:
    return zoo.build(name, **SMALL[name])


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, zoo.random_inputs(model))


def test_small_covers_zoo():
    assert set(SMALL) == set(zoo.ZOO)


@pytest.mark.parametrize("name", list(SMALL))
def test_checker_full(name):
    onnx.checker.check_model(_model(name), full_check=True)


@pytest.mark.parametrize("name", list(SMALL))
def test_metadata(name):
    m = _model(name)
    assert m.ir_version == 8
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)]
    inits = {t.name for t in m.graph.initializer}
    inputs = [vi for vi in m.graph.input if vi.name not in inits]
    assert inputs
    for vi in [*inputs, *m.graph.output]:
        tt = vi.type.tensor_type
        want = onnx.TensorProto.INT64 if name in INT_INPUTS and vi in inputs else \
            onnx.TensorProto.FLOAT
        assert tt.elem_type == want, vi.name
        dims = tt.shape.dim
        assert dims and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims), vi.name


@pytest.mark.parametrize("name", list(SMALL))
def test_unique_node_names(name):
    names = [n.name for n in _model(name).graph.node]
    assert all(names), "every node needs a name"
    assert len(set(names)) == len(names), [n for n in names if names.count(n) > 1]


@pytest.mark.parametrize("name", list(SMALL))
def test_onnxruntime_outputs_sane(name):
    m = _model(name)
    outs = _run(m)
    _, shapes = zoo.io_shapes(m)
    assert len(outs) == len(shapes)
    for out, shape in zip(outs, shapes.values()):
        assert list(out.shape) == shape
        assert out.dtype == np.float32
        assert np.isfinite(out).all()
        assert 1e-2 < float(out.std()) < 1e2


def test_expected_io():
    assert zoo.io_shapes(_model("mlp")) == ({"input": [4, 784]}, {"probs": [4, 10]})
    assert zoo.io_shapes(_model("cnn")) == ({"input": [1, 3, 32, 32]}, {"logits": [1, 10]})
    assert zoo.io_shapes(_model("dwsep")) == ({"input": [1, 32, 56, 56]}, {"output": [1, 32, 56, 56]})
    assert zoo.io_shapes(_model("transformer")) == ({"x": [1, 16, 64]}, {"y": [1, 16, 64]})
    assert zoo.io_shapes(_model("resnet50")) == ({"input": [1, 3, 64, 64]}, {"logits": [1, 1000]})


def test_op_coverage():
    def ops(name):
        return {n.op_type for n in _model(name).graph.node}

    assert {"Conv", "BatchNormalization", "Relu", "MaxPool", "AveragePool", "Add", "Concat",
            "GlobalAveragePool", "Flatten", "Gemm"} <= ops("cnn")
    assert {"Conv", "BatchNormalization", "Clip", "Add"} <= ops("dwsep")
    assert any(n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
               for n in _model("dwsep").graph.node)
    assert {"MatMul", "Add", "Reshape", "Transpose", "Softmax", "Mul", "Erf", "Div",
            "LayerNormalization"} <= ops("transformer")
    assert {"Gemm", "MatMul", "Relu", "Softmax"} <= ops("mlp")


def test_deterministic_and_seeded():
    a = zoo.build("cnn").SerializeToString()
    assert a == zoo.build("cnn").SerializeToString()
    assert a != zoo.build("cnn", seed=1).SerializeToString()


def test_random_inputs_skip_initializers():
    m = _model("cnn")
    feeds = zoo.random_inputs(m, seed=3)
    assert list(feeds) == ["input"]
    assert feeds["input"].dtype == np.float32 and feeds["input"].shape == (1, 3, 32, 32)
    np.testing.assert_array_equal(feeds["input"], zoo.random_inputs(m, seed=3)["input"])


def test_build_unknown_name():
    with pytest.raises(KeyError):
        zoo.build("no-such-model")


def test_example_cnn_matches_zoo():
    """examples/cnn.onnx is `python scripts/zoo.py cnn -o examples/cnn.onnx`; regenerate it if this fails."""
    path = REPO / "examples" / "cnn.onnx"
    assert path.stat().st_size < 300_000
    ex, ref = onnx.load(str(path)), _model("cnn")
    onnx.checker.check_model(ex, full_check=True)
    assert [(n.name, n.op_type, list(n.input)) for n in ex.graph.node] == \
           [(n.name, n.op_type, list(n.input)) for n in ref.graph.node]
    assert [(t.name, list(t.dims)) for t in ex.graph.initializer] == \
           [(t.name, list(t.dims)) for t in ref.graph.initializer]


def test_cli(tmp_path):
    script = str(REPO / "scripts" / "zoo.py")
    listing = subprocess.run([sys.executable, script, "--list"], check=True, capture_output=True, text=True)
    assert [line.split()[0] for line in listing.stdout.splitlines()] == list(zoo.ZOO)
    out = tmp_path / "t.onnx"
    subprocess.run([sys.executable, script, "transformer", "-p", "layers=2", "-o", str(out)],
                   check=True, capture_output=True)
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert sum(n.op_type == "LayerNormalization" for n in m.graph.node) == 4
