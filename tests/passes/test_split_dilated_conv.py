"""split_dilated_conv: a dilated conv whose taps mostly read padding becomes per-tap 1x1
convs over the outputs each tap reaches, summed."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.frontend.importer import import_onnx
from compiler.frontend.loader import load_model
from passes import FoldConstants, PassContext, SplitDilatedConv, TrimConvTaps
from passes.relax_util import bindings
from passes.split_dilated_conv import RULE, tap_ranges, wasted
from tests.conftest import ort_run

from .helpers import compile_run, model, node, report, run_pass


def _conv(shape, k=3, dilation=1, pads=None, stride=1, group=1, f=16, bn=False):
    nd = len(shape) - 2
    c = shape[1]
    pads = pads if pads is not None else [dilation * (k - 1) // 2] * 2 * nd
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((f, c // group, *[k] * nd)).astype(np.float32),
             "b": rng.standard_normal(f).astype(np.float32)}
    size = [(s + pads[i] + pads[nd + i] - dilation * (k - 1) - 1) // stride + 1
            for i, s in enumerate(shape[2:])]
    nodes = [node("Conv", ["x", "w", "b"], "c", kernel_shape=[k] * nd,
                  dilations=[dilation] * nd, pads=pads, strides=[stride] * nd, group=group)]
    if bn:
        for name, lo in (("s", 0.5), ("o", -1.0), ("mu", -1.0), ("var", 0.5)):
            inits[name] = (lo + rng.random(f)).astype(np.float32)
        nodes.append(node("BatchNormalization", ["c", "s", "o", "mu", "var"], "n"))
    nodes.append(node("Relu", [nodes[-1].output[0]], "y"))
    return model(nodes, {"x": list(shape)}, {"y": [shape[0], f, *size]}, inits)


def _convs(mod):
    return [[int(d) for d in b.value.args[1].ty.shape] for b in bindings(mod)
            if getattr(getattr(b.value, "op", None), "name", "").startswith("relax.nn.conv")]


def test_tap_ranges_and_waste():
    # DeepLab's ASPP at dilation 12 over 20x20: the outer taps reach 8 of 20 outputs
    assert tap_ranges(20, 20, 3, 1, 12, 12) == [(12, 20), (0, 20), (0, 8)]
    assert wasted([tap_ranges(20, 20, 3, 1, 12, 12)] * 2, [20, 20]) == pytest.approx(0.64)
    # strided: tap t at output o reads 2 * o + 3 * t - 3
    assert tap_ranges(10, 5, 3, 2, 3, 3) == [(2, 5), (0, 5), (0, 4)]
    # a tap that never reads the map: an empty range
    assert tap_ranges(4, 4, 3, 1, 5, 5) == [(4, 4), (0, 4), (0, 0)]
    # a 3x3 dilation-2 conv over 28x28 wastes little
    assert wasted([tap_ranges(28, 28, 3, 1, 2, 2)] * 2, [28, 28]) < 0.1


def test_aspp_branch_becomes_nine_1x1_convs():
    m = _conv((1, 32, 20, 20), dilation=12)
    _, _, r = run_pass(SplitDilatedConv(), m)
    assert r.rewrites == {RULE: 1} and r.nodes == ["c"]
    mod = PassContext(node_names=[n.name for n in m.graph.node]).run(
        [FoldConstants(), TrimConvTaps(), SplitDilatedConv()], import_onnx(load_model(m)))
    assert _convs(mod) == [[16, 32, 1, 1]] * 9


@pytest.mark.parametrize("shape,kw", [
    ((1, 32, 20, 20), {"dilation": 12}),                  # DeepLab's ASPP branch
    ((1, 32, 20, 20), {"dilation": 12, "bn": True}),      # BatchNorm folded first
    ((1, 16, 9, 13), {"dilation": 6}),                    # rows and columns differ
    ((1, 16, 11, 11), {"dilation": 4, "stride": 2}),      # strided
    ((1, 16, 12, 12), {"dilation": 5, "pads": [4, 2, 2, 4]}),         # asymmetric
    ((1, 16, 12, 12), {"dilation": 8, "group": 16, "f": 16}),         # depthwise
    ((1, 16, 12, 12), {"dilation": 8, "group": 4, "f": 8}),           # grouped
    ((1, 16, 40), {"dilation": 24}),                      # conv1d
    ((1, 8, 6, 6, 6), {"dilation": 4}),                   # conv3d
])
def test_numerics_against_onnxruntime(shape, kw):
    m = _conv(shape, **kw)
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    (got,), cm = compile_run(m, feeds)
    assert report(cm, "split_dilated_conv")["rewrites"] == {RULE: 1}
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,kw", [
    ((1, 16, 28, 28), {"dilation": 2}),       # few taps in padding: one kernel is better
    ((1, 16, 5, 5), {}),                      # undilated
    ((1, 32, 20, 20), {"dilation": 24}),      # trim_conv_taps made it a 1x1 conv
])
def test_convs_that_waste_little_are_left(shape, kw):
    m = _conv(shape, **kw)
    feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    (got,), cm = compile_run(m, feeds)
    assert not report(cm, "split_dilated_conv")["rewrites"]
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)
