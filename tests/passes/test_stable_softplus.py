"""stable_softplus: log(1 + exp(x)) => max(x, 0) + log1p(exp(-|x|))."""

from __future__ import annotations

import numpy as np

from passes import StableSoftplus
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

N = 64
CONVERTER = "max(x,0) + log(1+exp(-|x|)) => log1p form"
NAIVE = "log(1+exp(x)) => max(x,0) + log1p(exp(-|x|))"


def softplus_op(dtype=np.float32):
    return model([node("Softplus", ["x"], "y")], {"x": [N]}, {"y": [N]}, dtype=dtype)


def naive():
    return model([node("Exp", ["x"], "exp"), node("Add", ["exp", "one"], "add"),
                  node("Log", ["add"], "y")], {"x": [N]}, {"y": [N]},
                 {"one": np.array(1.0, np.float32)})


def _ref(x):
    return np.logaddexp(0, x.astype(np.float64))


def test_structure():
    before, after, r = run_pass(StableSoftplus(), softplus_op())
    assert before["relax.log"] == 1 and before["relax.exp"] == 1   # TVM's converter
    assert after == {"relax.call_tir": 1}
    assert r.rewrites == {CONVERTER: 1} and r.nodes == ["y"]
    _, after, r = run_pass(StableSoftplus(), naive())
    assert after == {"relax.call_tir": 1}
    assert r.rewrites == {NAIVE: 1} and r.nodes == ["exp", "add", "y"]


def test_tails_against_float64():
    # fp32: below -17 log(1 + e) rounds to 0 (the converter's form); above 88 exp overflows
    x = np.linspace(-80, 100, N).astype(np.float32)
    for m in (softplus_op(), naive()):
        y = compile_run(m, {"x": x})[0][0]
        np.testing.assert_allclose(y, _ref(x), rtol=1e-5, atol=0)
        y0 = compile_run(m, {"x": x}, disabled_passes=["stable_softplus"])[0][0]
        assert not np.allclose(y0, _ref(x), rtol=1e-5, atol=0)
    # fp16: the converter's log(1 + e) loses digits (x=-5 off by 1.5%) and flushes to 0
    x16 = np.linspace(-9.5, 11, N).astype(np.float16)
    # computed in float16 (GPU targets; widen_half computes it in fp32 on CPU)
    y = compile_run(softplus_op(np.float16), {"x": x16}, disabled_passes=["widen_half"])[0][0]
    np.testing.assert_allclose(y.astype(np.float64), _ref(x16), rtol=2e-3, atol=0)
    y0 = compile_run(softplus_op(np.float16), {"x": x16},
                     disabled_passes=["stable_softplus", "widen_half"])[0][0]
    assert not np.allclose(y0.astype(np.float64), _ref(x16), rtol=2e-3, atol=0)


def test_numerics_against_onnxruntime_and_disabled():
    x = np.linspace(-10, 10, N).astype(np.float32)
    for m in (softplus_op(), naive()):
        outs, cm = compile_run(m, {"x": x})
        assert report(cm, "stable_softplus")["changed"]
        assert_close(outs, ort_run(m, {"x": x}))
        assert_close(compile_run(m, {"x": x}, disabled_passes=["stable_softplus"])[0],
                     ort_run(m, {"x": x}))


def test_not_rewritten_when_not_one_plus_exp():
    m = model([node("Exp", ["x"], "exp"), node("Add", ["exp", "two"], "add"),
               node("Log", ["add"], "y")], {"x": [N]}, {"y": [N]},
              {"two": np.array(2.0, np.float32)})
    _, after, r = run_pass(StableSoftplus(), m)
    assert r.rewrites == {} and after == {"relax.exp": 1, "relax.add": 1, "relax.log": 1}
