"""Shape arithmetic on symbolic dims at import (compiler/frontend/shape_arith.py), against
onnxruntime at several values of the dims."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import compiler

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
