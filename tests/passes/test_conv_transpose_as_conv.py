"""conv_transpose_as_conv: the phase weight's layout, numerics against onnxruntime for 1/2/3-D
transposed convs of few output channels (bias, output_padding, output_shape, asymmetric
pads, k not a multiple of s, odd sizes), the conv's rule, and the transposed convs it must
leave alone (blocked channels, grouped, dilated, stride 1); plus the static NCHW conv whose
width no vector divides, computed over whole vectors (legalize_conv_nchwc)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import compiler
from passes.conv_transpose_as_conv import RULE, phase_weight
from tests.passes.test_pack_conv_transpose import _check, _model
from tests.schedules.util import onnx_model


def _report(cm, name="conv_transpose_as_conv"):
    return next(p for p in cm.report["passes"] if p["name"] == name)


def test_phase_weight_layout():
    """V[(f, r), c, u] = W[c, f, r + s*(T - 1 - u)], zero past the kernel (k3 s2: T = 2)."""
    w = np.arange(4 * 3 * 3, dtype="float32").reshape(4, 3, 3) + 1
    v = phase_weight(w, [2])
    assert v.shape == (3 * 2, 4, 2)
    # f = 2, phase r = 1, channel 3: taps u = 0 -> k = 1 + 2*1 = 3 (past k: 0), u = 1 -> k = 1
    assert v[2 * 2 + 1, 3, 0] == 0 and v[2 * 2 + 1, 3, 1] == w[3, 2, 1]
    # phase 0: u = 0 -> k = 2, u = 1 -> k = 0
    assert v[2 * 2 + 0, 1, 0] == w[1, 2, 2] and v[2 * 2 + 0, 1, 1] == w[1, 2, 0]
    w2 = np.arange(2 * 3 * 4 * 4, dtype="float32").reshape(2, 3, 4, 4)
    v2 = phase_weight(w2, [2, 2])                 # [F * sy * sx, C, Ty, Tx]
    assert v2.shape == (12, 2, 2, 2)
    # f = 1, ry = 1, rx = 0, c = 1, uy = 0 (ty = 1: k 3), ux = 1 (tx = 0: k 0)
    assert v2[1 * 4 + 1 * 2 + 0, 1, 0, 1] == w2[1, 1, 3, 0]


@pytest.mark.parametrize("c,f,size,k,s,p,out_pad", [
    (64, 3, (16, 16), 4, 2, 1, 0),       # DCGAN / pix2pix last layer k4 s2 p1
    (16, 1, (20, 20), 2, 2, 0, 0),       # a mask head k2 s2
    (8, 5, (9, 11), 3, 2, 1, 1),         # k not a multiple of s, output_padding, odd sizes
    (8, 21, (7, 7), 4, 2, 1, 0),         # 21 classes (no 8-block)
    (6, 3, (5, 6), 5, 3, 2, 0),          # k5 s3 p2
    (4, 2, (6, 5), 2, 3, 0, 0),          # k < s: every output's phase past k in part
    (8, 3, (40,), 4, 2, 1, 0),           # 1-D
    (8, 1, (13,), 16, 8, 4, 0),          # 1-D vocoder-like k16 s8 p4
    (4, 3, (3, 4, 5), 2, 2, 0, 0),       # 3-D k2 s2
    (4, 3, (3, 4, 4), 3, 2, 1, 1),       # 3-D k3 s2 p1 op1
])
def test_numerics_against_onnxruntime(c, f, size, k, s, p, out_pad):
    cm = _check(_model(c, f, size, k, s, p, out_pad), (1, c, *size))
    assert _report(cm)["rewrites"] == {RULE: 1} and _report(cm)["nodes"] == ["decoder.up"]
    # the phase conv takes a conv rule; no TVM zero-dilated conv (a fallback) is left
    assert "fallback" not in cm.report["schedules"]


def test_asymmetric_pads_and_output_shape():
    # pads (top 0, left 1, bottom 2, right 1): 5*2 - 2 + 4 = 12 rows, 6*2 - 2 + 4 = 14 cols
    w = np.random.default_rng(0).standard_normal((8, 3, 4, 4)).astype("float32")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[4, 4],
                            strides=[2, 2], pads=[0, 1, 2, 1], name="decoder.up")
    cm = _check(onnx_model([node], [("x", (1, 8, 6, 7))], [("y", (1, 3, 12, 14))], {"w": w}),
                (1, 8, 6, 7))
    assert _report(cm)["rewrites"] == {RULE: 1}
    # end pads as large as the kernel: 5*2 + 2 - 2 = 10 rows, 6*2 + 2 - 3 = 11 cols
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2],
                            strides=[2, 2], pads=[0, 0, 2, 3], name="decoder.up")
    w2 = np.random.default_rng(0).standard_normal((8, 3, 2, 2)).astype("float32")
    cm = _check(onnx_model([node], [("x", (1, 8, 6, 7))], [("y", (1, 3, 10, 11))], {"w": w2}),
                (1, 8, 6, 7))
    assert _report(cm)["rewrites"] == {RULE: 1}
    cm = _check(_model(8, 3, (6, 7), 3, 2, bias=False, attrs={"output_shape": [13, 15]}),
                (1, 8, 6, 7))
    assert _report(cm)["rewrites"] == {RULE: 1}


@pytest.mark.parametrize("c,f,size,k,s,p", [
    (16, 32, (8, 8), 2, 2, 0),           # blocked, one tap per phase: a 1x1 conv
    (256, 16, (5, 5), 4, 2, 1),          # blocked, 256 input channels (pix2pix's decoder)
    (256, 16, (5, 6), 3, 2, 1),
])
def test_blocked_2d_it_takes(c, f, size, k, s, p):
    cm = _check(_model(c, f, size, k, s, p), (1, c, *size))
    assert _report(cm)["rewrites"] == {RULE: 1}
    assert not _report(cm, "pack_conv_transpose")["rewrites"]
    assert "cpu.conv2d_nchwc" in cm.report["schedules"]


def test_leaves_blocked_grouped_dilated_and_stride_one():
    for model, shape in ((_model(8, 16, (6, 6), 4, 2, p=1), (1, 8, 6, 6)),        # blocked
                         (_model(8, 16, (9,), 2, 2), (1, 8, 9)),                   # 1-D k2 s2
                         (_model(8, 4, (6, 6), 4, 2, p=1, group=2), (1, 8, 6, 6)),
                         (_model(8, 3, (6, 6), 3, 2, dil=2), (1, 8, 6, 6)),
                         (_model(8, 3, (6, 6), 3, 1, p=1), (1, 8, 6, 6))):
        cm = _check(model, shape)
        assert not _report(cm)["rewrites"], _report(cm)


def test_disabled_by_pass_name():
    cm = compiler.compile(_model(8, 3, (6, 6), 4, 2, p=1), target="host",
                          disabled_passes=["conv_transpose_as_conv"])
    assert _report(cm)["skipped"] == "disabled"


def _conv(c, f, hw, k, pad):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((f, c, k, k)).astype("float32") * 0.2
    out = hw + 2 * pad - k + 1
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[k, k], pads=[pad] * 4,
                            name="head")
    return onnx_model([node], [("x", (1, c, hw, hw))], [("y", (1, f, out, out))], {"w": w})


@pytest.mark.parametrize("c,f,hw,k,pad", [(32, 12, 128, 2, 1),  # 129 columns: 3-lane tiles
                                          (16, 3, 37, 3, 1)])   # 37
def test_static_nchw_conv_over_whole_vectors(c, f, hw, k, pad):
    """A plain NCHW conv whose output width no vector divides (few channels: no block) is
    computed over whole vectors of columns and cut back (``conv_columns``)."""
    from compiler.lowering.legalize_conv_nchwc import static_nchw_columns, register_tiles

    cm = _check(_conv(c, f, hw, k, pad), (1, c, hw, hw))
    assert cm.report["schedules"].get("cpu.conv2d_nchw") == 1
    lanes = cm.report["layout"]["block"]
    with register_tiles(lanes, 20):
        full = static_nchw_columns(hw + 2 * pad - k + 1)
    assert full % lanes == 0 and full > hw + 2 * pad - k + 1
    with register_tiles(lanes, 20):
        assert static_nchw_columns(4 * lanes) == 4 * lanes      # whole vectors: as is
    assert static_nchw_columns(65) == 65                        # no CPU tile registered
