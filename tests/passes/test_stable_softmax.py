"""stable_softmax: exp(x) / sum(exp(x)) => softmax(x); log(softmax(x)) => log_softmax(x)."""

from __future__ import annotations

import numpy as np

from passes import StableSoftmax
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

SHAPE = [4, 10]
AXES = {"axes": np.array([-1], np.int64)}


def decomposed(with_max=False, exp_is_output=False):
    """Exp -> ReduceSum -> Div (or the same after subtracting ReduceMax)."""
    nodes, x = [], "x"
    if with_max:
        nodes += [node("ReduceMax", ["x"], "max", axes=[-1]), node("Sub", ["x", "max"], "shifted")]
        x = "shifted"
    nodes += [node("Exp", [x], "exp"), node("ReduceSum", ["exp", "axes"], "sum"),
              node("Div", ["exp", "sum"], "probs")]
    outputs = {"probs": SHAPE, **({"exp": SHAPE} if exp_is_output else {})}
    return model(nodes, {"x": SHAPE}, outputs, AXES)


def log_of_softmax():
    return model([node("Softmax", ["x"], "sm", axis=-1), node("Log", ["sm"], "logp")],
                 {"x": SHAPE}, {"logp": SHAPE})


def _ref_softmax(x, log=False):
    x = x.astype(np.float64)
    z = x - x.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    return z - lse if log else np.exp(z - lse)


def _logits(scale):
    return (scale * np.random.default_rng(4).standard_normal(SHAPE)).astype(np.float32)


def test_structure():
    before, after, r = run_pass(StableSoftmax(), decomposed())
    assert before == {"relax.exp": 1, "relax.sum": 1, "relax.divide": 1}
    assert after == {"relax.nn.softmax": 1}
    assert r.rewrites == {"exp(x)/sum(exp(x)) => softmax": 1}
    assert r.nodes == ["exp", "sum", "probs"]
    _, after, r = run_pass(StableSoftmax(), decomposed(with_max=True))
    assert after == {"relax.nn.softmax": 1} and len(r.nodes) == 5
    _, after, r = run_pass(StableSoftmax(), log_of_softmax())
    assert after == {"relax.nn.log_softmax": 1}
    assert r.rewrites == {"log(softmax(x)) => log_softmax": 1}


def test_logits_1e4_against_float64():
    x = _logits(1e4)
    outs, cm = compile_run(decomposed(), {"x": x})
    np.testing.assert_allclose(outs[0], _ref_softmax(x), rtol=1e-4, atol=1e-7)
    naive, _ = compile_run(decomposed(), {"x": x}, disabled_passes=["stable_softmax"])
    assert np.isnan(naive[0]).any()                    # inf / inf
    outs, _ = compile_run(log_of_softmax(), {"x": x})
    np.testing.assert_allclose(outs[0], _ref_softmax(x, log=True), rtol=1e-5)
    naive, _ = compile_run(log_of_softmax(), {"x": x}, disabled_passes=["stable_softmax"])
    assert np.isinf(naive[0]).any()                    # log(0)


def test_numerics_against_onnxruntime_and_disabled():
    x = _logits(3)
    for m in (decomposed(), decomposed(with_max=True), log_of_softmax()):
        outs, cm = compile_run(m, {"x": x})
        assert report(cm, "stable_softmax")["changed"]
        assert_close(outs, ort_run(m, {"x": x}))
        outs, _ = compile_run(m, {"x": x}, disabled_passes=["stable_softmax"])
        assert_close(outs, ort_run(m, {"x": x}))


def test_softmax_op_left_alone_tvm_kernel_is_stable():
    m = model([node("Softmax", ["x"], "p", axis=-1)], {"x": SHAPE}, {"p": SHAPE})
    _, after, r = run_pass(StableSoftmax(), m)
    assert r.rewrites == {} and after == {"relax.nn.softmax": 1}
    x = _logits(1e4)
    np.testing.assert_allclose(compile_run(m, {"x": x})[0][0], _ref_softmax(x), rtol=1e-4,
                               atol=1e-7)


def test_not_fused_when_exp_is_used_elsewhere():
    m = decomposed(exp_is_output=True)
    _, _, r = run_pass(StableSoftmax(), m)
    assert r.rewrites == {}
    x = _logits(3)
    assert_close(compile_run(m, {"x": x})[0], ort_run(m, {"x": x}))
