"""fold_transpose_matmul: matmul(a, permute_dims(b, [.., -1, -2])) => matmul_nt(a, b)."""

from __future__ import annotations

import numpy as np
import pytest

import compiler

from passes import FoldTransposeMatmul
from tests.conftest import ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "matmul(a, permute_dims(b, [.., -1, -2])) => matmul_nt(a, b)"


def scores(h, s, d, perm=(0, 2, 1), t=None, kb=None):
    """Q [h, s, d] @ Transpose(K) (K [kb or h, t or s, d]), scaled."""
    t = t or s
    kb = kb or h
    return model([node("Transpose", ["k"], "kt", perm=list(perm)),
                  node("MatMul", ["q", "kt"], "mm"),
                  node("Mul", ["mm", "scale"], "y")],
                 {"q": [h, s, d], "k": [kb, t, d]}, {"y": [h, s, t]},
                 {"scale": np.array(0.125, np.float32)})


def test_structure():
    before, after, r = run_pass(FoldTransposeMatmul(), scores(12, 197, 64))
    assert before["relax.permute_dims"] == 1 and before["relax.matmul"] == 1
    assert "relax.permute_dims" not in after and "relax.matmul" not in after
    assert r.rewrites == {RULE: 1} and r.nodes == ["kt", "mm"]


def test_other_permutations_are_left_alone():
    # a transpose that is not a swap of the last two axes
    m = model([node("Transpose", ["k"], "kt", perm=[2, 1, 0]), node("MatMul", ["q", "kt"], "y")],
              {"q": [16, 4, 8], "k": [16, 8, 16]}, {"y": [16, 4, 16]})
    _, after, r = run_pass(FoldTransposeMatmul(), m)
    assert not r.rewrites and after["relax.permute_dims"] == 1


@pytest.mark.parametrize("h,s,d,t,kb", [(12, 197, 64, None, None), (2, 77, 32, 50, None),
                                        (3, 1, 64, 33, None), (4, 9, 16, None, 1)])
def test_numerics_against_onnxruntime(h, s, d, t, kb):
    rng = np.random.default_rng(0)
    m = scores(h, s, d, t=t, kb=kb)
    feeds = {"q": rng.standard_normal((h, s, d)).astype("float32"),
             "k": rng.standard_normal((kb or h, t or s, d)).astype("float32")}
    (got,), cm = compile_run(m, feeds)
    assert report(cm, "fold_transpose_matmul")["rewrites"] == {RULE: 1}
    assert cm.report["schedules"].get("cpu.matmul") == 1
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-5)


def test_symbolic_dims_fold_and_match_onnxruntime():
    """Decoding with a cache: Q [2, seq, 16] @ K^T with K [2, past_seq, 16] (both symbolic):
    folded, one artifact, right at several lengths (a length-1 query included)."""
    m = scores(2, "seq", 16, t="past_seq")
    m.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "past_seq"
    cm = compiler.compile(m, dims={"seq": (1, 8), "past_seq": (1, 40)})
    assert isinstance(cm, compiler.CompiledModel)
    assert report(cm, "fold_transpose_matmul")["rewrites"] == {RULE: 1}
    assert [row["rule"] for row in cm.report["kernel_table"]] == ["cpu.matmul"]  # no copy
    sess = cm.session()
    rng = np.random.default_rng(1)
    for s, t in ((1, 1), (1, 37), (5, 12)):
        feeds = {"q": rng.standard_normal((2, s, 16)).astype("float32"),
                 "k": rng.standard_normal((2, t, 16)).astype("float32")}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(m, feeds)[0],
                                   rtol=1e-4, atol=1e-5)


RULE_SCALED = "matmul(a, permute_dims(b, [.., -1, -2]) * c) => matmul_nt(a, b) * c"
RULE_HEADS_SCALED = ("matmul(a, permute_dims(b, q + [-1, -2]) * c) => "
                     "matmul_nt(a, permute_dims(b, q)) * c")


