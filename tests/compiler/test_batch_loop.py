"""A CNN's symbolic batch as a loop over a one-sample build (compiler/lowering/batch_loop.py,
runtime/batch_loop.py): every static rule fires, the artifact serves every batch in the
range and matches onnxruntime, and what is not separable by sample keeps its symbolic build.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
import runtime
from compiler.lowering import batch_loop
from runtime.dims import DimError
from tests.conftest import assert_close, ort_run, zoo


def _symbolic_batch(model: onnx.ModelProto, name: str = "N") -> onnx.ModelProto:
    """``model`` with dim 0 of every graph input and output named ``name``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = name
    del m.graph.value_info[:]
    return m


def _flatten_like_pytorch(channels: int = 8, image: int = 12) -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> x.view(x.size(0), -1) as PyTorch exports it (Shape ->
    Gather -> Unsqueeze -> Concat -> Reshape) -> MatMul + Add, and a second output computed
    from the unbatched input ``scale`` alone."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32)
    feat = channels * (image // 2) ** 2
    fc = (rng.standard_normal((feat, 5)) * 0.05).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([0], np.int64), "axes0")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool"),
        helper.make_node("Shape", ["p"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "zero"], ["n"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0, name="concat"),
        helper.make_node("Reshape", ["p", "newshape"], ["flat"], name="view"),
        helper.make_node("MatMul", ["flat", "fc"], ["y"], name="fc"),
        helper.make_node("Mul", ["scale", "scale"], ["scale_sq"], name="square"),
    ]
    g = helper.make_graph(nodes, "flatten_like_pytorch", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, image, image]),
        helper.make_tensor_value_info("scale", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5]),
         helper.make_tensor_value_info("scale_sq", TensorProto.FLOAT, [4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _batch_mixing() -> onnx.ModelProto:
    """Conv over a symbolic batch, then a mean over the batch axis: not separable."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("ReduceMean", ["c"], ["m"], axes=[0], keepdims=1, name="mean"),
             helper.make_node("Sub", ["c", "m"], ["y"], name="center")]
    g = helper.make_graph(nodes, "batch_mixing", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _images(batch: int, image: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, image, image)).astype(
        np.float32)


@pytest.fixture(scope="module")
def looped(tmp_path_factory):
    """zoo.cnn with a symbolic batch, compiled once, exported and loaded without the
    compiler."""
    model = _symbolic_batch(zoo.cnn())
    cm = compiler.compile(model, dims={"N": (1, 4, 2)})
    path = tmp_path_factory.mktemp("loop") / "cnn.so"
    cm.export(str(path))
    return model, cm, runtime.load(str(path))


def test_cnn_batch_runs_as_a_loop_with_the_static_rules(looped):
    """The symbolic build of this CNN put its convs on dlight's generic reduction; the
    looped one has the conv rules, NCHW[b]c, and no fallback."""
    _, cm, _ = looped
    loop = cm.report["batch_loop"]
    assert loop["dim"] == "N" and loop["inputs"] == ["input"] and loop["outputs"] == ["logits"]
    rules = cm.report["schedules"]
    assert not any(r.startswith("dlight") or r == "fallback" for r in rules), rules
    assert any(r.startswith("cpu.conv2d") for r in rules), rules
    symbolic = compiler.compile(_symbolic_batch(zoo.cnn()), dims={"N": (1, 4, 2)},
                                batch_loop=False)
    assert "batch_loop" not in symbolic.report
    assert any(r.startswith("dlight") or r == "fallback" for r in symbolic.report["schedules"])


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_every_batch_in_the_range_matches_onnxruntime(looped, batch):
    model, _, sess = looped
    feeds = {"input": _images(batch, seed=batch)}
    got = sess.run(None, feeds)
    assert got[0].shape == (batch, 10)
    assert_close(got, ort_run(model, feeds))


def test_signature_shows_the_dim_and_the_manifest_records_the_loop(looped):
    _, cm, sess = looped
    assert [i.shape for i in sess.get_inputs()] == [["N", 3, 32, 32]]
    assert [o.shape for o in sess.get_outputs()] == [["N", 10]]
    meta = sess.get_modelmeta()
    assert meta["batch_loop"] == {"dim": "N", "inputs": ["input"], "outputs": ["logits"]}
    assert meta["dims"] == [{"name": "N", "min": 1, "max": 4, "opt": 2, "declared": True}]
    assert cm.report["dims"] == meta["dims"]


@pytest.mark.parametrize("batch", [0, 5])
def test_batch_outside_the_range_is_refused(looped, batch):
    _, _, sess = looped
    with pytest.raises(DimError, match=r"'N' = %d is outside its range 1\.\.4" % batch):
        sess.run(None, {"input": _images(batch)})


def test_sample_shape_errors_name_the_dim(looped):
    _, _, sess = looped
    with pytest.raises(ValueError, match=r"expected shape \['N', 3, 32, 32\], got \[2, 3, 30, 30\]"):
        sess.run(None, {"input": _images(2, image=30)})
    with pytest.raises(NotImplementedError, match="loop over samples"):
        sess.io_binding()


def test_pytorch_view_and_an_unbatched_output(tmp_path):
    """``x.view(x.size(0), -1)``'s shape arithmetic keeps the batch leading; an output of
    the unbatched input alone is computed once per run, not stacked."""
    model = _flatten_like_pytorch()
    cm = compiler.compile(model, dims={"batch": (1, 6)})
    assert cm.report["batch_loop"]["outputs"] == ["y"]
    sess = cm.session()
    rng = np.random.default_rng(3)
    for batch in (1, 5):
        feeds = {"x": rng.standard_normal((batch, 3, 12, 12)).astype(np.float32),
                 "scale": rng.standard_normal(4).astype(np.float32)}
        got = sess.run(None, feeds)
        assert got[0].shape == (batch, 5) and got[1].shape == (4,)
        assert_close(got, ort_run(model, feeds))
        assert_close(sess.run(["scale_sq"], feeds), [feeds["scale"] ** 2])


def test_a_mean_over_the_batch_keeps_the_symbolic_build():
    model = _batch_mixing()
    cm = compiler.compile(model, dims={"batch": (1, 4)})
    assert "batch_loop" not in cm.report
    sess = cm.session()
    x = np.random.default_rng(2).standard_normal((3, 3, 8, 8)).astype(np.float32)
    assert_close(sess.run(None, {"x": x}), ort_run(model, {"x": x}))


def test_separability_reasons():
    """The analysis names what mixes samples."""
    from compiler.driver import _front_only

    _, _, graph = _front_only(_batch_mixing(), "host", dims={"batch": (1, 4, 1)},
                              batch_loop=False)
    why = batch_loop.separable_graph(graph, "batch")
    assert why is not None and ("reduces" in why or "batch axis" in why), why
    _, _, graph = _front_only(_symbolic_batch(zoo.cnn()), "host", dims={"N": (1, 4, 1)},
                              batch_loop=False)
    assert batch_loop.separable_graph(graph, "N") is None
    # a matmul-only model (no conv or pool) is not worth looping: its symbolic build has
    # the matmul rules on symbolic rows
    mlp = _symbolic_batch(zoo.mlp(batch=1))
    _, _, graph = _front_only(mlp, "host", dims={"N": (1, 4, 1)}, batch_loop=False)
    assert batch_loop.separable_graph(graph, "N") is None
    assert not batch_loop.worth_looping(graph, [{"name": "N", "min": 1}])


def test_undeclared_batch_defaults_to_one_sample_at_opt():
    cm = compiler.compile(_symbolic_batch(zoo.cnn()))
    loop = cm.report["batch_loop"]
    assert (loop["min"], loop["max"], loop["opt"], loop["declared"]) == (1, 128, 1, False)
    assert any("'N' has no declared range" in w for w in cm.report["warnings"])


def test_tuning_reads_the_kernels_the_looped_build_has():
    """lower_to_kernels (what `onnxc tune` extracts tasks from) gives the one-sample
    kernels, as compile_static builds them; with batch_loop=False the symbolic ones."""
    from compiler.driver import lower_to_kernels

    model = _symbolic_batch(zoo.cnn())
    graph, _ = lower_to_kernels(model, dims={"N": (1, 4)})
    assert graph.dim_names == [] and graph.tensors[graph.inputs[0][1]].shape[0] == 1
    graph, _ = lower_to_kernels(model, dims={"N": (1, 4)}, batch_loop=False)
    assert graph.dim_names == ["N"]


def test_fix_dim_sets_every_use_of_the_name():
    m = batch_loop.fix_dim(_flatten_like_pytorch(), "batch", 1)
    dims = [d for vi in list(m.graph.input) + list(m.graph.output)
            for d in vi.type.tensor_type.shape.dim]
    assert not any(d.dim_param == "batch" for d in dims)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
