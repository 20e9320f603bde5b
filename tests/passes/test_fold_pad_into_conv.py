"""fold_pad_into_conv: conv(pad(x, zeros on spatial dims), W) => conv(x, W, padding + pad)."""

from __future__ import annotations

import numpy as np
import pytest

from passes import FoldPadIntoConv
from tests.conftest import ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "conv(pad(x), W) => conv(x, W, padding + pad)"


def _pad_conv(pads, shape=(1, 8, 15, 15), group=1, mode="constant", value=0.0, conv_pads=None,
              stride=2):
    nd = len(shape) - 2
    c = shape[1] + pads[1] + pads[nd + 3]     # channels after the pad
    w = np.random.default_rng(0).standard_normal((16 if group == 1 else c, c // group,
                                                  *[3] * nd)).astype(np.float32)
    f = w.shape[0]
    size = [(s + pads[2 + i] + pads[2 + nd + 2 + i] + 2 * (conv_pads or 0) - 3) // stride + 1
            for i, s in enumerate(shape[2:])]
    attrs = {"kernel_shape": [3] * nd, "strides": [stride] * nd, "group": group}
    if conv_pads:
        attrs["pads"] = [conv_pads] * 2 * nd
    return model([node("Pad", ["x", "pads", "v"], "xp", mode=mode),
                  node("Conv", ["xp", "w"], "y", **attrs)],
                 {"x": list(shape)}, {"y": [1, f, *size]},
                 {"w": w, "pads": np.array(pads, np.int64), "v": np.array(value, np.float32)})


def test_structure():
    # TF "same" padding for a stride-2 3x3 conv: one row/column after
    m = _pad_conv([0, 0, 0, 0, 0, 0, 1, 1], group=8)
    before, after, r = run_pass(FoldPadIntoConv(), m)
    assert before["relax.nn.pad"] == 1
    assert "relax.nn.pad" not in after and after["relax.nn.conv2d"] == 1
    assert r.rewrites == {RULE: 1} and r.nodes == ["xp", "y"]


@pytest.mark.parametrize("pads,shape,group,conv_pads", [
    ([0, 0, 0, 0, 0, 0, 1, 1], (1, 8, 15, 15), 8, None),     # depthwise, TF same (stride 2)
    ([0, 0, 1, 2, 0, 0, 2, 1], (1, 8, 14, 13), 1, 1),        # asymmetric + conv's own pads
    ([0, 0, 3, 0, 0, 4], (1, 8, 40), 1, None),               # conv1d
    ([0, 0, 1, 1, 1, 0, 0, 1, 1, 1], (1, 4, 5, 6, 7), 1, None),   # conv3d
])
def test_numerics_against_onnxruntime(pads, shape, group, conv_pads):
    m = _pad_conv(pads, shape, group, conv_pads=conv_pads)
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    (got,), cm = compile_run(m, feeds)
    assert report(cm, "fold_pad_into_conv")["rewrites"] == {RULE: 1}
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kw", [{"value": 1.0}, {"mode": "reflect"},
                                {"pads": [0, 1, 1, 1, 0, 0, 1, 1]}])
def test_nonzero_reflect_or_channel_pads_are_left(kw):
    pads = kw.pop("pads", [0, 0, 1, 1, 0, 0, 1, 1])
    shape = (1, 8, 15, 15) if pads[1] == 0 else (1, 7, 15, 15)
    m = _pad_conv(pads, shape, **kw)
    feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    (got,), cm = compile_run(m, feeds)
    assert not report(cm, "fold_pad_into_conv")["rewrites"]
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-5)
