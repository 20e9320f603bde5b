"""pack_int_conv: blocked int32 convs onto the packed integer kernel: the weight packing
(blocked and NCHW-input forms, int8 / int16), the rewrite count, and convs it leaves to TVM
(NCHW layout) still correct."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import compiler
from passes.pack_int_conv import RULE, pack_conv_int
from tests.passes.test_qdq_conv_integer import qdq_conv_model


def test_pack_blocked_weight_pairs_input_channels_innermost():
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (2, 3, 3, 3, 8, 8))          # [F/b, C/b, KH, KW, b i, b o]
    wp = pack_conv_int(w, blocked=True)
    assert wp.shape == (2, 3, 3, 3, 4, 8, 2) and wp.dtype == np.int8
    fo, co, ry, rx, ci, v = 1, 2, 0, 2, 5, 3
    assert wp[fo, co, ry, rx, ci // 2, v, ci % 2] == w[fo, co, ry, rx, ci, v]


def test_pack_nchw_input_weight_pads_odd_channels_and_widens():
    rng = np.random.default_rng(1)
    w = rng.integers(-300, 300, (2, 3, 7, 7, 8))              # [F/b, C, KH, KW, b o]
    wp = pack_conv_int(w, blocked=False)
    assert wp.shape == (2, 1, 7, 7, 2, 8, 2) and wp.dtype == np.int16  # |w| > 127
    assert wp[1, 0, 4, 6, 1, 5, 0] == w[1, 2, 4, 6, 5]
    assert not wp[:, :, :, :, 1, :, 1].any()                   # the zero 4th channel


def test_fires_on_blocked_qdq_conv():
    model = qdq_conv_model(16, 16, 8, 3, pad=1)
    cm = compiler.compile(model, target="host")
    rep = next(p for p in cm.report["passes"] if p["name"] == "pack_int_conv")
    assert rep["rewrites"] == {RULE: 1} and rep["nodes"] == ["conv"]


def test_nchw_layout_not_packed_and_still_correct():
    model = qdq_conv_model(16, 16, 8, 3, pad=1, zx=77)
    cm = compiler.compile(model, target="host", layout="NCHW")
    rep = next(p for p in cm.report["passes"] if p["name"] == "pack_int_conv")
    assert rep["rewrites"] == {}
    assert not any(r["rule"] == "cpu.conv2d_int8" for r in cm.report["kernel_table"])
    x = np.random.default_rng(2).standard_normal((1, 16, 8, 8)).astype(np.float32)
    got = cm.session().run(None, {"x": x})[0]
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - ref).max() <= 0.03 + 1e-6
