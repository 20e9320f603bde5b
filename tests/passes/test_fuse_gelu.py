"""fuse_gelu: x * 0.5 * (1 + erf(x / sqrt2)) => gelu(x); tanh form => gelu_tanh(x)."""

from __future__ import annotations

import math

import numpy as np

from passes import FuseGelu
from tests.conftest import assert_close, ort_run, zoo_model

from .helpers import compile_run, model, node, report, run_pass

ERF = "x*0.5*(1+erf(x/sqrt2)) => gelu"
TANH = "0.5*x*(1+tanh(...)) => gelu_tanh"
SHAPE = [3, 32]
C = {"half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32),
     "sqrt2": np.array(math.sqrt(2), np.float32),
     "inv_sqrt2": np.array(1 / math.sqrt(2), np.float32),
     "k": np.array(math.sqrt(2 / math.pi), np.float32),
     "c": np.array(0.044715, np.float32), "three": np.array(3.0, np.float32),
     "wrong": np.array(0.6, np.float32)}


def erf_gelus():
    """Two Erf GELUs in different association orders, the second scaled by 1/sqrt2."""
    nodes = [node("Div", ["x", "sqrt2"], "a.div"), node("Erf", ["a.div"], "a.erf"),
             node("Add", ["a.erf", "one"], "a.add"), node("Mul", ["x", "a.add"], "a.mul"),
             node("Mul", ["a.mul", "half"], "a.half"),
             node("Mul", ["a.half", "inv_sqrt2"], "b.scale"), node("Erf", ["b.scale"], "b.erf"),
             node("Add", ["one", "b.erf"], "b.add"), node("Mul", ["half", "a.half"], "b.half"),
             node("Mul", ["b.half", "b.add"], "b.mul")]
    return model(nodes, {"x": SHAPE}, {"b.mul": SHAPE}, C)


def tanh_gelus(cube="Pow"):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x^3 as Pow or x*x*x."""
    if cube == "Pow":
        x3 = [node("Pow", ["x", "three"], "x3")]
    else:
        x3 = [node("Mul", ["x", "x"], "x2"), node("Mul", ["x2", "x"], "x3")]
    nodes = x3 + [node("Mul", ["c", "x3"], "cx3"), node("Add", ["x", "cx3"], "inner"),
                  node("Mul", ["inner", "k"], "u"), node("Tanh", ["u"], "t"),
                  node("Add", ["t", "one"], "t1"), node("Mul", ["half", "x"], "hx"),
                  node("Mul", ["hx", "t1"], "y")]
    return model(nodes, {"x": SHAPE}, {"y": SHAPE}, C)


def _feeds():
    return {"x": (3 * np.random.default_rng(2).standard_normal(SHAPE)).astype(np.float32)}


def test_structure_erf_forms():
    before, after, r = run_pass(FuseGelu(), erf_gelus())
    assert before["relax.erf"] == 2 and after == {"relax.nn.gelu": 2}
    assert r.rewrites == {ERF: 2}
    assert r.nodes[:5] == ["a.div", "a.erf", "a.add", "a.mul", "a.half"]


def test_structure_tanh_forms():
    for cube in ("Pow", "Mul"):
        _, after, r = run_pass(FuseGelu(), tanh_gelus(cube))
        assert after == {"relax.nn.gelu_tanh": 1} and r.rewrites == {TANH: 1}, cube


def test_numerics_against_onnxruntime_and_disabled():
    feeds = _feeds()
    for m in (erf_gelus(), tanh_gelus()):
        outs, cm = compile_run(m, feeds)
        assert report(cm, "fuse_gelu")["changed"]
        assert_close(outs, ort_run(m, feeds))
        assert_close(compile_run(m, feeds, disabled_passes=["fuse_gelu"])[0], ort_run(m, feeds))


def test_zoo_transformer_gelu():
    m = zoo_model("transformer")
    _, after, r = run_pass(FuseGelu(), m)
    assert r.rewrites == {ERF: 1} and after["relax.nn.gelu"] == 1 and "relax.erf" not in after


def test_not_fused_with_wrong_constant_or_shared_intermediate():
    nodes = [node("Div", ["x", "sqrt2"], "div"), node("Erf", ["div"], "erf"),
             node("Add", ["erf", "one"], "add"), node("Mul", ["x", "add"], "mul"),
             node("Mul", ["mul", "wrong"], "y")]
    _, after, r = run_pass(FuseGelu(), model(nodes, {"x": SHAPE}, {"y": SHAPE}, C))
    assert r.rewrites == {} and after["relax.erf"] == 1
    nodes[-1] = node("Mul", ["mul", "half"], "y")
    m = model(nodes, {"x": SHAPE}, {"y": SHAPE, "erf": SHAPE}, C)   # erf also an output
    _, after, r = run_pass(FuseGelu(), m)
    assert r.rewrites == {} and after["relax.erf"] == 1
    feeds = _feeds()
    assert_close(compile_run(m, feeds)[0], ort_run(m, feeds))
