"""onnxc's tensor converters (compiler/frontend/converters/tensor.py): Split with empty
parts, CenterCropPad, ReverseSequence, TensorScatter, against onnx.reference; Slice-1
(attributes) and ScatterND / ScatterElements with no updates against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import compiler
from tests.compiler.frontend.converters.reference import (F, check_against_reference, initializer,
                                                          onnx_model, randn, untyped_output,
                                                          value_info)
from tests.compiler.onnx_check import check


def test_split_with_empty_parts():
    x = np.arange(5, dtype=np.float32)
    node = helper.make_node("Split", ["x", "split"], ["a", "b", "c", "d"])
    model = onnx_model(node, [value_info("x", F, [5])], [untyped_output(n) for n in "abcd"], 13,
                   [initializer("split", np.array([0, 2, 0, 3], np.int64))])
    got = check_against_reference(model, {"x": x})
    assert [g.shape for g in got] == [(0,), (2,), (0,), (3,)]


@pytest.mark.parametrize("shape,target,axes", [
    ((9, 6, 3), [4, 10, 3], None),          # crop (odd difference) and pad (even)
    ((5, 8, 2), [7, 5], [0, 1]),             # pad odd, crop odd
    ((2, 7, 8), [3, 8], [-2, -1]),           # negative axes
])
def test_center_crop_pad(shape, target, axes):
    attrs = {} if axes is None else {"axes": axes}
    check("CenterCropPad", {"x": randn(*shape), "shape": np.array(target, np.int64)},
          consts=("shape",), opset=18, **attrs)


def test_center_crop_pad_shape_as_graph_input_is_bound_when_run():
    # the shape arrives as a small integer graph input: specialised on its value
    check("CenterCropPad", {"x": randn(6, 5), "shape": np.array([3, 8], np.int64)}, opset=18)


@pytest.mark.parametrize("batch_axis,time_axis,lens", [(1, 0, [4, 3, 1, 5]),
                                                      (0, 1, [0, 2, 5, 1])])
def test_reverse_sequence(batch_axis, time_axis, lens):
    x = randn(5, 4, 2) if time_axis == 0 else randn(4, 5, 2)
    check("ReverseSequence", {"x": x, "lens": np.array(lens, np.int64)}, opset=10,
          batch_axis=batch_axis, time_axis=time_axis)


@pytest.mark.parametrize("mode,idx,upd", [("linear", [0, 2], 2), ("circular", [3, 1], 3)])
def test_tensor_scatter(mode, idx, upd):
    check("TensorScatter", {"past": randn(2, 3, 5, 4), "update": randn(2, 3, upd, 4),
                            "w": np.array(idx, np.int64)}, opset=24, mode=mode)


def test_tensor_scatter_axis_and_no_indices():
    check("TensorScatter", {"past": randn(2, 6, 3), "update": randn(2, 2, 3)}, opset=24, axis=1)


def _single_node_vs_onnxruntime(node, inputs: dict, out_dtype, out_shape, opset=17):
    """onnxc against onnxruntime on a one-node model whose inputs are graph inputs."""
    import compiler
    from tests.conftest import assert_close, ort_run

    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                         list(a.shape)) for n, a in inputs.items()]
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(
        node.output[0], helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), out_shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    got = compiler.compile(m).session().run(None, inputs)
    assert_close(got, ort_run(m, inputs), rtol=0, atol=0)
    return got


@pytest.mark.parametrize("dtype, k", [(np.float64, 0), (np.float32, 2), (np.int64, -1)])
def test_eye_like_with_a_dtype_attribute(dtype, k):
    # TVM's converter refused a dtype other than the input's
    x = np.zeros((3, 5), np.int32)
    node = helper.make_node("EyeLike", ["x"], ["y"], k=k,
                            dtype=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    (y,) = _single_node_vs_onnxruntime(node, {"x": x}, dtype, [3, 5])
    assert y.dtype == dtype and y.sum() == np.eye(3, 5, k).sum()


@pytest.mark.parametrize("start", [np.nan, -np.inf])
def test_range_with_a_non_finite_length_is_refused_naming_the_node(start):
    """Range's length ceil((limit - start) / delta) must be finite (onnxruntime refuses it
    as well): a clear error naming the node, not Python's int(nan)."""
    import compiler

    node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="rng")
    model = onnx_model(node, [value_info("s", F, [])],
                       [helper.make_tensor_value_info("y", F, ["n"])], 13,
                       [initializer("l", np.array(5, np.float32)),
                        initializer("d", np.array(1, np.float32))])
    sess = compiler.compile(model, target="host").session()
    np.testing.assert_array_equal(sess.run(None, {"s": np.array(2, np.float32)})[0], [2, 3, 4])
    with pytest.raises(compiler.UnsupportedError, match=r"'rng' \(Range\).*not finite"):
        sess.run(None, {"s": np.array(start, np.float32)})


