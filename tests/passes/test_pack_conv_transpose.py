"""pack_conv_transpose: structure (counts, node names, phase-packed weights), numerics
against onnxruntime for 1/2/3-D (bias, output_padding, output_shape, odd sizes, k not a
multiple of s), and transposed convs it must leave to TVM (grouped, dilated)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import compiler
from passes.pack_conv_transpose import BLOCKS, pack_phases
from tests.schedules.util import onnx_model

RULE = "conv{}d_transpose(x, W) => sub-pixel conv(pad(x), W as [F/b, C, *T, *S, b])"


def _model(c, f, size, k, s, p=0, out_pad=0, group=1, dil=1, bias=True, attrs=None):
    """ConvTranspose (+ bias) then Relu; the output shape from ONNX's formula."""
    nd = len(size)
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((c, f // group, *[k] * nd)).astype("float32") * 0.2}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(f).astype("float32")
        ins.append("b")
    attrs = attrs or {"pads": [p] * 2 * nd, "output_padding": [out_pad] * nd}
    node = helper.make_node("ConvTranspose", ins, ["t"], kernel_shape=[k] * nd,
                            strides=[s] * nd, group=group, dilations=[dil] * nd,
                            name="decoder.up", **attrs)
    out = [(i - 1) * s - 2 * p + dil * (k - 1) + 1 + out_pad for i in size]
    if "output_shape" in attrs:
        out = list(attrs["output_shape"])
    relu = helper.make_node("Relu", ["t"], ["y"], name="decoder.relu")
    return onnx_model([node, relu], [("x", (1, c, *size))], [("y", (1, f, *out))], inits)


def _report(cm):
    return next(p for p in cm.report["passes"] if p["name"] == "pack_conv_transpose")


def _check(model, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    cm = compiler.compile(model, target="host")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-5)
    return cm


def test_pack_phases_layout():
    """wp[fo, c, t, r, fi] = w[c, fo*b + fi, r + s*t], zero past the kernel (k3 s2: T = 2)."""
    w = np.arange(4 * 32 * 3, dtype="float32").reshape(4, 32, 3) + 1
    wp = pack_phases(w, [2], 16)
    assert wp.shape == (2, 4, 2, 2, 16)
    assert wp[1, 3, 1, 0, 5] == w[3, 16 + 5, 2]
    assert wp[0, 2, 0, 1, 7] == w[2, 7, 1]
    assert not wp[:, :, 1, 1].any()          # tap r + s*t = 3 >= k: zero
    w2 = np.arange(2 * 16 * 4 * 4, dtype="float32").reshape(2, 16, 4, 4)
    wp2 = pack_phases(w2, [2, 2], 16)        # [F/b, C, Ty, Tx, Sy, Sx, b]
    assert wp2.shape == (1, 2, 2, 2, 2, 2, 16)
    assert wp2[0, 1, 1, 0, 0, 1, 3] == w2[1, 3, 2, 1]


def test_rewrites_names_node_and_schedules():
    model = _model(16, 32, (6, 6), 4, 2, p=1)
    cm = _check(model, (1, 16, 6, 6))
    rep = _report(cm)
    assert rep["rewrites"] == {RULE.format(2): 1}
    assert rep["nodes"] == ["decoder.up"]
    assert cm.report["schedules"].get("cpu.conv_transpose") == 1
    calls = cm.meta["graph"]["calls"]
    assert any("decoder.up" in c.get("nodes", []) for c in calls)


@pytest.mark.parametrize("c,f,size,k,s,p,out_pad", [
    (8, 32, (9,), 4, 2, 1, 0),           # vocoder k4 s2 p1
    (8, 32, (11,), 16, 8, 4, 0),         # vocoder k16 s8 p4 (phase tiles)
    (6, 16, (7,), 3, 2, 1, 1),           # k not a multiple of s, output_padding
    (16, 32, (8, 8), 2, 2, 0, 0),        # U-Net k2 s2 (no padding stage)
    (8, 16, (5, 7), 3, 2, 1, 1),         # odd sizes, k3 s2 p1 op1
    (8, 16, (5, 5), 5, 3, 2, 0),         # k5 s3 p2: odd output (ragged phases)
    (8, 16, (5, 6), 3, 1, 1, 0),         # stride 1: one phase, T = k taps
    (4, 16, (3, 4, 5), 2, 2, 0, 0),      # 3-D U-Net k2 s2
    (4, 16, (3, 4, 4), 3, 2, 1, 1),      # 3-D k3 s2 p1 op1
])
def test_numerics_against_onnxruntime(c, f, size, k, s, p, out_pad):
    cm = _check(_model(c, f, size, k, s, p, out_pad), (1, c, *size))
    if len(size) == 2 and k <= s:  # one tap per phase: conv_transpose_as_conv's 1x1 conv
        assert not _report(cm)["rewrites"]
        assert next(p for p in cm.report["passes"]
                    if p["name"] == "conv_transpose_as_conv")["rewrites"]
        return
    assert _report(cm)["rewrites"] == {RULE.format(len(size)): 1}
    assert cm.report["schedules"].get("cpu.conv_transpose") == 1


def test_blocks_two_vectors_of_the_target():
    """The driver puts two of the target's fp32 vectors first (16 channels on AVX2, 32 on
    AVX-512: compiler/driver.py _conv_tiles); a user's blocks win.  48 output channels (no
    32-block) and 32 (both) match onnxruntime with the host's blocks."""
    from compiler.driver import _conv_tiles
    import targets

    def blocks(mcpu, config=None):
        t = targets.resolve({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu"})
        return _conv_tiles(t, config or {})["pack_conv_transpose"]["blocks"]
    assert blocks("znver3")[0] == 16 and sorted(blocks("znver3")) == sorted(BLOCKS)
    assert blocks("znver5")[0] == 32
    assert blocks("znver3", {"pack_conv_transpose": {"blocks": (8,)}}) == (8,)
    for f in (48, 32):
        cm = _check(_model(8, f, (13,), 4, 2, 1), (1, 8, 13))
        assert _report(cm)["rewrites"] == {RULE.format(1): 1}
        assert cm.report["schedules"].get("cpu.conv_transpose") == 1


def test_output_shape_and_no_bias():
    """ONNX output_shape (the converter turns it into pads and a slice), no bias."""
    attrs = {"output_shape": [13, 15]}
    cm = _check(_model(8, 16, (6, 7), 3, 2, bias=False, attrs=attrs), (1, 8, 6, 7))
    assert _report(cm)["rewrites"] == {RULE.format(2): 1}


def test_leaves_grouped_dilated_and_unblocked_to_tvm():
    for model, shape in ((_model(8, 16, (6, 6), 4, 2, p=1, group=2), (1, 8, 6, 6)),
                         (_model(8, 16, (6, 6), 3, 2, dil=2), (1, 8, 6, 6)),
                         (_model(8, 3, (6, 6), 4, 2, p=1), (1, 8, 6, 6))):
        cm = _check(model, shape)
        assert not _report(cm)["rewrites"], _report(cm)
        assert "cpu.conv_transpose" not in cm.report["schedules"]


def test_disabled_by_pass_name():
    cm = compiler.compile(_model(8, 16, (6, 6), 2, 2), target="host",
                          disabled_passes=["pack_conv_transpose"])
    assert _report(cm)["skipped"] == "disabled"
    assert "cpu.conv_transpose" not in cm.report["schedules"]
