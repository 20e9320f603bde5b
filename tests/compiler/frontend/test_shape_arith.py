"""Shape arithmetic on symbolic dims at import (compiler/frontend/shape_arith.py), against
onnxruntime at several values of the dims."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from runtime.dims import DimError

F = TensorProto.FLOAT


def _deberta_tile(repeat_batch: bool = True):
    """DeBERTa's ``pos_key.repeat(q.size(0) // heads, 1, 1)`` then ``q @ pos_key``: q is
    [batch * 2, 5, 3] (a reshape of [batch, 2, 5, 3]), pos [2, 3, 4] tiled by
    [batch * 2 // 2, 1, 1]."""
    c = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    pos = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["q4", "qshape"], ["q"]),
             helper.make_node("Shape", ["q"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b2"], axis=0),
             helper.make_node("Div", ["b2", "two"], ["b"]),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             helper.make_node("Concat", ["b1", "one", "one"], ["reps"], axis=0),
             helper.make_node("Tile", ["pos", "reps"], ["pt"], name="the_tile"),
             helper.make_node("MatMul", ["q", "pt"], ["y"])]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("q4", F, ["batch", 2, 5, 3])],
                          [helper.make_tensor_value_info("y", F, ["n", 5, 4])],
                          [c("qshape", [-1, 5, 3]), c("zero", 0), c("two", 2),
                           c("ax0", [0]), c("one", [1]), numpy_helper.from_array(pos, "pos")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_tile_by_symbolic_repeats_keeps_the_batch_dim():
    """TVM's Tile converter took the dynamic path on repeats [batch, 1, 1]: fresh output
    dims no later op could relate to the batch, and DeBERTa's MatMul failed to legalize
    ("'NoneType' object is not iterable"), so the model compiled to a DynamicModel only.
    Now reshape -> broadcast_to -> reshape, whose dims are batch * 2."""
    m = _deberta_tile()
    cm = compiler.compile(m, dims={"batch": (1, 8, 2)})
    assert type(cm).__name__ == "CompiledModel"
    sess, ref = cm.session(), ort.InferenceSession(m.SerializeToString())
    for batch in (1, 3, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 2, 5, 3)).astype(np.float32)
        got, want = sess.run(None, {"q4": x})[0], ref.run(None, {"q4": x})[0]
        assert got.shape == want.shape == (batch * 2, 5, 4)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _clip_embeddings():
    """CLIP's text embeddings as transformers exports them: ``position_ids[:, :seq]`` of a
    77-entry table (a Slice whose end is the input's Shape), gathered and added to the
    token embeddings, then a quick-GELU MLP (``x * sigmoid(1.702 x)``) over the symbolic
    batch and sequence."""
    rng = np.random.default_rng(0)
    c = lambda n, v: numpy_helper.from_array(np.asarray(v), n)  # noqa: E731
    inits = [c("tok", rng.standard_normal((50, 16)).astype(np.float32)),
             c("pos", rng.standard_normal((77, 16)).astype(np.float32)),
             c("position_ids", np.arange(77, dtype=np.int64)[None]),
             c("w", rng.standard_normal((16, 32)).astype(np.float32)),
             c("k", np.array(1.702, np.float32)), c("zero", np.array([0], np.int64)),
             c("one", np.array([1], np.int64))]
    nodes = [helper.make_node("Shape", ["ids"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["seq"], axis=0),
             helper.make_node("Slice", ["position_ids", "zero", "seq", "one"], ["pids"],
                              name="pos_slice"),
             helper.make_node("Gather", ["tok", "ids"], ["te"]),
             helper.make_node("Gather", ["pos", "pids"], ["pe"]),
             helper.make_node("Add", ["te", "pe"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["h"]),
             helper.make_node("Mul", ["h", "k"], ["hk"]),
             helper.make_node("Sigmoid", ["hk"], ["g"]),
             helper.make_node("Mul", ["h", "g"], ["y"])]
    g = helper.make_graph(nodes, "clip_emb",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                         ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_slice_bound_past_a_static_axis_narrows_the_dim():
    """TVM's Slice converter takes a symbolic end as in bounds: compiled for seq up to 512,
    ``position_ids[:, :seq]`` read past CLIP's 77 positions and the gather after it
    crashed the process at seq 128 (onnxruntime refuses that input).  The dim's range,
    declared or the default one, is narrowed to the 77 the model runs at, with a warning
    naming the node; run() refuses 78 saying why; within, the outputs match."""
    m = _clip_embeddings()
    for dims, asked in (({"batch": (1, 4, 1), "seq": (1, 512, 128)}, 512), (None, 128)):
        cm = compiler.compile(m, dims=dims)
        seq = next(d for d in cm.report["dims"] if d["name"] == "seq")
        assert (seq["min"], seq["max"], seq["opt"]) == (1, 77, 77)
        assert seq["narrowed"]["max"] == asked
        (warning,) = [w for w in cm.report["warnings"] if "not up to" in w]
        assert "'pos_slice'" in warning and "seq > 77" in warning
    sess, ref = cm.session(), ort.InferenceSession(m.SerializeToString())
    for batch, seq in ((1, 1), (3, 13), (4, 77)):
        ids = np.random.default_rng(seq).integers(0, 50, (batch, seq)).astype(np.int64)
        np.testing.assert_allclose(sess.run(None, {"ids": ids})[0],
                                   ref.run(None, {"ids": ids})[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(DimError, match=r"'seq' = 78, above the 77 .*'pos_slice'"):
        sess.run(None, {"ids": np.zeros((1, 78), np.int64)})


def test_a_slice_bound_of_two_dims_past_a_static_axis_is_refused():
    """``mask[:, past : past + seq]`` of a 64-wide buffer over past 0..64 and seq 1..16
    can pass it, and no one dim's range keeps it within: refused, naming the node."""
    from compiler.errors import DimRangeError

    c = lambda n, v: numpy_helper.from_array(np.asarray(v), n)  # noqa: E731
    nodes = [helper.make_node("Shape", ["p"], ["ps"]), helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["ps", "one"], ["past"], axis=0),
             helper.make_node("Gather", ["xs", "one"], ["seq"], axis=0),
             helper.make_node("Add", ["past", "seq"], ["end"]),
             helper.make_node("Slice", ["buf", "past", "end", "one"], ["m"], name="mask_slice"),
             helper.make_node("Add", ["x", "m"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("p", F, [1, "past"]),
                                       helper.make_tensor_value_info("x", F, [1, "seq"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [c("buf", np.zeros((1, 64), np.float32)), c("one", np.array([1]))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(DimRangeError, match="'mask_slice'.*declare ranges that keep it"):
        compiler.compile(m, dims={"past": (0, 64, 8), "seq": (1, 16, 1)})
    cm = compiler.compile(m, dims={"past": (0, 48, 8), "seq": (1, 16, 1)})
    x, p = np.ones((1, 5), np.float32), np.zeros((1, 40), np.float32)
    np.testing.assert_array_equal(cm.session().run(None, {"p": p, "x": x})[0], x)


@pytest.mark.parametrize("start", ["size_minus_seq", "minus_seq"])
def test_a_slice_from_a_symbolic_start_to_the_end_keeps_its_shape(start):
    """MPT's ALiBi bias ``alibi[..., 2048 - seq:]`` (ends INT64_MAX, "to the end"), here over
    a 64-wide table, and its ``-seq:`` form.  TVM's converter took the constant end as in
    bounds once the start was symbolic: the slice came out ``seq + 2^63 - 2049`` long and
    the attention's Reshape failed to import.  The end is the axis' size (ONNX's clamp), a
    negative start counts from the end, and the start holds for seq <= 64, to which a
    larger range is narrowed."""
    c = lambda n, v: numpy_helper.from_array(np.asarray(v), n)  # noqa: E731
    table = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    first = (helper.make_node("Sub", ["size", "seq"], ["st"]) if start == "size_minus_seq"
             else helper.make_node("Neg", ["seq"], ["st"]))
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one_s"], ["seq"], axis=0), first,
             helper.make_node("Unsqueeze", ["st", "zero"], ["start"]),
             helper.make_node("Slice", ["alibi", "start", "big", "one"], ["bias"],
                              name="alibi_slice"),
             helper.make_node("Add", ["x", "bias"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [c("alibi", table), c("one", np.array([1])), c("zero", np.array([0])),
                           c("one_s", np.array(1)), c("size", np.array(64)),
                           c("big", np.array([2 ** 63 - 1]))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m, dims={"batch": (1, 4, 1), "seq": (1, 100, 16)})
    seq = next(d for d in cm.report["dims"] if d["name"] == "seq")
    assert seq["max"] == 64 and "'alibi_slice'" in seq["narrowed"]["why"]
    sess, ref = cm.session(), ort.InferenceSession(m.SerializeToString())
    for batch, n in ((1, 1), (2, 17), (4, 64)):
        x = np.random.default_rng(n).standard_normal((batch, n)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                   rtol=1e-6, atol=1e-6)


def test_a_constant_one_hot_over_a_shape_value_folds():
    """transformers' Mixtral experts (``batched_mm``) build a Tile's repeats as
    ``OneHot([1], 3, [1, n])`` with ``n`` read off a symbolic input's static dim: the
    import bound ``n`` to a variable, the OneHot stayed a run-time tensor, the Tile got
    fresh dims, and a Reshape(-1) after it failed to import.  Constant through the bound
    variables, it folds."""
    c = lambda n, v: numpy_helper.from_array(np.asarray(v), n)  # noqa: E731
    data = np.random.default_rng(0).standard_normal((2, 3, 1)).astype(np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "minus1", "big"], ["n"]),
             helper.make_node("Concat", ["one", "n"], ["values"], axis=0),
             helper.make_node("OneHot", ["idx", "three", "values"], ["hot"]),
             helper.make_node("Reshape", ["hot", "minus1"], ["reps"]),
             helper.make_node("Tile", ["data", "reps"], ["t"], name="tile"),
             helper.make_node("Reshape", ["t", "two_m1"], ["flat"]),
             helper.make_node("MatMul", ["x", "flat"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", 4])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [c("data", data), c("idx", np.array([1])), c("three", np.array(3)),
                           c("one", np.array([1])), c("minus1", np.array([-1])),
                           c("big", np.array([2 ** 63 - 1])), c("two_m1", np.array([4, -1]))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m, dims={"batch": (1, 4, 2)})
    assert "kernel_table" in cm.report  # one artifact, not a per-shape build
    sess, ref = cm.session(), ort.InferenceSession(m.SerializeToString())
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                   rtol=1e-6, atol=1e-6)


def test_a_small_bool_result_at_the_end_of_a_long_float_chain_imports():
    """A transformers BERT-base export compiled at static shapes: an IsNaN over the
    attention mask at layer 10, whose first argument leads back through every op before
    it.  The constant-folding check walked that chain by recursion and the import failed
    with "maximum recursion depth exceeded"; it walks a bounded number of expressions."""
    nodes = [helper.make_node("Add", [f"x{i}", "one"], [f"x{i + 1}"]) for i in range(700)]
    nodes += [helper.make_node("IsNaN", ["x700"], ["nan"]),
              helper.make_node("Where", ["nan", "zero", "x700"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", F, [2, 3])],
                          [helper.make_tensor_value_info("y", F, [2, 3])],
                          [numpy_helper.from_array(np.array(1, np.float32), "one"),
                           numpy_helper.from_array(np.array(0, np.float32), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([[0, np.nan, 1], [2, 3, -700]], np.float32)
    out = compiler.compile(m).session().run(None, {"x0": x})[0]
    np.testing.assert_allclose(out, np.where(np.isnan(x), 0, x + 700))
