"""stable_variance: mean(x*x) - mean(x)^2 => mean((x - mean(x))^2)."""

from __future__ import annotations

import numpy as np

from passes import StableVariance
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "mean(x^2) - mean(x)^2 => mean((x - mean)^2)"
SHAPE = [4, 32]


def _var_nodes(x="x", y="x"):
    return [node("ReduceMean", [y], "mean", axes=[-1]), node("Mul", [x, x], "x2"),
            node("ReduceMean", ["x2"], "mean_x2", axes=[-1]),
            node("Mul", ["mean", "mean"], "mean2"), node("Sub", ["mean_x2", "mean2"], "var")]


def variance():
    return model(_var_nodes(), {"x": SHAPE}, {"var": [4, 1]})


def one_pass_layer_norm():
    """LayerNorm whose variance is E[x^2] - E[x]^2 (some exporters, hand-written models)."""
    nodes = _var_nodes() + [node("Add", ["var", "eps"], "var_eps"),
                            node("Sqrt", ["var_eps"], "std"), node("Sub", ["x", "mean"], "d"),
                            node("Div", ["d", "std"], "y")]
    return model(nodes, {"x": SHAPE}, {"y": SHAPE}, {"eps": np.array(1e-5, np.float32)})


def _x(loc):
    return (loc + np.random.default_rng(6).standard_normal(SHAPE)).astype(np.float32)


def test_structure():
    before, after, r = run_pass(StableVariance(), variance())
    assert before == {"relax.mean": 2, "relax.multiply": 2, "relax.subtract": 1}
    assert after == {"relax.mean": 2, "relax.subtract": 1, "relax.multiply": 1}
    assert r.rewrites == {RULE: 1} and r.nodes == ["x2", "mean_x2", "mean2", "var"]


def test_large_mean_against_float64():
    x = _x(1e4)
    x64 = x.astype(np.float64)
    var = x64.var(-1, keepdims=True)
    y, _ = compile_run(variance(), {"x": x})
    np.testing.assert_allclose(y[0], var, rtol=1e-3)
    naive, _ = compile_run(variance(), {"x": x}, disabled_passes=["stable_variance"])
    assert not np.allclose(naive[0], var, rtol=0.1)
    # the LayerNorm it feeds is then fused into one layer_norm kernel
    m = one_pass_layer_norm()
    y, cm = compile_run(m, {"x": x})
    assert report(cm, "fuse_layer_norm")["changed"] and cm.report["kernels"] == 1
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(y[0], ref, rtol=1e-2, atol=1e-2)
    naive, _ = compile_run(m, {"x": x}, disabled_passes=["stable_variance"])
    assert not np.allclose(naive[0], ref, rtol=0.1, atol=0.1, equal_nan=False)


def test_numerics_against_onnxruntime_and_disabled():
    x = _x(0.5)
    for m in (variance(), one_pass_layer_norm()):
        outs, cm = compile_run(m, {"x": x})
        assert report(cm, "stable_variance")["rewrites"] == {RULE: 1}
        assert_close(outs, ort_run(m, {"x": x}), atol=1e-5)
        outs, _ = compile_run(m, {"x": x}, disabled_passes=["stable_variance"])
        assert_close(outs, ort_run(m, {"x": x}), atol=1e-5)


def test_not_rewritten_for_two_different_tensors():
    m = model(_var_nodes(y="z"), {"x": SHAPE, "z": SHAPE}, {"var": [4, 1]})
    _, _, r = run_pass(StableVariance(), m)
    assert r.rewrites == {}
