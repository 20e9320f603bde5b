"""pack_int_conv: blocked int32 convs onto the packed integer kernel: the weight packing
(blocked and NCHW-input forms, int8 / int16), the rewrite count, and convs it leaves to TVM
(NCHW layout) still correct; the u8 x s8 form (weights by fours of input channels,
vpmaddubsw / vpdpbusd): packing, saturation-proof and full-range weights against
onnxruntime, the saturation count in the report, the ``exact`` option keeping vpmaddwd."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import pytest
from onnx import numpy_helper

import compiler
import targets
from passes.int8_quads import SATURATING
from passes.pack_int_conv import RULE, RULE_U8, pack_conv_int, pack_conv_quads
from tests.passes.test_pack_int_matmul import host_dot, need_dot
from tests.passes.test_qdq_conv_integer import _feeds, _ort, qdq_conv_model


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
    # weights in [-64, 64): u8 x s8 by fours where the host has the dot, never saturating
    assert rep["rewrites"] == {RULE_U8 if host_dot() else RULE: 1} and rep["nodes"] == ["conv"]


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


def test_pack_quads_four_input_channels_innermost():
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (2, 3, 3, 3, 8, 8))          # [F/b, C/b, KH, KW, b i, b o]
    wq = pack_conv_quads(w, blocked=True)
    assert wq.shape == (2, 3, 3, 3, 2, 8, 4) and wq.dtype == np.int8
    fo, co, ry, rx, ci, v = 1, 2, 0, 2, 5, 3
    assert wq[fo, co, ry, rx, ci // 4, v, ci % 4] == w[fo, co, ry, rx, ci, v]
    w = rng.integers(-128, 128, (2, 3, 7, 7, 8))              # NCHW input, 3 channels
    wq = pack_conv_quads(w, blocked=False)
    assert wq.shape == (2, 1, 7, 7, 1, 8, 4) and not wq[..., 3].any()
    assert wq[1, 0, 4, 6, 0, 5, 2] == w[1, 2, 4, 6, 5]


def _full_range(model, seed=3):
    """``model`` (qdq_conv_model) with full-range s8 weights: pair sums can pass int16."""
    for init in model.graph.initializer:
        if init.name == "wq":
            w = numpy_helper.to_array(init)
            w = np.random.default_rng(seed).integers(-128, 128, w.shape).astype(np.int8)
            init.CopyFrom(numpy_helper.from_array(w, "wq"))
    return model


@pytest.mark.parametrize("per_channel,bias,full", [(True, True, False), (False, False, False),
                                                   (True, False, True), (False, True, True)])
def test_u8s8_conv_matches_ort(per_channel, bias, full):
    dot = need_dot()
    model = qdq_conv_model(32, 32, 10, 3, pad=1, per_channel=per_channel, bias=bias, zx=20)
    model = _full_range(model) if full else model
    feeds = _feeds(model)
    feeds["x"] = np.abs(feeds["x"]) * 3 + 0.5     # large u8 values: pairs past int16
    cm = compiler.compile(model, target="host")
    rep = next(p for p in cm.report["passes"] if p["name"] == "pack_int_conv")
    saturating = full and dot in targets.INT8_DOT_SATURATES
    assert rep["rewrites"].get(RULE_U8) == 1
    assert rep["rewrites"].get(SATURATING, 0) == int(saturating)
    got, ref = cm.session().run(None, feeds)[0], _ort(model, feeds)
    # onnxruntime's u8 x s8 conv pairs the same input channels: saturated or not, the
    # integer sums agree, and the outputs at most where float rounding ties differ
    assert np.abs(got - ref).max() <= 0.03 + 1e-6 and np.mean(got != ref) < 0.02


def test_exact_option_keeps_pairs_and_does_not_saturate():
    if host_dot() not in targets.INT8_DOT_SATURATES:
        pytest.skip("host has no saturating u8 x s8 dot")
    model = _full_range(qdq_conv_model(32, 32, 10, 3, pad=1, zx=20))
    feeds = _feeds(model)
    feeds["x"] = np.abs(feeds["x"]) * 3 + 0.5
    cm = compiler.compile(model, target="host", pass_config={"pack_int_conv": {"exact": True}})
    rep = next(p for p in cm.report["passes"] if p["name"] == "pack_int_conv")
    assert rep["rewrites"] == {RULE: 1}
    got = cm.session().run(None, feeds)[0]
    # onnxruntime's QLinearConv saturates here; without its graph optimisations it runs
    # DQ -> float Conv -> Q, the exact reference (float sums: ties one step apart)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    exact = ort.InferenceSession(model.SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(got - exact).max() <= 0.03 + 1e-6 and np.mean(got != exact) < 0.02
    assert np.abs(_ort(model, feeds) - exact).max() > 0.5   # the data does saturate


def _symbolic_batch(model):
    m = type(model)()
    m.CopyFrom(model)
    for vi in (*m.graph.input, *m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    return m


@pytest.mark.parametrize("batch_loop", [True, False])
def test_symbolic_batch_packs_and_loops(batch_loop):
    """A QDQ conv net exported with a dynamic batch (quantize_static of a torch export):
    the symbolic build packs its integer conv (pack_int_conv read the batch as an int
    and failed the compile), then runs as a batch loop of the one-sample build, or stays
    symbolic; within one output step of onnxruntime at batches 1 and 3."""
    model = _symbolic_batch(qdq_conv_model(16, 16, 8, 3, pad=1, relu=True))
    cm = compiler.compile(model, target="host", dims={"batch": (1, 4, 1)},
                          batch_loop=batch_loop)
    assert ("batch_loop" in cm.report) == batch_loop
    assert any(r["rule"] == "cpu.conv2d_int8" for r in cm.report["kernel_table"]), \
        cm.report["kernel_table"]
    sess = cm.session()
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 16, 8, 8)).astype(np.float32)
        ref = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert np.abs(sess.run(None, {"x": x})[0] - ref).max() <= 0.03 + 1e-6
