"""seq_major_cache: a key/value cache concat(past, new, axis=2) stored sequence-major and
appended in place (the graph side of it: compiler/lowering/graph.py ``place_kv_caches``).

The decoders it is for (GPT-2's MHA, LLaMA's GQA with repeat_kv) decode 32 steps against
onnxruntime in tests/runtime/test_iobinding.py; here: a one-layer attention over a cache,
which caches the pass rewrites and which it keeps copying (with the reason it reports), and
both against onnxruntime through run() at several past lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from passes import SeqMajorCache
from tests.conftest import assert_close, ort_run

from .helpers import node, run_pass

RULE = "present = concat(past, new, axis=2) => sequence-major cache appended in place"
H, D = 2, 8  # a cache row: 2 x 8 floats = 64 bytes
DIMS = {"past": (0, 16), "seq": (1, 4, 1)}


def attention(extra=((), ()), axis: int = 2, heads: int = H, kv_heads: int | None = None):
    """q, new [1, heads, seq, D] and past [1, heads, past, D] (``kv_heads``: a GQA cache
    of fewer heads, repeated by expand/reshape as LLaMA's repeat_kv); present = Concat(past,
    new); y = softmax(q @ present^T) @ present.  ``extra``: (nodes, outputs) added."""
    kv = kv_heads or heads
    seq_dims = ["seq", D] if axis == 2 else [D, "seq"]
    past_dims = ["past", D] if axis == 2 else [D, "past"]
    nodes = [node("Concat", ["past", "new"], "present", axis=axis)]
    k = "present"
    if kv_heads:  # repeat_kv: [1, kv, T, D] -> [1, kv, 1, T, D] -> expand -> [1, heads, T, D]
        nodes += [node("Unsqueeze", ["present", "ax2"], "p5"),
                  node("Shape", ["present"], "pshape"),
                  node("Gather", ["pshape", "i2"], "plen", axis=0),
                  node("Concat", ["lead", "plen", "dd"], "eshape", axis=0),
                  node("Expand", ["p5", "eshape"], "pexp"),
                  node("Concat", ["lead4", "plen", "dd"], "rshape", axis=0),
                  node("Reshape", ["pexp", "rshape"], "prep")]
        k = "prep"
    nodes += [node("Transpose", [k], "kt", perm=[0, 1, 3, 2] if axis == 2 else [0, 1, 2, 3]),
              node("MatMul", ["q", "kt"], "s"), node("Softmax", ["s"], "p", axis=-1)]
    nodes += [node("MatMul", ["p", k], "y")] if axis == 2 else \
        [node("Transpose", [k], "v", perm=[0, 1, 3, 2]), node("MatMul", ["p", "v"], "y")]
    extra_nodes, extra_outs = extra
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [1, heads, "seq", D]),
              helper.make_tensor_value_info("new", f, [1, kv, *seq_dims]),
              helper.make_tensor_value_info("past", f, [1, kv, *past_dims])]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ["y", "present", *extra_outs]]
    i64 = lambda n, v: helper.make_tensor(n, TensorProto.INT64, [len(v)], v)  # noqa: E731
    inits = [i64("ax2", [2]), i64("i2", [2]), i64("lead", [1, kv, heads // kv]),
             i64("dd", [D]), i64("lead4", [1, heads])] if kv_heads else []
    g = helper.make_graph(nodes + list(extra_nodes), "attn", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(past: int, seq: int, axis: int = 2, heads: int = H, kv: int = H, seed: int = 0):
    rng = np.random.default_rng(seed)
    cache = (lambda n: [1, kv, n, D]) if axis == 2 else (lambda n: [1, kv, D, n])
    return {"q": rng.standard_normal((1, heads, seq, D)).astype(np.float32),
            "new": rng.standard_normal(cache(seq)).astype(np.float32),
            "past": rng.standard_normal(cache(past)).astype(np.float32)}


def _kept(rep) -> dict:
    return {r[len("kept copying: "):]: n for r, n in rep.rewrites.items()
            if r.startswith("kept copying")}


def test_structure_cache_rewritten():
    """The concat and both attention matmuls become the sequence-major kernels; no
    relax.concat, permute_dims or matmul of the cache is left."""
    before, after, rep = run_pass(SeqMajorCache(), attention(), symbolic=True)
    assert rep.rewrites == {RULE: 1} and rep.nodes == ["present"]
    assert before["relax.concat"] == 1 and before["relax.matmul"] == 2
    assert "relax.concat" not in after and "relax.matmul" not in after
    assert "relax.permute_dims" not in after  # the transposed read is in the index
    assert after["relax.call_tir"] == 5  # past, new rows, append, scores, context


def test_structure_gqa_repeat_kv_read_through_index():
    """repeat_kv (expand_dims, broadcast_to, reshape) is no copy: the matmuls read the
    shared key/value head at h // rep."""
    before, after, rep = run_pass(SeqMajorCache(), attention(heads=4, kv_heads=2),
                                   symbolic=True)
    assert rep.rewrites == {RULE: 1}
    assert before.get("relax.broadcast_to") == 1
    assert "relax.broadcast_to" not in after and "relax.matmul" not in after


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_numerics_against_onnxruntime(kv_heads):
    """Compiled once, run() at past 0 (a prefill), 1 and 13 with 1-3 new rows: y and present
    match onnxruntime; the cache is placed (no append kernel, no transpose of past)."""
    heads = 4 if kv_heads else H
    m = attention(heads=heads, kv_heads=kv_heads)
    cm = compiler.compile(m, dims=DIMS)
    kv = cm.report["kv_caches"]
    assert [(c["input"], c["output"]) for c in kv["placed"]] == [("past", "present")]
    assert not kv["kept"]
    assert cm.report["schedules"].get("cpu.matmul") == 2  # one-row schedules, cache in place
    sess = cm.session()
    assert sess.get_inputs()[2].shape == [1, kv_heads or H, "past", D]
    for past, seq in ((0, 3), (1, 1), (13, 2)):
        f = feeds(past, seq, heads=heads, kv=kv_heads or H, seed=past)
        got = sess.run(None, f)
        assert got[1].flags.c_contiguous and got[1].shape == (1, kv_heads or H, past + seq, D)
        assert_close(got, ort_run(m, f))


def negatives() -> dict:
    """Caches the pass must keep copying, by the reason it reports."""
    second = ([node("ReduceSum", ["past"], "ps", keepdims=0)], ["ps"])
    other_read = ([node("Relu", ["present"], "pr")], ["pr"])
    return {"past is read by something other than the concat": (attention(second), 2),
            "the concat is not on the sequence axis (2)": (attention(axis=3), 3),
            "present is read by something other than the attention matmuls":
                (attention(other_read), 2)}


@pytest.mark.parametrize("reason", list(negatives()))
def test_negative_kept_copying(reason):
    """A past with a second consumer, a concat on another axis, a present read by more
    than the matmuls: nothing is rewritten, the report says why, and the copying graph
    still matches onnxruntime."""
    m, axis = negatives()[reason]
    _, after, rep = run_pass(SeqMajorCache(), m, symbolic=True)
    assert RULE not in rep.rewrites and _kept(rep) == {reason: 1}
    assert after["relax.concat"] == 1
    cm = compiler.compile(m, dims=DIMS)
    assert not cm.report["kv_caches"]["placed"]
    f = feeds(5, 2, axis=axis if axis == 3 else 2)
    assert_close(cm.session().run(None, f), ort_run(m, f))
