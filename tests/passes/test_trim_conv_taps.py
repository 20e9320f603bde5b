"""trim_conv_taps: kernel taps that read only padding at every output position are cut."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.frontend.importer import import_onnx
from compiler.frontend.loader import load_model
from passes import FoldConstants, PassContext, TrimConvTaps
from passes.relax_util import bindings
from passes.trim_conv_taps import RULE, live_taps
from tests.conftest import ort_run

from .helpers import compile_run, model, node, report, run_pass


def _conv(shape, k=3, dilation=1, pads=None, stride=1, group=1, f=16, bias=True):
    nd = len(shape) - 2
    c = shape[1]
    pads = pads if pads is not None else [dilation * (k - 1) // 2] * 2 * nd
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((f, c // group, *[k] * nd)).astype(np.float32)}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(f).astype(np.float32)
        ins.append("b")
    size = [(s + pads[i] + pads[nd + i] - dilation * (k - 1) - 1) // stride + 1
            for i, s in enumerate(shape[2:])]
    return model([node("Conv", ins, "y", kernel_shape=[k] * nd, dilations=[dilation] * nd,
                       pads=pads, strides=[stride] * nd, group=group)],
                 {"x": list(shape)}, {"y": [shape[0], f, *size]}, inits)


def _conv_attrs(mod):
    return [(b.value.attrs, [int(d) for d in b.value.args[1].ty.shape])
            for b in bindings(mod) if getattr(getattr(b.value, "op", None), "name", "")
            .startswith("relax.nn.conv")]


def test_live_taps():
    # 3 taps at dilation 24 over 20 positions padded by 24: only the centre reads the map
    assert live_taps(20, 20, 3, 1, 24, 24) == (1, 1)
    # dilation 12: every tap reads it somewhere (rows >= 12 and < 8)
    assert live_taps(20, 20, 3, 1, 12, 12) == (0, 2)
    # asymmetric: padding only after, the last tap reads only it
    assert live_taps(4, 4, 3, 1, 3, 0) == (0, 1)
    # every tap in padding: nothing live
    assert live_taps(2, 1, 3, 1, 1, 5) == (-1, -1)


def test_aspp_branch_becomes_a_1x1_conv():
    m = _conv((1, 32, 20, 20), dilation=24)
    _, _, r = run_pass(TrimConvTaps(), m)
    assert r.rewrites == {RULE: 1} and r.nodes == ["y"]
    names = [n.name for n in m.graph.node]
    mod = PassContext(node_names=names).run([FoldConstants(), TrimConvTaps()],
                                            import_onnx(load_model(m)))
    (attrs, wshape), = _conv_attrs(mod)
    assert wshape == [16, 32, 1, 1]
    assert [int(p) for p in attrs.padding] == [0, 0, 0, 0]
    assert [int(d) for d in attrs.dilation] == [1, 1]


@pytest.mark.parametrize("shape,kw", [
    ((1, 32, 20, 20), {"dilation": 24}),                  # centre tap only: a 1x1 conv
    ((1, 32, 20, 20), {"dilation": 36}),
    ((1, 16, 9, 13), {"dilation": 10}),                   # rows cut, columns kept
    ((1, 16, 10, 10), {"dilation": 10, "stride": 2}),     # strided
    ((1, 16, 7, 7), {"k": 5, "dilation": 3, "pads": [6, 0, 0, 6]}),   # asymmetric
    ((1, 16, 12, 12), {"dilation": 12, "group": 16, "f": 16}),        # depthwise
    ((1, 16, 40), {"dilation": 48}),                      # conv1d
    ((1, 8, 6, 6, 6), {"dilation": 6}),                   # conv3d
])
def test_numerics_against_onnxruntime(shape, kw):
    m = _conv(shape, **kw)
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    (got,), cm = compile_run(m, feeds)
    assert report(cm, "trim_conv_taps")["rewrites"] == {RULE: 1}
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,kw", [
    ((1, 32, 20, 20), {"dilation": 12}),      # every tap reads the map somewhere
    ((1, 16, 14, 14), {}),                    # a plain 3x3 "same" conv
])
def test_convs_whose_taps_all_read_the_map_are_left(shape, kw):
    m = _conv(shape, **kw)
    before, after, r = run_pass(TrimConvTaps(), m)
    assert not r.rewrites and before == after
    feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    (got,), cm = compile_run(m, feeds)
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)
