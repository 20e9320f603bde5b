"""stable_logsumexp: log(sum(exp(x))) => m + log(sum(exp(x - m))), m = max(x)."""

from __future__ import annotations

import numpy as np

from passes import StableLogSumExp
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "log(sum(exp(x))) => max + log(sum(exp(x - max)))"
SHAPE = [3, 12]


def decomposed(keepdims=0):
    out = [3, 1] if keepdims else [3]
    return model([node("Exp", ["x"], "exp"), node("ReduceSum", ["exp", "axes"], "sum",
                                                 keepdims=keepdims),
                  node("Log", ["sum"], "lse")], {"x": SHAPE}, {"lse": out},
                 {"axes": np.array([1], np.int64)})


def _ref(x, keepdims=False):
    x = x.astype(np.float64)
    m = x.max(1, keepdims=True)
    r = m + np.log(np.exp(x - m).sum(1, keepdims=True))
    return r if keepdims else r[:, 0]


def _x(loc):
    return (loc + 5 * np.random.default_rng(5).standard_normal(SHAPE)).astype(np.float32)


def test_structure():
    before, after, r = run_pass(StableLogSumExp(), decomposed())
    assert before == {"relax.exp": 1, "relax.sum": 1, "relax.log": 1}
    assert after == {"relax.max": 1, "relax.subtract": 1, "relax.exp": 1, "relax.sum": 1,
                     "relax.log": 1, "relax.squeeze": 1, "relax.add": 1}
    assert r.rewrites == {RULE: 1} and r.nodes == ["exp", "sum", "lse"]


def test_large_logits_against_float64():
    for keepdims in (0, 1):
        m, x = decomposed(keepdims), _x(1e3)
        outs, _ = compile_run(m, {"x": x})
        np.testing.assert_allclose(outs[0], _ref(x, keepdims), rtol=1e-6)
        naive, _ = compile_run(m, {"x": x}, disabled_passes=["stable_logsumexp"])
        assert np.isinf(naive[0]).all()                 # exp(1000) = inf


def test_numerics_against_onnxruntime_and_disabled():
    m, x = decomposed(), _x(0)
    outs, cm = compile_run(m, {"x": x})
    assert report(cm, "stable_logsumexp")["rewrites"] == {RULE: 1}
    assert_close(outs, ort_run(m, {"x": x}))
    assert_close(compile_run(m, {"x": x}, disabled_passes=["stable_logsumexp"])[0],
                 ort_run(m, {"x": x}))


def test_reduce_log_sum_exp_op_left_alone():
    # TVM's ReduceLogSumExp converter already subtracts the max
    m = model([node("ReduceLogSumExp", ["x"], "lse", axes=[1], keepdims=0)], {"x": SHAPE},
              {"lse": [3]})
    _, _, r = run_pass(StableLogSumExp(), m)
    assert r.rewrites == {}
    x = _x(1e3)
    np.testing.assert_allclose(compile_run(m, {"x": x})[0][0], _ref(x), rtol=1e-6)
