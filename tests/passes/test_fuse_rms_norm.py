"""fuse_rms_norm: gamma * (x / sqrt(mean(x^2) + eps)) => rms_norm(x, gamma)."""

from __future__ import annotations

import numpy as np
import pytest

from passes import FuseRmsNorm

from tests.conftest import ort_run

from .helpers import compile_run, model, node, report, run_pass, symbolic_rows_run

RULE = "gamma * (x / sqrt(mean(x^2) + eps)) => rms_norm(x, gamma)"


def rms(shape=(1, 6, 16), form="t5", gamma=True, gamma_shape=None, axes=(-1,), casts=False,
        extra_output=False, eps=1e-6):
    """RMSNorm as exported: Pow 2, ReduceMean, Add eps, Sqrt, then ``form`` "t5"
    (Mul(x, Div(1, sqrt)), T5 and LLaMA) or "div" (Div(x, sqrt)); Mul gamma; ``casts``:
    float32 -> float32 Casts around it as torch writes them (LLaMA)."""
    d = shape[-1]
    rng = np.random.default_rng(2)
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(eps, np.float32),
             "one": np.array(1.0, np.float32),
             "gamma": rng.uniform(0.5, 1.5, gamma_shape or (d,)).astype(np.float32)}
    x = "x"
    nodes = []
    if casts:
        nodes.append(node("Cast", ["x"], "xc", to=1))
        x = "xc"
    nodes += [node("Pow", [x, "two"], "sq"), node("ReduceMean", ["sq"], "ms", axes=list(axes)),
              node("Add", ["ms", "eps"], "ve"), node("Sqrt", ["ve"], "std")]
    if form == "t5":
        nodes += [node("Div", ["one", "std"], "inv"), node("Mul", [x, "inv"], "norm")]
    else:
        nodes.append(node("Div", [x, "std"], "norm"))
    out = "norm"
    if casts:
        nodes.append(node("Cast", ["norm"], "normc", to=1))
        out = "normc"
    if gamma:
        nodes.append(node("Mul", ["gamma", out], "y"))  # constant first, as torch writes it
        out = "y"
    outputs = {out: list(shape), **({"sq": list(shape)} if extra_output else {})}
    return model(nodes, {"x": list(shape)}, outputs, inits)


@pytest.mark.parametrize("form,casts", [("t5", False), ("t5", True), ("div", False)])
def test_structure(form, casts):
    before, after, r = run_pass(FuseRmsNorm(), rms(form=form, casts=casts))
    # Pow(x, 2) imports as x * x (converters/math.py), the mean of it as mean
    assert "relax.power" not in before and before["relax.mean"] == 1
    assert after == {"relax.nn.rms_norm": 1}
    assert r.rewrites == {RULE: 1}
    assert {"sq", "ms", "ve", "std", "norm", "y"} <= set(r.nodes)


def test_without_gamma():
    _, after, r = run_pass(FuseRmsNorm(), rms(gamma=False))
    assert after == {"relax.nn.rms_norm": 1} and r.rewrites == {RULE: 1}


@pytest.mark.parametrize("shape,form,casts", [
    ((1, 128, 512), "t5", True),     # T5-small rows: whole vectors
    ((2, 7, 37), "div", False),      # a row no vector divides
    ((3, 1024), "t5", False),        # LLaMA width, 2-D
])
def test_numerics_against_onnxruntime(shape, form, casts):
    m = rms(shape, form=form, casts=casts)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3
    (got,), cm = compile_run(m, {"x": x})
    assert report(cm, "fuse_rms_norm")["rewrites"] == {RULE: 1}
    assert len(cm.report["kernel_table"]) == 1  # one row kernel, no separate square
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_numerics_large_and_tiny_rows():
    """Rows of magnitude 1e15 (the squares' mean ~1e30, within fp32) and 1e-3: the fused
    kernel stays within float32 rounding of onnxruntime's decomposed ops."""
    m = rms((2, 64))
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    x[0] *= 1e15
    x[1] *= 1e-3
    (got,), _ = compile_run(m, {"x": x})
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_not_fused():
    # gamma varying across rows is no per-feature weight: the norm fuses, the multiply stays
    _, after, r = run_pass(FuseRmsNorm(), rms(gamma_shape=(6, 16)))
    assert r.rewrites == {RULE: 1} and "y" not in r.nodes
    assert after["relax.nn.rms_norm"] == 1 and after["relax.multiply"] == 1
    # the mean over a leading axis: not a row norm
    _, after, r = run_pass(FuseRmsNorm(), rms(axes=(1,)))
    assert not r.rewrites
    # the square is also an output: it must stay, so the chain is not private
    _, after, r = run_pass(FuseRmsNorm(), rms(extra_output=True))
    assert not r.rewrites and after["relax.multiply"] >= 1 and "relax.nn.rms_norm" not in after


def test_not_fused_over_every_axis():
    # the mean over all axes (ONNX RMSNormalization at axis 0): TVM's rms_norm legalization
    # fails on it, so the chain stays as it is, and compiles and matches onnxruntime
    m = rms(shape=(2, 3, 4), gamma_shape=(2, 3, 4), axes=(0, 1, 2))
    _, _, r = run_pass(FuseRmsNorm(), m)
    assert not r.rewrites
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(compile_run(m, {"x": x})[0][0], ort_run(m, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_symbolic_rows_are_fused():
    """A LLaMA-style decomposed RMSNorm of a model with a symbolic batch and sequence (a
    decoder exported with dynamic axes): the normalised axis is static, so it fuses (the
    rows' symbolic extent kept it from matching: five kernels more per decoder layer),
    matching onnxruntime at several row counts from one build."""
    symbolic_rows_run(rms(casts=True), "fuse_rms_norm", RULE,
                      ([1, 6, 16], [1, 1, 16], [3, 29, 16]))