@pytest.mark.parametrize("attrs, out_shape", [
    (dict(starts=[1, 0], ends=[3, 100], axes=[1, 2]), [2, 2, 5]),
    # no axes; negative starts/ends and INT64_MAX, as PyTorch's opset-9 exports write them
    (dict(starts=[0, -3, 1], ends=[1, -1, 2 ** 63 - 1]), [1, 2, 4]),
])
def test_slice_opset9_attributes_match_onnxruntime(attrs, out_shape):
    # Slice-1 (opsets 1-9) takes starts/ends/axes as attributes: TVM's (Slice-13's)
    # converter failed on them ("Cannot cast NoneType to list of Expr")
    from tests.conftest import assert_close, ort_run

    x = np.arange(40, dtype=np.float32).reshape(2, 4, 5)
    node = helper.make_node("Slice", ["x"], ["y"], **attrs)
    model = onnx_model(node, [value_info("x", F, [2, 4, 5])], [value_info("y", F, out_shape)], 9)
    assert_close(compiler.compile(model).session().run(None, {"x": x}),
                 ort_run(model, {"x": x}), rtol=0, atol=0)


@pytest.mark.parametrize("op, idx_shape, upd_shape, attrs", [
    ("ScatterND", [0, 2], [0, 4], {}),
    ("ScatterND", [0, 3], [0], {"reduction": "add"}),
    ("ScatterElements", [2, 0, 4], [2, 0, 4], {"axis": 1}),
])
def test_scatter_with_no_updates_returns_data(op, idx_shape, upd_shape, attrs):
    # TVM's TOPI scatter divided by the empty extent while lowering ("Divide by zero")
    data = randn(2, 3, 4)
    node = helper.make_node(op, ["x", "i", "u"], ["y"], **attrs)
    inputs = {"x": data, "i": np.zeros(idx_shape, np.int64),
              "u": np.zeros(upd_shape, np.float32)}
    (y,) = _single_node_vs_onnxruntime(node, inputs, np.float32, [2, 3, 4], opset=18)
    np.testing.assert_array_equal(y, data)


