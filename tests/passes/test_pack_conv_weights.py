"""pack_conv_weights: structure (counts, names, packed layout), numerics against
onnxruntime, and convs it must leave alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

import compiler
from passes.pack_conv_weights import pack_oihw
from tests.schedules.util import onnx_model


def _model(groups=1, k=3, f=32, c=8):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((f, c // groups, k, k)).astype("float32") * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k, k],
                              pads=[k // 2] * 4, group=groups, name="stem.conv"),
             helper.make_node("Relu", ["c"], ["y"], name="stem.relu")]
    return onnx_model(nodes, [("x", (1, c, 10, 10))], [("y", (1, f, 10, 10))], {"w": w})


def _report(cm):
    return next(p for p in cm.report["passes"] if p["name"] == "pack_conv_weights")


def test_pack_oihw_layout():
    w = np.arange(32 * 2 * 3 * 3, dtype="float32").reshape(32, 2, 3, 3)
    p = pack_oihw(w, 16)
    assert p.shape == (2, 2, 3, 3, 16)
    assert p[1, 1, 2, 0, 5] == w[16 + 5, 1, 2, 0]


def test_rewrites_3x3_names_node_and_matches_ort():
    model = _model()
    cm = compiler.compile(model, target="host", layout="NCHW")
    rep = _report(cm)
    assert rep["rewrites"] == {"conv2d(x, W) => conv_packed(x, OIHW[b]o(W))": 1}
    assert rep["nodes"] == ["stem.conv"]
    assert cm.report["schedules"].get("cpu.conv2d_packed") == 1
    # the kernel still names the ONNX nodes it computes
    calls = cm.meta["graph"]["calls"]
    assert any("stem.conv" in c.get("nodes", []) for c in calls)
    x = np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-5)


def test_leaves_depthwise_and_unblocked_channels_alone():
    for model in (_model(groups=8, f=8), _model(f=24), _model(f=1000, c=4)):
        cm = compiler.compile(model, target="host", layout="NCHW")
        assert not _report(cm)["rewrites"], _report(cm)
        assert "cpu.conv2d_packed" not in cm.report["schedules"]


def test_options_min_taps_and_blocks():
    cm = compiler.compile(_model(k=1), target="host", layout="NCHW")   # 1x1 packed by default
    assert cm.report["schedules"].get("cpu.conv2d_packed") == 1
    cm = compiler.compile(_model(k=1), target="host", layout="NCHW",
                          pass_config={"pack_conv_weights": {"min_taps": 2}})
    assert not _report(cm)["rewrites"]
    cm = compiler.compile(_model(f=24), target="host", layout="NCHW",
                          pass_config={"pack_conv_weights": {"blocks": (24,)}})
    assert cm.report["schedules"].get("cpu.conv2d_packed") == 1


def test_disabled_by_pass_name():
    cm = compiler.compile(_model(), target="host", layout="NCHW",
                          disabled_passes=["pack_conv_weights"])
    assert _report(cm)["skipped"] == "disabled"
    assert "cpu.conv2d_packed" not in cm.report["schedules"]


def test_conv1d_and_conv3d_are_packed():
    """conv1d (audio stems) and conv3d are packed as conv2d is: TVM's own conv1d kernel
    ran at 0.3 GFLOP/s under dlight's reduction rule."""
    rng = np.random.default_rng(0)
    for nd, size in ((1, (50,)), (3, (4, 6, 6))):
        w = rng.standard_normal((32, 4, *[3] * nd)).astype("float32")
        node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3] * nd,
                                pads=[1] * 2 * nd, name="c")
        m = onnx_model([node], [("x", (1, 4, *size))], [("y", (1, 32, *size))], {"w": w})
        cm = compiler.compile(m)
        rep = next(p for p in cm.report["passes"] if p["name"] == "pack_conv_weights")
        ker = "OIW" if nd == 1 else "OIDHW"
        assert rep["rewrites"] == {f"conv{nd}d(x, W) => conv_packed(x, {ker}[b]o(W))": 1}
        assert rep["nodes"] == ["c"]
        assert cm.report["schedules"].get("cpu.conv2d_packed") == 1


