"""compiler/frontend/fold_onnx.py: ONNX nodes with known inputs become initializers before
import, folding again after shape inference."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

import compiler
from compiler.frontend.fold_onnx import fold_constants
from compiler.frontend.loader import load_model
from tests.compiler.frontend.converters.reference import (F, I64, RNG, initializer, typed,
                                                          untyped_output, value_info)


def _pad_then_slice_by_shape():
    """y = padded[h // 2:, w // 2:] where padded = Pad(x, max(p, 0)): Pad's output shape is
    static only once ``p`` is bound and ``max(p, 0)`` folded (shape inference does not
    propagate values through Max)."""
    nodes = [helper.make_node("Max", ["p", "zero"], ["pads"]),
             helper.make_node("Pad", ["x", "pads"], ["padded"]),
             helper.make_node("Shape", ["padded"], ["sh"]),
             helper.make_node("Div", ["sh", "two"], ["half"]),
             helper.make_node("Slice", ["padded", "half", "sh"], ["y"])]
    g = helper.make_graph(nodes, "g", [value_info("x", F, [3, 4]), value_info("p", I64, [4])], [untyped_output("y")],
                          [initializer("zero", np.zeros(4, np.int64)), initializer("two", np.int64(2))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_fold_onnx_refolds_after_shape_inference():
    from compiler.specialize import specialize_model

    x = RNG.standard_normal((3, 4)).astype(np.float32)
    p = np.array([1, -2, 2, 3], np.int64)
    model, (want,) = typed(_pad_then_slice_by_shape(), {"x": x, "p": p})
    folded, n = fold_constants(load_model(specialize_model(model, values={"p": p})))
    assert [node.op_type for node in folded.graph.node] == ["Pad", "Slice"] and n == 3
    inits = {t.name for t in folded.graph.initializer}
    assert {"pads", "half", "sh"} <= inits
    (got,) = compiler.compile(model, input_values={"p": p}).session().run(None, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_shape_arithmetic_on_static_shapes_becomes_initializers():
    x = value_info("x", F, [2, 3])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
             helper.make_node("Reshape", ["x", "n"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [value_info("y", F, [6])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    folded, count = fold_constants(load_model(m))
    assert count == 2  # Shape and ReduceProd; Reshape reads the graph input
    assert [n.op_type for n in folded.graph.node] == ["Reshape"]
    n = next(t for t in folded.graph.initializer if t.name == "n")
    np.testing.assert_array_equal(numpy_helper.to_array(n), [6])


def test_nodes_reading_graph_inputs_are_left_alone():
    x = value_info("x", F, [2])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                                            [value_info("y", F, [2])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    folded, count = fold_constants(load_model(m))
    assert count == 0 and [n.op_type for n in folded.graph.node] == ["Relu"]


def test_in_place_folds_as_the_copy_does(monkeypatch):
    """fold_constants(in_place=True) folds the model itself (no copy of its weights) to the
    same bytes as the copying fold, which leaves its argument as it was; the model carries
    an initializer above LARGE_INITIALIZER_BYTES, so the shape re-inference round moves
    its fields into the model too."""
    import onnx

    from compiler.frontend import loader
    from compiler.specialize import specialize_model

    p = np.array([1, -2, 2, 3], np.int64)
    spec = specialize_model(_pad_then_slice_by_shape(), values={"p": p})
    big = np.zeros(loader.LARGE_INITIALIZER_BYTES // 4 + 1, np.float32)
    spec.graph.initializer.append(numpy_helper.from_array(big, "big"))
    model = load_model(spec)
    before = model.SerializeToString()
    copied, n = fold_constants(model)
    assert model.SerializeToString() == before and copied is not model
    mine = onnx.ModelProto()
    mine.CopyFrom(model)
    moved = []
    check = loader._only_inferred_fields_differ
    monkeypatch.setattr(loader, "_only_inferred_fields_differ",
                        lambda *a: moved.append(check(*a)) or moved[-1])
    folded, m = fold_constants(mine, in_place=True)
    assert folded is mine and m == n == 3 and moved == [True]
    assert [node.op_type for node in folded.graph.node] == ["Pad", "Slice"]
    assert folded.SerializeToString() == copied.SerializeToString()


def _qdq_pad_value(opset: int):
    """Pad(x, pads, DQ(Q(0.25))) -> Conv(., DQ(Wq)): the quantized pad value onnxruntime's
    quantizer writes, and a weight that must stay 8-bit integers behind its DQ."""
    wq = np.random.default_rng(5).integers(-64, 64, (4, 2, 3, 3)).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["cd"]),
             helper.make_node("Pad", ["x", "pads", "cd"], ["xp"]),
             helper.make_node("DequantizeLinear", ["wq", "sw"], ["w"]),
             helper.make_node("Conv", ["xp", "w"], ["y"])]
    g = helper.make_graph(
        nodes, "g", [value_info("x", F, [1, 2, 5, 5])], [untyped_output("y")],
        [initializer("c", np.float32(0.25)), initializer("s", np.float32(0.01)),
         initializer("z", np.uint8(3)), initializer("pads", np.array([0, 0, 1, 1] * 2)),
         initializer("wq", wq), initializer("sw", np.float32(0.02))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_scalar_dequantize_folds_and_weights_stay_integers():
    """A quantized scalar (Q -> DQ of a constant: Pad's value) folds to its float, at
    opsets where onnx.reference has no QuantizeLinear / DequantizeLinear (17) and where it
    does (21); a weight's DQ is never folded (the QDQ passes read its integers)."""
    from onnx.reference import ReferenceEvaluator

    for opset in (17, 21):
        folded, _ = fold_constants(load_model(_qdq_pad_value(opset)))
        ops = [n.op_type for n in folded.graph.node]
        assert ops == ["Pad", "DequantizeLinear", "Conv"], (opset, ops)
        value = numpy_helper.to_array(next(t for t in folded.graph.initializer
                                           if t.name == "cd"))
        assert value == np.float32(0.25)     # round(0.25 / 0.01) + 3 = 28 -> (28 - 3) * 0.01
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    (got,) = compiler.compile(_qdq_pad_value(17)).session().run(None, {"x": x})
    (want,) = ReferenceEvaluator(_qdq_pad_value(21)).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_one_element_quantize_folds_to_its_shape_not_a_scalar():
    """Q / DQ of a one-element constant that is not a scalar ([1] -> Unsqueeze -> [1, 1, 1,
    1], onnxruntime's constant_folding_qdq_node_unit test model) fold to a tensor of that
    shape: a 0-d result made the graph output [] and the compile was refused."""
    from tests.conftest import ort_run

    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Unsqueeze", ["d"], ["u"], axes=[0, 1, 2]),
             helper.make_node("QuantizeLinear", ["u", "s", "z"], ["uq"]),
             helper.make_node("Add", ["x", "u"], ["y"])]
    g = helper.make_graph(
        nodes, "g", [value_info("x", F, [1, 3, 1, 1])],
        [value_info("uq", 2, [1, 1, 1, 1]), value_info("d", F, [1]),
         value_info("y", F, [1, 3, 1, 1])],
        [initializer("q", np.array([7], np.uint8)), initializer("s", np.float32(0.5)),
         initializer("z", np.uint8(255))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    folded, _ = fold_constants(load_model(model))
    shapes = {t.name: list(t.dims) for t in folded.graph.initializer}
    assert shapes["d"] == [1] and shapes["uq"] == [1, 1, 1, 1]
    x = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)
    got = compiler.compile(model).session().run(None, {"x": x})
    want = ort_run(model, {"x": x})
    assert [g.shape for g in got] == [w.shape for w in want]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6)


def test_pad_value_computed_at_run_time():
    """A Pad value that is not a constant (here the input's max): the model compiles per
    value of it (a DynamicModel), the answer as onnxruntime's."""
    import onnxruntime as ort

    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Pad", ["x", "pads", "m"], ["y"], name="the_pad")]
    g = helper.make_graph(nodes, "g", [value_info("x", F, [1, 2, 5, 5])], [untyped_output("y")],
                          [initializer("pads", np.array([0, 0, 1, 1] * 2))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    (got,) = compiler.compile(model).session().run(None, {"x": x})
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_a_chain_of_pads_sized_by_the_previous_pad_folds_to_the_end():
    """EnCodec's encoder: each stage pads by an amount computed from the length the
    previous stage's (computed) pad left, so each round of folding after shape inference
    fixes one more Pad; four rounds left its later Pads dynamic ("Dynamic pads are not
    supported").  Eight stages here, every Pad folded to constant pads."""
    from tests.conftest import ort_run

    nodes, inits, x = [], [initializer("two", np.int64(2)), initializer("three", np.int64(3)),
                           initializer("z4", np.zeros(4, np.int64)),
                           initializer("ax0", np.array([0], np.int64))], "x"
    for i in range(8):  # pad the last axis by (len % 3) + 1 at the end
        nodes += [helper.make_node("Shape", [x], [f"s{i}"]),
                  helper.make_node("Gather", [f"s{i}", "two"], [f"l{i}"], axis=0),
                  helper.make_node("Mod", [f"l{i}", "three"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", "one"], [f"a{i}"]),
                  helper.make_node("Unsqueeze", [f"a{i}", "ax0"], [f"u{i}"]),
                  helper.make_node("Concat", ["z4", "zero1", f"u{i}"], [f"p{i}"], axis=0),
                  helper.make_node("Pad", [x, f"p{i}"], [f"x{i}"])]
        x = f"x{i}"
    nodes.append(helper.make_node("Relu", [x], ["y"]))
    inits += [initializer("one", np.int64(1)), initializer("zero1", np.zeros(1, np.int64))]
    g = helper.make_graph(nodes, "g", [value_info("x", F, [1, 2, 10])], [untyped_output("y")],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    folded, _ = fold_constants(load_model(m))
    assert [n.op_type for n in folded.graph.node] == ["Pad"] * 8 + ["Relu"]
    assert all(n.input[1] in {t.name for t in folded.graph.initializer}
               for n in folded.graph.node if n.op_type == "Pad")
    feeds = {"x": RNG.standard_normal((1, 2, 10)).astype(np.float32)}
    got = compiler.compile(m, target="host").session().run(None, feeds)[0]
    np.testing.assert_array_equal(got, ort_run(m, feeds)[0])
