"""fold_batchnorm: conv(x, W) [+ b] -> batch_norm => conv(x, W*s) + (b*s + t)."""

from __future__ import annotations

import numpy as np

from passes import FoldBatchNorm
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "conv -> batch_norm => conv(W*s) + bias"
AFFINE = "batch_norm => x * s + t"
RNG = np.random.default_rng(0)


def _bn(name, c):
    return {f"{name}.s": RNG.uniform(0.5, 1.5, c).astype(np.float32),
            f"{name}.b": RNG.normal(0, 0.2, c).astype(np.float32),
            f"{name}.m": RNG.normal(0, 0.2, c).astype(np.float32),
            f"{name}.v": RNG.uniform(0.5, 2.0, c).astype(np.float32)}


def _bn_node(x, name):
    return node("BatchNormalization", [x] + [f"{name}.{k}" for k in "sbmv"], name, epsilon=1e-3)


def _convs():
    """Conv with bias + BN + Relu, depthwise Conv + BN, grouped ConvTranspose + BN, Conv1d +
    BN: four folds."""
    inits = {"w1": RNG.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32),
             "b1": RNG.normal(0, 0.1, 8).astype(np.float32),
             "w2": RNG.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32),
             "w3": RNG.normal(0, 0.3, (8, 3, 2, 2)).astype(np.float32),   # IOHW, groups 2
             "w4": RNG.normal(0, 0.3, (5, 4, 3)).astype(np.float32),
             **_bn("bn1", 8), **_bn("bn2", 8), **_bn("bn3", 6), **_bn("bn4", 5)}
    nodes = [node("Conv", ["x", "w1", "b1"], "conv1", pads=[1, 1, 1, 1]), _bn_node("conv1", "bn1"),
             node("Relu", ["bn1"], "relu1"),
             node("Conv", ["relu1", "w2"], "conv2", pads=[1, 1, 1, 1], group=8),
             _bn_node("conv2", "bn2"),
             node("ConvTranspose", ["bn2", "w3"], "convt3", strides=[2, 2], group=2),
             _bn_node("convt3", "bn3"),
             node("Conv", ["x1d", "w4"], "conv4", pads=[1, 1]), _bn_node("conv4", "bn4")]
    return model(nodes, {"x": [1, 4, 6, 6], "x1d": [1, 4, 10]},
                 {"bn3": [1, 6, 12, 12], "bn4": [1, 5, 10]}, inits)


def _feeds():
    return {"x": RNG.standard_normal((1, 4, 6, 6)).astype(np.float32),
            "x1d": RNG.standard_normal((1, 4, 10)).astype(np.float32)}


def test_structure_conv_bn_folded():
    before, after, r = run_pass(FoldBatchNorm(), _convs())
    assert before["relax.nn.batch_norm"] == 4 and "relax.nn.batch_norm" not in after
    assert after["relax.nn.conv2d"] == 2 and after["relax.nn.conv2d_transpose"] == 1
    assert after["relax.nn.conv1d"] == 1
    # conv1's bias add takes the folded shift; the other three convs gain one
    assert before["relax.add"] == 1 and after["relax.add"] == 4
    assert r.rewrites == {RULE: 4}
    assert r.nodes == ["conv1", "bn1", "conv2", "bn2", "convt3", "bn3", "conv4", "bn4"]


def test_numerics_and_fewer_kernels():
    m, feeds = _convs(), _feeds()
    outs, cm = compile_run(m, feeds)
    assert_close(outs, ort_run(m, feeds))
    assert report(cm, "fold_batchnorm")["rewrites"] == {RULE: 4}
    conv1 = next(c for c in cm.meta["graph"]["calls"] if "conv1" in c["nodes"])
    assert conv1["nodes"] == ["conv1", "bn1", "relu1"]      # one kernel names all three
    outs_off, cm_off = compile_run(m, feeds, disabled_passes=["fold_batchnorm"])
    assert report(cm_off, "fold_batchnorm")["skipped"] == "disabled"
    assert_close(outs_off, ort_run(m, feeds))
    assert cm.report["kernels"] < cm_off.report["kernels"]


def test_not_folded_into_conv_when_conv_output_has_another_user():
    inits = {"w": RNG.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), **_bn("bn", 4)}
    m = model([node("Conv", ["x", "w"], "conv"), _bn_node("conv", "bn"),
               node("Add", ["conv", "bn"], "sum")], {"x": [1, 4, 3, 3]}, {"sum": [1, 4, 3, 3]},
              inits)
    _, after, r = run_pass(FoldBatchNorm(), m)
    # the conv keeps its weights (the Add reads it unscaled); the BN alone becomes x*s + t
    assert r.rewrites == {AFFINE: 1} and "relax.nn.batch_norm" not in after
    assert after["relax.nn.conv2d"] == 1
    feeds = {"x": RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)}
    outs, _ = compile_run(m, feeds)
    assert_close(outs, ort_run(m, feeds))


def test_not_folded_when_bn_params_are_inputs():
    bn = _bn("bn", 4)
    m = model([node("Conv", ["x", "w"], "conv"), _bn_node("conv", "bn")],
              {"x": [1, 4, 3, 3], "bn.s": [4]}, {"bn": [1, 4, 3, 3]},
              {"w": RNG.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32),
               **{k: v for k, v in bn.items() if k != "bn.s"}})
    _, _, r = run_pass(FoldBatchNorm(), m)
    assert r.rewrites == {} and r.nodes == []


def test_standalone_bn_becomes_multiply_add_and_matches_ort():
    # DenseNet's pre-activation BN -> Relu -> Conv: no conv before the BN to fold into
    inits = {"w": RNG.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32), **_bn("bn", 4)}
    m = model([_bn_node("x", "bn"), node("Relu", ["bn"], "r"),
               node("Conv", ["r", "w"], "conv", pads=[1, 1, 1, 1])],
              {"x": [1, 4, 5, 5]}, {"conv": [1, 8, 5, 5]}, inits)
    before, after, r = run_pass(FoldBatchNorm(), m)
    assert r.rewrites == {AFFINE: 1} and r.nodes == ["bn"]
    assert before["relax.nn.batch_norm"] == 1 and "relax.nn.batch_norm" not in after
    assert after["relax.multiply"] == 1 and after["relax.add"] == 1
    feeds = {"x": RNG.standard_normal((1, 4, 5, 5)).astype(np.float32) * 3 + 1}
    outs, _ = compile_run(m, feeds)
    assert_close(outs, ort_run(m, feeds))