def test_padded_block():
    from passes.pack_conv_weights import padded_block

    assert padded_block(45, (32, 16, 48)) == (16, 48)     # R(2+1)D's midplanes
    assert padded_block(230, (32, 16, 48)) == (16, 240)
    assert padded_block(921, (32, 16, 48)) == (32, 928)
    assert padded_block(24, (32, 16, 48)) == (0, 24)      # a third more work: left


def test_conv1d_and_conv3d_of_unblocked_channels_are_padded():
    """Output channels no block divides (R(2+1)D's 45 / 230 / 460 / 921) get zero-weight
    channels up to whole blocks, dropped in the kernel's write-back: they had no rule but
    dlight's reduction (40-76x onnxruntime's time); a conv2d keeps its layout rules."""
    rng = np.random.default_rng(0)
    for nd, size, f, stride in ((1, (50,), 100, 2), (3, (4, 9, 9), 45, 2), (3, (3, 5, 5), 45, 1)):
        w = rng.standard_normal((f, 8, *[3] * nd)).astype("float32")
        node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3] * nd,
                                pads=[1] * 2 * nd, strides=[stride] * nd, name="c")
        out = [(s + 2 - 3) // stride + 1 for s in size]
        m = onnx_model([node], [("x", (1, 8, *size))], [("y", (1, f, *out))], {"w": w})
        cm = compiler.compile(m)
        assert cm.report["schedules"] == {"cpu.conv2d_packed": 1}
        x = rng.standard_normal((1, 8, *size)).astype("float32")
        ref = ort.InferenceSession(m.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = cm.session().run(None, {"x": x})[0]
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_pad_width_pads_thin_divisor_tiles_only():
    from passes.pack_conv_weights import pad_width

    assert pad_width(1599, 6) == 6      # 3 x 13 x 41: 3-pixel tiles -> 1602 columns
    assert pad_width(101, 6) == 6       # prime
    assert pad_width(1500, 6) == 1      # 6 divides it
    assert pad_width(49, 10) == 1       # 7-pixel tiles within 10% of 10: no padding
    assert pad_width(5, 6) == 1         # padding would double the work
    assert pad_width(1, 6) == 1


def test_conv1d_width_padded_to_the_targets_tile():
    """A conv1d whose output width (101, prime) leaves only 1-pixel tiles runs over 102
    columns (the pass reports it) and still matches onnxruntime; the block and tile follow
    the target: two fp32 vectors of channels (compiler/driver.py _conv_tiles)."""
    from compiler.driver import _conv_tiles
    import targets

    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 8, 3)).astype("float32")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], strides=[2],
                            name="c")
    m = onnx_model([node], [("x", (1, 8, 203))], [("y", (1, 32, 101))], {"w": w})
    cm = compiler.compile(m)
    rep = _report(cm)
    assert rep["rewrites"]["output width padded to whole register tiles"] == 1
    x = rng.standard_normal((1, 8, 203)).astype("float32")
    ref = ort.InferenceSession(m.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
    avx2 = _conv_tiles(targets.resolve({"kind": "llvm", "mcpu": "znver3",
                                        "mtriple": "x86_64-linux-gnu"}), {})
    avx512 = _conv_tiles(targets.resolve({"kind": "llvm", "mcpu": "znver5",
                                          "mtriple": "x86_64-linux-gnu"}), {})
    assert avx2["pack_conv_weights"]["blocks"][0] == 16
    assert avx2["pack_conv_weights"]["accumulators"] == 12
    assert avx512["pack_conv_weights"]["blocks"][0] == 32
    assert avx512["pack_conv_weights"]["accumulators"] == 20
    # a user's blocks win
    mine = _conv_tiles(targets.resolve({"kind": "llvm", "mcpu": "znver3",
                                        "mtriple": "x86_64-linux-gnu"}),
                       {"pack_conv_weights": {"blocks": (48,)}})
    assert mine["pack_conv_weights"]["blocks"] == (48,)


def test_conv1d_width_not_padded_when_tiles_divide():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 8, 3)).astype("float32")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], pads=[1, 1],
                            name="c")
    m = onnx_model([node], [("x", (1, 8, 120))], [("y", (1, 32, 120))], {"w": w})
    rep = _report(compiler.compile(m))
    assert "output width padded to whole register tiles" not in rep["rewrites"]