def sdpa(s, h, d, perm, scale=0.35, t=None, share_kt=False):
    """torch's exported scaled dot-product scores: Q [1, h, s, d] * sqrt(scale) @
    Transpose(K, perm) * sqrt(scale), K [1, t, h, d] (perm [0, 2, 3, 1]: T5, Whisper) or
    [1, h, t, d] (perm [0, 1, 3, 2]: LLaMA); ``share_kt``: the transposed K is an output
    too."""
    t = t or s
    k_shape = [1, t, h, d] if perm == [0, 2, 3, 1] else [1, h, t, d]
    nodes = [node("Mul", ["q", "c"], "qs"), node("Transpose", ["k"], "kt", perm=perm),
             node("Mul", ["kt", "c"], "ks"), node("MatMul", ["qs", "ks"], "y")]
    outs = {"y": [1, h, s, t]}
    if share_kt:
        outs["kt"] = [1, h, d, t]
    return model(nodes, {"q": [1, h, s, d], "k": k_shape}, outs,
                 {"c": np.array(scale, np.float32)}), k_shape


@pytest.mark.parametrize("perm,rule,permutes", [
    ([0, 2, 3, 1], RULE_HEADS_SCALED, 1),   # T5 / Whisper: K [1, S, H, D]
    ([0, 1, 3, 2], RULE_SCALED, 0),         # LLaMA: K [1, H, S, D]
])
def test_structure_scaled_and_head_permuted(perm, rule, permutes):
    m, _ = sdpa(20, 4, 16, perm)
    before, after, r = run_pass(FoldTransposeMatmul(), m)
    assert before["relax.permute_dims"] == 1 and before["relax.multiply"] == 2
    assert r.rewrites == {rule: 1} and r.nodes == ["kt", "ks", "y"]
    assert "relax.matmul" not in after
    # the K side's multiply moved after the matmul (Q's stays); heads permuted alone
    assert after["relax.multiply"] == 2 and after.get("relax.permute_dims", 0) == permutes


@pytest.mark.parametrize("perm,s,h,d,t", [
    ([0, 2, 3, 1], 20, 4, 16, None),     # whole vectors of d, odd s
    ([0, 2, 3, 1], 128, 8, 64, None),    # T5-small: the tiles divide
    ([0, 2, 3, 1], 150, 2, 64, None),    # Whisper-like: N no whole tiles (row blocks)
    ([0, 1, 3, 2], 77, 4, 32, 50),       # LLaMA form, M and N odd
])
def test_numerics_scaled_attention_against_onnxruntime(perm, s, h, d, t):
    rng = np.random.default_rng(0)
    m, k_shape = sdpa(s, h, d, perm, t=t)
    feeds = {"q": rng.standard_normal((1, h, s, d)).astype("float32"),
             "k": rng.standard_normal(k_shape).astype("float32")}
    (got,), cm = compile_run(m, feeds)
    assert len(report(cm, "fold_transpose_matmul")["rewrites"]) == 1
    assert cm.report["schedules"].get("cpu.matmul") == 1
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-5)


def test_non_scalar_multiply_and_shared_head_copy_left_alone():
    # a per-column multiply between transpose and matmul is not a scale of the product
    m = model([node("Transpose", ["k"], "kt", perm=[0, 2, 1]),
               node("Mul", ["kt", "w"], "ks"), node("MatMul", ["q", "ks"], "y")],
              {"q": [2, 6, 8], "k": [2, 12, 8]}, {"y": [2, 6, 12]},
              {"w": np.arange(12, dtype=np.float32)})
    _, after, r = run_pass(FoldTransposeMatmul(), m)
    assert not r.rewrites and after["relax.permute_dims"] == 1
    # [0, 2, 3, 1] whose copy is also an output: a [0, 2, 1, 3] copy would come on top
    m, _ = sdpa(20, 4, 16, [0, 2, 3, 1], share_kt=True)
    _, after, r = run_pass(FoldTransposeMatmul(), m)
    assert not r.rewrites and after["relax.matmul"] == 1
    # [2, 0, 1] is [2, 1, 0] then the swap: that copy would still move k's last axis
    m = model([node("Transpose", ["k"], "kt", perm=[2, 0, 1]), node("MatMul", ["q", "kt"], "y")],
              {"q": [5, 6, 4], "k": [4, 8, 5]}, {"y": [5, 6, 8]})
    _, after, r = run_pass(FoldTransposeMatmul(), m)
    assert not r.rewrites
