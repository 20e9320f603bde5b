"""accumulate_fp32: fp16 reductions accumulate in fp32."""

from __future__ import annotations

import numpy as np

from passes import AccumulateFp32
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

K = 4096
# float16 computed as float16 (GPU targets): on CPU targets widen_half computes it in fp32
HALF = ["widen_half"]


def reductions(dtype=np.float16, k=K):
    """Softmax, ReduceMean, ReduceSum and MatMul over k values."""
    return model([node("Softmax", ["x"], "p", axis=-1),
                  node("ReduceMean", ["x"], "mean", axes=[-1]),
                  node("ReduceSum", ["x", "axes"], "sum"), node("MatMul", ["x", "w"], "mm")],
                 {"x": [2, k]}, {"p": [2, k], "mean": [2, 1], "sum": [2, 1], "mm": [2, 1]},
                 {"axes": np.array([-1], np.int64), "w": np.ones((k, 1), dtype)}, dtype=dtype)


def _ref(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return [e / e.sum(-1, keepdims=True), x.mean(-1, keepdims=True), x.sum(-1, keepdims=True),
            x.sum(-1, keepdims=True)]


RULES = {f"{op} fp16 => accumulate in fp32": 1 for op in ("nn.softmax", "mean", "sum", "matmul")}


def test_structure():
    before, after, r = run_pass(AccumulateFp32(), reductions())
    assert "relax.astype" not in before
    assert after["relax.astype"] == 1 + 4      # x up once (shared), four results down
    assert r.rewrites == RULES and r.nodes == ["p", "mean", "sum", "mm"]


def test_fp16_sums_against_float64():
    # the first row: 4096 ones (an fp16 sum sticks at 2048); the second: values around 40
    # with a mean that fp16 sums overflow (4096 * 40 > 65504)
    rng = np.random.default_rng(7)
    x = np.stack([np.ones(K), 40 + rng.standard_normal(K)]).astype(np.float16)
    outs, cm = compile_run(reductions(), {"x": x}, disabled_passes=HALF)
    for got, ref in zip(outs, _ref(x)):
        np.testing.assert_allclose(got.astype(np.float64)[0], ref[0], rtol=2e-3)
    for got, ref in zip(outs[:2], _ref(x)[:2]):      # softmax, mean of the large row
        # (atol: softmax's results are fp16 subnormals here, one step is 6e-8)
        np.testing.assert_allclose(got.astype(np.float64)[1], ref[1], rtol=2e-3, atol=6e-8)
    assert np.isinf(outs[2][1]).all() and np.isinf(outs[3][1]).all()  # the sum is > 65504
    naive, _ = compile_run(reductions(), {"x": x},
                           disabled_passes=["accumulate_fp32", *HALF])
    assert naive[2][0, 0] == 2048 and np.isinf(naive[1][1, 0])


def test_numerics_small_sums_and_disabled():
    x = np.random.default_rng(8).standard_normal((2, 64)).astype(np.float16)
    m = reductions(k=64)
    for dis in ([], ["accumulate_fp32"]):
        outs, cm = compile_run(m, {"x": x}, disabled_passes=dis + HALF)
        for got, ref in zip(outs, _ref(x)):
            np.testing.assert_allclose(got.astype(np.float64), ref, rtol=5e-3, atol=5e-3)
    assert report(cm, "accumulate_fp32")["skipped"] == "disabled"


def test_fp32_model_untouched():
    m = reductions(np.float32, k=64)
    _, _, r = run_pass(AccumulateFp32(), m)
    assert r.rewrites == {}
    x = np.random.default_rng(9).standard_normal((2, 64)).astype(np.float32)
    outs, cm = compile_run(m, {"x": x}, disabled_passes=HALF)
    assert not report(cm, "accumulate_fp32")["changed"]
    assert_close(outs, ort_run(m, {"x": x}))
