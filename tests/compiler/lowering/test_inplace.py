"""In-place analysis: which outputs may overwrite which inputs."""

from __future__ import annotations

from tvm import te, topi

from compiler.lowering.inplace import inplace_candidates


def test_elementwise_and_residual():
    a = te.placeholder((4, 16), name="a")
    r = te.placeholder((4, 16), name="r")
    out = te.compute((4, 16), lambda i, j: te.max(a[i, j], 0.0) + r[i, j], name="out")
    assert inplace_candidates(te.create_prim_func([a, r, out]), 2) == [(0, 0), (1, 0)]


def test_transpose_is_not_in_place():
    a = te.placeholder((4, 16), name="a")
    t = te.compute((16, 4), lambda i, j: a[j, i], name="t")
    assert inplace_candidates(te.create_prim_func([a, t]), 1) == []


def test_square_transpose_is_not_in_place():
    a = te.placeholder((8, 8), name="a")
    t = te.compute((8, 8), lambda i, j: a[j, i], name="t")
    assert inplace_candidates(te.create_prim_func([a, t]), 1) == []


def test_softmax_in_place():
    # every read of a[r, j] is in row r's max (before any exp of the row) or in the exp of
    # element j, which writes out[r, j]: safe under any schedule keeping the dependences
    a = te.placeholder((4, 16), name="a")
    sm = te.create_prim_func([a, topi.nn.softmax(a)])
    assert inplace_candidates(sm, 1, rows_once=True) == [(0, 0)]
    # scheduled by another rule or tuned, the max might be recomputed after exps overwrote
    assert inplace_candidates(sm, 1) == []


def test_softmax_after_a_fused_scale_and_mask_in_place_for_same_shape_inputs():
    a = te.placeholder((2, 8, 16), name="a")
    m = te.placeholder((2, 8, 16), name="m")
    mb = te.placeholder((8, 16), name="mb")  # a broadcast mask: never the output's storage
    s = te.compute(a.shape, lambda *i: a(*i) * 0.125 + m(*i), name="scaled")
    func = te.create_prim_func([a, m, topi.nn.softmax(s)])
    assert inplace_candidates(func, 2, rows_once=True) == [(0, 0), (1, 0)]
    s = te.compute(a.shape, lambda b, i, j: a[b, i, j] + mb[i, j], name="masked")
    func = te.create_prim_func([a, mb, topi.nn.softmax(s)])
    assert inplace_candidates(func, 2, rows_once=True) == [(0, 0)]


def test_softmax_refused_when_its_input_is_read_otherwise():
    a = te.placeholder((4, 16), name="a")
    # an epilogue after the softmax reads the input again, after the exps overwrote it
    sm = topi.nn.softmax(a)
    out = te.compute(a.shape, lambda i, j: sm[i, j] + a[i, j], name="out")
    assert inplace_candidates(te.create_prim_func([a, out]), 1, rows_once=True) == []
    # a transposed pre-op reads a[j, i] where the exp writes a[i, j]
    b = te.placeholder((16, 16), name="b")
    t = te.compute(b.shape, lambda i, j: b[j, i], name="t")
    assert inplace_candidates(te.create_prim_func([b, topi.nn.softmax(t)]), 1,
                              rows_once=True) == []
    # another reduction reads the input rows (before the softmax): not the softmax's max
    tot = topi.sum(a, axis=1, keepdims=True)
    shifted = te.compute(a.shape, lambda i, j: a[i, j] - tot[i, 0], name="shifted")
    assert inplace_candidates(te.create_prim_func([a, topi.nn.softmax(shifted)]), 1,
                              rows_once=True) == []


def test_broadcast_input_is_not_in_place():
    a = te.placeholder((4, 16), name="a")
    b = te.placeholder((16,), name="b")
    out = te.compute((4, 16), lambda i, j: a[i, j] + b[j], name="out")
    assert inplace_candidates(te.create_prim_func([a, b, out]), 2) == [(0, 0)]


def test_input_read_by_an_intermediate_block_is_refused():
    a = te.placeholder((4, 16), name="a")
    c = te.compute((4, 16), lambda i, j: a[i, j] * 2, name="c")
    d = te.compute((4, 16), lambda i, j: c[i, j] + a[i, j], name="d")
    assert inplace_candidates(te.create_prim_func([a, d]), 1) == []


def test_dtype_mismatch():
    a = te.placeholder((4,), name="a", dtype="float32")
    out = te.compute((4,), lambda i: a[i].astype("float16"), name="out")
    assert inplace_candidates(te.create_prim_func([a, out]), 1) == []


def _scores_softmax_context(h: int = 4, s: int = 197, d: int = 16):
    import numpy as np
    from onnx import helper

    from tests.schedules.util import onnx_model

    nodes = [helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1, name="sm"),
             helper.make_node("MatMul", ["p", "v"], ["o"], name="pv")]
    model = onnx_model(nodes, [("q", (h, s, d)), ("kt", (h, d, s)), ("v", (h, s, d))],
                       [("o", (h, s, d))])
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((h, s, d)).astype("float32") * 2,
             "kt": rng.standard_normal((h, d, s)).astype("float32") * 2,
             "v": rng.standard_normal((h, s, d)).astype("float32")}
    return model, feeds


def test_attention_scores_softmax_runs_in_place_and_matches_onnxruntime():
    import compiler
    from tests.conftest import assert_close, ort_run

    model, feeds = _scores_softmax_context()
    cm = compiler.compile(model, target="host")
    call = next(c for c in cm.meta["graph"]["calls"] if "sm" in c["nodes"])
    assert call.get("inplace") == [0]  # the probabilities overwrite the scores
    assert cm.report["memory"]["inplace_outputs"] >= 1
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds))


def test_softmax_of_a_model_input_is_not_in_place():
    """In place, the runtime would copy the caller's array into the arena first (to leave
    it untouched): a whole extra pass over the input."""
    import numpy as np
    from onnx import helper

    import compiler
    from tests.conftest import assert_close, ort_run
    from tests.schedules.util import onnx_model

    shape = (6, 1500)
    model = onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="sm")],
                       [("x", shape)], [("y", shape)])
    cm = compiler.compile(model, target="host")
    assert not cm.meta["graph"]["calls"][0].get("inplace")
    x = (np.random.default_rng(1).standard_normal(shape) * 4).astype("float32")
    assert_close(cm.session().run(None, {"x": x}), ort_run(model, {"x": x}))