def test_scatter_nd_at_nonzero_of_an_all_false_mask_matches_onnxruntime():
    # Longformer with a global_attention_mask: ScatterND at the NonZero positions of the
    # local tokens without global attention, none when every row has as many global
    # tokens; the model compiles per value of the mask (DynamicModel)
    from tests.conftest import assert_close, ort_run

    nodes = [helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("Shape", ["idx"], ["n"], start=0, end=1),
             helper.make_node("Concat", ["n", "tail"], ["ushape"], axis=0),
             helper.make_node("ConstantOfShape", ["ushape"], ["upd"],
                              value=helper.make_tensor("v", F, [1], [-1e4])),
             helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"])]
    g = helper.make_graph(nodes, "g", [value_info("x", F, [2, 5, 3]),
                                       helper.make_tensor_value_info("m", 9, [2, 5])],
                          [value_info("y", F, [2, 5, 3])],
                          [initializer("tail", np.array([3], np.int64))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = compiler.compile(m, target="host").session()
    x = randn(2, 5, 3)
    for mask in (np.zeros((2, 5), bool), np.eye(2, 5, 1, dtype=bool)):
        feeds = {"x": x, "m": mask}
        assert_close(sess.run(None, feeds), ort_run(m, feeds), rtol=0, atol=0)


def test_tile_refuses_repeats_that_are_not_1d():
    """Mamba's TorchScript export writes Tile's repeats as [[k]] computed from a shape
    (onnxruntime refuses the model too): a clear refusal naming the node, not TVM's
    "Cannot convert from type Array"."""
    import pytest
    from onnx import helper, numpy_helper

    from compiler.errors import UnsupportedError
    import compiler

    c = lambda name, a: numpy_helper.from_array(np.array(a, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i2"], ["n"], axis=0),
             helper.make_node("Mod", ["n", "k"], ["r"]),
             helper.make_node("Sub", ["k2d", "r"], ["reps"]),        # [1, 1]
             helper.make_node("Tile", ["n", "reps"], ["y"], name="the_tile")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 64])],
                          [helper.make_tensor_value_info("y", 7, None)],
                          [c("i2", [2]), c("k", [60]), c("k2d", [[64]])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedError, match=r"the_tile.*repeats of shape \[1, 1\]"):
        compiler.compile(m)


def test_tile_of_a_symbolic_input_by_constant_repeats():
    """GPT-J's rotary sin/cos over a symbolic seq, tiled by constant [1, 1, 1, 2] (its
    repeat_interleave), were refused ("input shape is not known at compile time"): the
    converter read the static dims only for the rank."""
    import onnxruntime as ort

    g = helper.make_graph([helper.make_node("Tile", ["x", "reps"], ["y"], name="the_tile")],
                          "g", [helper.make_tensor_value_info("x", F, [1, "seq", 1, 4])],
                          [helper.make_tensor_value_info("y", F, [1, "seq", 1, 8])],
                          [helper.make_tensor(
                              "reps", 7, [4], [1, 1, 1, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m, dims={"seq": (1, 64, 8)})
    assert type(cm).__name__ == "CompiledModel"
    sess, ref = cm.session(), ort.InferenceSession(m.SerializeToString())
    for seq in (1, 7, 64):
        x = np.random.default_rng(seq).standard_normal((1, seq, 1, 4)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])


@pytest.mark.parametrize("shape, reps, dtype", [
    ([1, 64, 28, 28], [2, 1, 2, 2], np.float32),   # the last dim repeated: a copy per repeat
    ([3, 5, 7], [1, 4, 1], np.int64),              # a middle dim only
    ([9], [3], np.float32),                        # rank 1
    ([2, 1, 3, 1, 5], [2, 3, 1, 4, 2], np.int32),
])
def test_tile_cpu_copy_kernel(shape, reps, dtype):
    """Static Tile on CPU targets: rows of contiguous copies (cpu.tile), against
    onnxruntime exactly."""
    from onnx import numpy_helper
    from tests.conftest import ort_run

    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out = [d * r for d, r in zip(shape, reps)]
    g = helper.make_graph([helper.make_node("Tile", ["x", "reps"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", t, shape)],
                          [helper.make_tensor_value_info("y", t, out)],
                          [numpy_helper.from_array(np.array(reps, np.int64), "reps")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m)
    assert [k["rule"] for k in cm.report["kernel_table"]] == ["cpu.tile"]
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 10).astype(dtype)
    np.testing.assert_array_equal(cm.session().run(None, {"x": x})[0], ort_run(m, {"x": x})[0])


@pytest.mark.parametrize("shape, pads, sliced", [
    ([1, 3, 6, 7], [0, 0, 2, 3, 0, 0, 1, 2], True),      # both spatial axes, uneven
    ([2, 5, 9], [0, 0, 4, 0, 0, 7], True),               # conv1d reflect, up to n - 2 after
    ([4, 6], [1, 0, 2, 5], False),                       # n - 1 after: TVM's mirror_pad
])
def test_reflect_pad_by_mirrored_slices(shape, pads, sliced):
    """Pad mode=reflect off CPU targets as concatenated mirrored slices (TVM's mirror_pad
    gathered every element: 8.4x onnxruntime), TVM's kept where a pad reaches the far
    border (n - 1 after the tensor); against onnxruntime on the CPU kernel."""
    from onnx import numpy_helper

    from tests.conftest import assert_close, ort_run

    out = [d + pads[i] + pads[len(shape) + i] for i, d in enumerate(shape)]
    g = helper.make_graph([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], "g",
                          [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info("y", F, out)],
                          [numpy_helper.from_array(np.array(pads, np.int64), "p")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    cm = compiler.compile(m)
    assert_close(cm.session().run(None, {"x": x}), ort_run(m, {"x": x}))
    from compiler import driver

    # CPU targets: the pad kernel (test_pad_cpu_kernel); other targets: the slices
    assert {k["rule"] for k in cm.report["kernel_table"]} == {"cpu.pad"}
    _, _, graph = driver._front_only(m, "cuda:sm_90")
    assert any("mirror_pad" in k for k in graph.prim_funcs) != sliced, list(graph.prim_funcs)


@pytest.mark.parametrize("mode,shape,pads,axes", [
    ("reflect", [1, 64, 56, 56], [0, 0, 2, 2, 0, 0, 2, 2], None),
    ("reflect", [2, 5, 9], [0, 3, 8, 0, 4, 8], None),      # n - 1 on both sides
    ("edge", [1, 3, 6, 7], [0, 1, 9, 0, 0, 2, 12, 1], None),  # pads past the dim
    ("edge", [130], [3, 70], None),                         # rank 1, a row of 2 vector steps
    ("wrap", [1, 4, 6, 5], [2, 3, 1, 4], [2, -1]),          # axes (opset 19)
    ("reflect", [3, 4, 5], [1, 2, 0, 2], [-1, 1]),
])
def test_pad_cpu_kernel(mode, shape, pads, axes):
    """Reflect / edge / wrap padding on CPU targets: rows of copies (cpu.pad), against
    onnxruntime exactly."""
    from onnx import numpy_helper
    from tests.conftest import ort_run

    rank = len(shape)
    full = list(pads)
    if axes is not None:
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a % rank], full[rank + a % rank] = pads[k], pads[len(axes) + k]
    out = [d + full[i] + full[rank + i] for i, d in enumerate(shape)]
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "p")]
    names = ["x", "p"]
    if axes is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "a"))
        names += ["", "a"]
    g = helper.make_graph([helper.make_node("Pad", names, ["y"], mode=mode)], "g",
                          [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info("y", F, out)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    cm = compiler.compile(m)
    assert {k["rule"] for k in cm.report["kernel_table"]} == {"cpu.pad"}
    np.testing.assert_array_equal(cm.session().run(None, {"x": x})[0], ort_run(m, {"x": x})[0])
