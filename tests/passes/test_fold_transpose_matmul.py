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
