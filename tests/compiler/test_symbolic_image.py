"""A CNN exported with a symbolic height and width (detection / segmentation exports): its
convs and pools keep NCHW[b]c and the blocked rules (compiler/lowering/legalize_conv_nchwc
pads the output columns to whole register tiles), and every image size in the range
matches onnxruntime, odd and prime sizes included.  Before, every conv of such a model
fell to dlight's generic reduction (ResNet-50 at 224 x 224: 84x onnxruntime's time).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
import runtime
from compiler.lowering import legalize_conv_nchwc
from schedules.cpu import conv2d_nchwc
from tests.conftest import assert_close, ort_run


def _cnn(segment: bool) -> onnx.ModelProto:
    """Stem 7x7/2 (NCHW input) -> max pool 3x3/2 -> 1x1 (unpadded: clamped columns) ->
    depthwise 3x3 -> 3x3/2 -> strided unpadded 1x1 (subsample) + residual, then global
    average pool (classification) or the map itself (``segment``)."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5).astype(
            np.float32)

    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w0", w(16, 3, 7, 7)), ("b0", w(16, 1)[:, 0]), ("w1", w(32, 16, 1, 1)),
        ("w2", w(32, 1, 3, 3)), ("w3", w(32, 32, 3, 3)), ("w4", w(32, 32, 1, 1)))]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[3] * 4, strides=[2, 2]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1] * 4),
        helper.make_node("Conv", ["p0", "w1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, group=32),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], pads=[1] * 4, strides=[2, 2]),
        helper.make_node("Conv", ["c2", "w4"], ["c4"], strides=[2, 2]),
        helper.make_node("Add", ["c3", "c4"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
    ]
    out = ["batch", 32, "oh", "ow"]
    if not segment:
        nodes.append(helper.make_node("GlobalAveragePool", ["r"], ["g"]))
        nodes.append(helper.make_node("Flatten", ["g"], ["y"]))
        out = ["batch", 32]
    else:
        nodes[-1].output[0] = "y"
    g = helper.make_graph(
        nodes, "symbolic_image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


DIMS = {"batch": (1, 2, 1), "height": (16, 96, 64), "width": (16, 96, 64)}


@pytest.fixture(scope="module", params=[False, True], ids=["classify", "segment"])
def built(request, tmp_path_factory):
    model = _cnn(request.param)
    cm = compiler.compile(model, dims=DIMS)
    path = tmp_path_factory.mktemp("image") / "m.so"
    cm.export(str(path))
    return model, cm, runtime.load(str(path))


def test_convs_and_pools_keep_the_blocked_rules(built):
    _, cm, _ = built
    assert cm.report["layout"]["convs_converted"] == 5
    rules = {k["kernel"]: k["rule"] for k in cm.report["kernel_table"]}
    conv_rules = {r for k, r in rules.items() if "conv" in k}
    assert conv_rules == {"cpu.conv2d_nchwc"}, rules
    assert rules["max_pool2d"] == "cpu.pool2d_nchwc", rules


@pytest.mark.parametrize("hw", [(64, 64), (16, 16), (96, 96), (37, 53), (61, 17), (23, 90)])
def test_every_image_size_matches_onnxruntime(built, hw):
    model, _, sess = built
    x = np.random.default_rng(hw[0] * 100 + hw[1]).standard_normal(
        (1, 3, *hw)).astype(np.float32)
    got = sess.run(None, {"x": x})
    assert_close(got, ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_a_batch_of_images_matches_onnxruntime(built):
    model, _, sess = built
    x = np.random.default_rng(7).standard_normal((2, 3, 45, 30)).astype(np.float32)
    assert_close(sess.run(None, {"x": x}), ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_columns_are_tiled_for_the_dims_opt_width():
    """The tile of a symbolic width is the one that pads least at its opt value: 56 columns
    over 4 channel blocks take 4-pixel tiles (56 exact); 3 take one tile of 3 rather than
    4 columns of which one is padding."""
    from tvm import tirx

    w = tirx.Var("width", "int64")
    with legalize_conv_nchwc.register_tiles(16, 20, {"width": 56}):
        assert legalize_conv_nchwc.symbolic_columns(w, 4, 16) == 4
    with legalize_conv_nchwc.register_tiles(16, 20, {"width": 3}):
        assert legalize_conv_nchwc.symbolic_columns(w, 4, 16) == 3
    # no opt value: tiled for NOMINAL_WIDTH; no registered tile: one column
    with legalize_conv_nchwc.register_tiles(16, 20):
        assert legalize_conv_nchwc.symbolic_columns(w, 4, 16) == 4
    assert legalize_conv_nchwc.symbolic_columns(w, 4, 16) == 1


def test_symbolic_tiles_stay_within_a_stack_buffer():
    """A tile of more than 1 KB of accumulators is heap-allocated by TVM and LLVM may
    keep it in memory: a symbolic image's tiles stay within 16 AVX-512 vectors."""
    assert conv2d_nchwc.symbolic_budget(16, 20) == 16
    assert conv2d_nchwc.symbolic_budget(8, 12) == 12
    for opt in (7, 14, 28, 56, 112, 300):
        from tvm import tirx

        with legalize_conv_nchwc.register_tiles(16, 20, {"width": opt}):
            xt = legalize_conv_nchwc.symbolic_columns(tirx.Var("width", "int64"), 8, 16)
        assert xt * conv2d_nchwc.columns_group(xt, 8, 1, 16) <= 16


def _dense_se() -> onnx.ModelProto:
    """DenseNet's pre-activation BatchNorm -> ReLU -> conv and channel concat, then a
    squeeze-and-excitation block (global mean -> 1x1 -> ReLU -> 1x1 -> Sigmoid -> Mul),
    over a symbolic image."""
    rng = np.random.default_rng(1)

    def t(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    c = 32
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w0", t(c, 3, 3, 3)), ("g", t(c) + 1), ("b", t(c)), ("m", t(c)),
        ("v", np.abs(t(c)) + 0.5), ("w1", t(c, c, 3, 3, scale=0.1)),
        ("w2", t(c, 2 * c, 1, 1, scale=0.1)), ("se1", t(8, 2 * c, 1, 1)),
        ("se2", t(2 * c, 8, 1, 1)))]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w0"], ["c0"], pads=[1] * 4, strides=[2, 2]),
        n("BatchNormalization", ["c0", "g", "b", "m", "v"], ["bn"]),
        n("Relu", ["bn"], ["r"]),
        n("Conv", ["r", "w1"], ["c1"], pads=[1] * 4),
        n("Concat", ["c0", "c1"], ["cat"], axis=1),
        n("GlobalAveragePool", ["cat"], ["pool"]),
        n("Conv", ["pool", "se1"], ["s1"]),
        n("Relu", ["s1"], ["s1r"]),
        n("Conv", ["s1r", "se2"], ["s2"]),
        n("Sigmoid", ["s2"], ["gate"]),
        n("Mul", ["cat", "gate"], ["excited"]),
        n("Conv", ["excited", "w2"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "dense_se",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, "oh", "ow"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def dense_se(tmp_path_factory):
    model = _dense_se()
    cm = compiler.compile(model, dims={"height": (16, 96, 64), "width": (16, 96, 64)})
    path = tmp_path_factory.mktemp("dense_se") / "m.so"
    cm.export(str(path))
    return model, cm, runtime.load(str(path))


def test_batchnorm_concat_and_excitation_keep_their_rules(dense_se):
    """The pre-activation BatchNorm folds to a multiply-add (it had kept the whole graph
    NCHW), the concat's BatchNorm-free epilogue and the excitation get their rules, the
    global mean the tiled reduction: nothing on dlight or the fallback."""
    _, cm, _ = dense_se
    assert cm.report["layout"]["convs_converted"] == 5
    rules = cm.report["schedules"]
    assert not any(r.startswith("dlight") or r == "fallback" for r in rules), rules
    assert "cpu.reduce_broadcast" in rules and "cpu.tiled_reduction" in rules, rules


@pytest.mark.parametrize("hw", [(64, 64), (17, 29), (96, 40)])
def test_batchnorm_concat_and_excitation_match_onnxruntime(dense_se, hw):
    model, _, sess = dense_se
    x = np.random.default_rng(hw[0] + hw[1]).standard_normal((1, 3, *hw)).astype(np.float32)
    assert_close(sess.run(None, {"x": x}), ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def _narrow_channels() -> onnx.ModelProto:
    """ShuffleNetV2's and RegNet-Y's narrow channels over a symbolic image: 58 channels (no
    channel block divides them: their convs stay NCHW) through an unpadded 1x1 + ReLU and
    a strided depthwise 3x3, a 1x1 to 48 channels, a grouped 3x3/2 of 8-wide groups
    (narrower than a block: NCHW too), and ShuffleNet's channel shuffle (Shape -> Reshape
    -> Transpose -> Reshape over the symbolic image)."""
    rng = np.random.default_rng(2)

    def t(*shape):
        return (rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5).astype(
            np.float32)

    c, g = 58, 48
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w1", t(c, 3, 1, 1)), ("b1", t(c, 1)[:, 0]), ("w2", t(c, 1, 3, 3)),
        ("w3", t(g, c, 1, 1)), ("w4", t(g, 8, 3, 3)),
        ("lead", np.array([1, 2, g // 2], np.int64)), ("lead2", np.array([1, g], np.int64)),
        ("two", np.array([2], np.int64)), ("four", np.array([4], np.int64)))]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, strides=[2, 2], group=c),
        n("Conv", ["c2", "w3"], ["c3"]),
        n("Relu", ["c3"], ["r3"]),
        n("Conv", ["r3", "w4"], ["c4"], pads=[1] * 4, strides=[2, 2], group=g // 8),
        n("Shape", ["c4"], ["shape"]),  # as exporters write it: the image dims from Shape
        n("Slice", ["shape", "two", "four"], ["hw"]),
        n("Concat", ["lead", "hw"], ["split"], axis=0),
        n("Reshape", ["c4", "split"], ["s"]),
        n("Transpose", ["s"], ["st"], perm=[0, 2, 1, 3, 4]),
        n("Concat", ["lead2", "hw"], ["merge"], axis=0),
        n("Reshape", ["st", "merge"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "narrow_channels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", g, "oh", "ow"])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    model = _narrow_channels()
    cm = compiler.compile(model, dims={"batch": (1, 1, 1), "height": (8, 96, 56),
                                       "width": (8, 96, 56)})
    path = tmp_path_factory.mktemp("narrow") / "m.so"
    cm.export(str(path))
    return model, cm, runtime.load(str(path))


def test_narrow_channel_convs_keep_the_nchw_rules(narrow):
    """Convs whose channels no block divides stay NCHW and take the NCHW rules over the
    padded columns (they fell to dlight's generic reduction: ShuffleNetV2 with a dynamic
    image 23x onnxruntime's time); the channel shuffle's reshapes are views, not copies."""
    _, cm, _ = narrow
    rules = {k["kernel"]: k["rule"] for k in cm.report["kernel_table"]}
    convs = sorted(r for k, r in rules.items() if "conv" in k)
    # the 58 -> 48 1x1 reads NCHW and writes NCHW16c; the grouped 3x3 reads it back
    assert convs == ["cpu.conv2d_nchw", "cpu.conv2d_nchw", "cpu.conv2d_nchwc",
                     "cpu.depthwise_conv2d_nchw"], rules
    assert not any(r.startswith("dlight") or r == "fallback" for r in rules.values()), rules
    assert not any("reshape" in k for k in rules), rules


def test_narrow_columns_are_whole_vectors():
    """A plain NCHW conv's symbolic width is padded to whole vectors: at 14 columns one
    vector of 16 (two would pad 18), at 56 four vectors (64) when a tile of rows fits them;
    58 channels take 2-row tiles only (29 is prime), where a wider row pays for its padding
    (AVX2: 32 columns for 20, not 24); depthwise: the fewest padded columns."""
    from tvm import tirx

    w = tirx.Var("width", "int64")
    with legalize_conv_nchwc.register_tiles(16, 20, {"width": 14}):
        assert legalize_conv_nchwc.symbolic_nchw_columns(w, 116, False) == 16
    with legalize_conv_nchwc.register_tiles(16, 20, {"width": 56}):
        assert legalize_conv_nchwc.symbolic_nchw_columns(w, 8, False) == 64
        assert legalize_conv_nchwc.symbolic_nchw_columns(w, 1, True) == 64
    with legalize_conv_nchwc.register_tiles(8, 12, {"width": 20}):
        assert legalize_conv_nchwc.symbolic_nchw_columns(w, 58, False) == 32
    assert legalize_conv_nchwc.symbolic_nchw_columns(w, 58, False) == 1


@pytest.mark.parametrize("hw", [(56, 56), (8, 8), (37, 53), (61, 17), (96, 23)])
def test_narrow_channel_convs_match_onnxruntime(narrow, hw):
    model, _, sess = narrow
    x = np.random.default_rng(hw[0] * 7 + hw[1]).standard_normal((1, 3, *hw)).astype(
        np.float32)
    assert_close(sess.run(None, {"x": x}), ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def _token_reshapes() -> onnx.ModelProto:
    """A vision transformer's tokens over a symbolic image (SegFormer's Mix-FFN): a 7x7/4
    patch conv to 32 channels, flattened to tokens (``Reshape [1, -1, 32]``), and a
    64-channel 1x1 of the map flattened its own way (``Reshape [1, 64, -1] -> Transpose
    -> MatMul`` back to 32): the two token counts agree only in value; then the residual
    sum, and ``Shape -> Gather`` reshaping it back."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    inits = [numpy_helper.from_array(a, k) for k, a in (
        ("w", (rng.standard_normal((32, 3, 7, 7)) * 0.2).astype(np.float32)),
        ("w64", (rng.standard_normal((64, 32, 1, 1)) * 0.2).astype(np.float32)),
        ("fc", (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)),
        ("flat", np.array([1, 64, -1], np.int64)), ("tokens", np.array([1, -1, 32], np.int64)),
        ("one", np.array(1, np.int64)), ("lead", np.array([1], np.int64)),
        ("c32", np.array([32], np.int64)))]
    nodes = [
        n("Conv", ["x", "w"], ["c"], strides=[4, 4], pads=[3] * 4),
        n("Conv", ["c", "w64"], ["c64"]),
        n("Reshape", ["c64", "flat"], ["f"]),
        n("Transpose", ["f"], ["ft"], perm=[0, 2, 1]),
        n("MatMul", ["ft", "fc"], ["t1"]),
        n("Reshape", ["c", "tokens"], ["t2"]),
        n("Add", ["t1", "t2"], ["s"]),
        n("Shape", ["s"], ["shape"]),
        n("Gather", ["shape", "one"], ["count"], axis=0),
        n("Reshape", ["count", "lead"], ["count1"]),
        n("Concat", ["lead", "count1", "c32"], ["back"], axis=0),
        n("Reshape", ["s", "back"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "token_reshapes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_token_reshapes_keep_their_shapes(tmp_path):
    """The -1 of a Reshape over a symbolic image is the product of the dims it does not
    name, so both flattenings give the same token count: their sum keeps its shape, the
    Shape read of it imports and the arena is planned (TVM's inference spelled the count
    ``((h' - 1) * 32 + 32) * w' // 32``, the sum lost its shape, and the model compiled
    only per shape)."""
    model = _token_reshapes()
    cm = compiler.compile(model, dims={"height": (8, 256, 64), "width": (8, 256, 64)})
    assert "kernel_table" in cm.report, cm.report.get("why")
    cm.export(str(tmp_path / "m.so"))
    sess = runtime.load(str(tmp_path / "m.so"))
    for hw in [(64, 64), (8, 40), (100, 28), (255, 131)]:
        x = np.random.default_rng(hw[0]).standard_normal((1, 3, *hw)).astype(np.float32)
        assert_close(sess.run(None, {"x": x}), ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_shape_arithmetic_proves_reshape_counts_equal():
    """``provably_equal`` sees the identity TVM's simplifier misses, and refuses a false one."""
    from tvm import tirx

    from compiler.frontend.shape_arith import provably_equal

    h, w = tirx.Var("height", "int64"), tirx.Var("width", "int64")
    c = lambda v: tirx.const(v, "int64")  # noqa: E731
    a, b = (h - c(1)) // c(4), (w - c(1)) // c(4) + c(1)
    assert provably_equal((a * c(128) + c(128)) * b // c(128), (a * c(32) + c(32)) * b // c(32))
    assert provably_equal((a * c(32) + c(32)) * b // c(32), (a + c(1)) * b)
    assert not provably_equal((a * c(32) + c(16)) * b // c(32), (a + c(1)) * b)
