"""stable_sigmoid: sigmoid(x) => x >= 0 ? 1/(1+exp(-x)) : exp(x)/(1+exp(x))."""

from __future__ import annotations

import numpy as np

from passes import StableSigmoid
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

N = 48


def sigmoid_op(dtype=np.float32):
    return model([node("Sigmoid", ["x"], "y")], {"x": [N]}, {"y": [N]}, dtype=dtype)


def decomposed(one=1.0):
    """1 / (one + exp(-x))."""
    return model([node("Neg", ["x"], "neg"), node("Exp", ["neg"], "exp"),
                  node("Add", ["one", "exp"], "den"), node("Div", ["num", "den"], "y")],
                 {"x": [N]}, {"y": [N]}, {"one": np.array(one, np.float32),
                                          "num": np.array(1.0, np.float32)})


def _ref(x):
    return 1 / (1 + np.exp(-x.astype(np.float64)))


def test_structure():
    before, after, r = run_pass(StableSigmoid(), sigmoid_op())
    assert before == {"relax.sigmoid": 1} and after == {"relax.call_tir": 1}
    assert r.rewrites == {"sigmoid(x) => stable sigmoid": 1} and r.nodes == ["y"]
    _, after, r = run_pass(StableSigmoid(), decomposed())
    assert after == {"relax.call_tir": 1}
    assert r.rewrites == {"1/(1+exp(-x)) => stable sigmoid": 1}
    assert r.nodes == ["neg", "exp", "den", "y"]


def test_overflowing_inputs_against_float64():
    # fp16: exp(-x) overflows below x = -11.1 and the naive form returns 0; the true values
    # are fp16 subnormals (atol: one subnormal step)
    x16 = np.linspace(-16, 8, N).astype(np.float16)
    # computed in float16 (GPU targets; widen_half computes it in fp32 on CPU)
    y = compile_run(sigmoid_op(np.float16), {"x": x16}, disabled_passes=["widen_half"])[0][0]
    np.testing.assert_allclose(y.astype(np.float64), _ref(x16), rtol=2e-3, atol=6e-8)
    y0 = compile_run(sigmoid_op(np.float16), {"x": x16},
                     disabled_passes=["stable_sigmoid", "widen_half"])[0][0]
    assert (y0[x16 < -11.2] == 0).all()
    # fp32: below -88 the naive form returns 0 instead of the subnormal result
    x = np.linspace(-103, -80, N).astype(np.float32)
    for m in (sigmoid_op(), decomposed()):
        y = compile_run(m, {"x": x})[0][0]
        np.testing.assert_allclose(y, _ref(x), rtol=1e-5, atol=3e-45)
        y0 = compile_run(m, {"x": x}, disabled_passes=["stable_sigmoid"])[0][0]
        assert (y0[x < -89] == 0).all()


def test_numerics_against_onnxruntime_and_disabled():
    x = np.linspace(-12, 12, N).astype(np.float32)
    for m in (sigmoid_op(), decomposed()):
        outs, cm = compile_run(m, {"x": x})
        assert report(cm, "stable_sigmoid")["changed"]
        assert_close(outs, ort_run(m, {"x": x}))
        assert_close(compile_run(m, {"x": x}, disabled_passes=["stable_sigmoid"])[0],
                     ort_run(m, {"x": x}))


def test_not_rewritten_when_not_a_sigmoid():
    _, after, r = run_pass(StableSigmoid(), decomposed(one=2.0))
    assert r.rewrites == {} and after["relax.exp"] == 1
