"""cpu.reduce_broadcast: structure under a Target (the excitation computed once, outside
the broadcast multiply's loops), numerics against onnxruntime (squeeze-and-excitation
blocks at channel counts that do and do not fill vectors), negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from schedules.cpu.reduce_broadcast import ReduceBroadcast
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def _excite(c=32, r=8, h=14):
    """sigmoid(conv1x1(pooled) + b) * x: the last kernel of an SE block, NCHW."""
    def build(bb, x, pooled, w, b):
        s = bb.emit(relax.op.nn.conv2d(pooled, w))
        s = bb.emit(relax.op.sigmoid(relax.op.add(s, b)))
        return bb.emit(relax.op.multiply(x, s))
    return fused_primfunc(build, [(1, c, h, h), (1, r, 1, 1), (c, r, 1, 1), (1, c, 1, 1)],
                          "conv2d")


def test_structure_excitation_once_then_parallel_vectorised_multiply():
    sch = ReduceBroadcast().apply(_excite(h=56), TARGET)
    assert sch is not None
    text = sch.mod["main"].script()
    # the excitation (32 outputs x 8) runs once on one core, in a loop nest of its own:
    # no parallel loop and no 56-row loop around the conv; the multiply over the whole
    # feature map is parallel and vectorised
    loops = [ln for ln in text[:text.index('T.sblock("conv2d_nchw")')].splitlines()
             if " for " in ln]
    assert loops and not any("T.parallel" in ln or "T.int64(56)" in ln for ln in loops)
    after = text[text.index('T.sblock("compute")'):]
    assert "T.parallel" in after and "T.vectorized(T.int64(56))" in after


def test_large_stages_inlined_into_one_pass_over_the_map():
    """A requantised excitation (QDQ EfficientNet: x * s, then scale, round, clip, cast
    to uint8): the map-sized stages before the output are inlined, so no map-sized
    intermediate buffer is left (each was a pass over the map of its own)."""
    def build(bb, x, pooled, w, b):
        s = bb.emit(relax.op.nn.conv2d(pooled, w))
        s = bb.emit(relax.op.sigmoid(relax.op.add(s, b)))
        y = bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, s)), relax.const(7.5)))
        y = bb.emit(relax.op.clip(bb.emit(relax.op.round(y)), 0, 255))
        return bb.emit(relax.op.astype(y, "uint8"))
    func = fused_primfunc(build, [(1, 32, 56, 56), (1, 8, 1, 1), (32, 8, 1, 1),
                                  (1, 32, 1, 1)], "conv2d")
    text = ReduceBroadcast().apply(func, TARGET).mod["main"].script()
    allocs = [ln for ln in text.splitlines() if "alloc_buffer" in ln]
    assert allocs and not any("T.int64(56)" in ln for ln in allocs), allocs


def test_rejects_reductions_that_are_not_broadcast():
    plain = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[2, 3], keepdims=True)),
                           [(1, 32, 14, 14)], "sum")
    assert ReduceBroadcast().apply(plain, TARGET) is None
    # same-size consumer: conv on 1x1 pixels, sigmoid after it, no broadcast
    small = fused_primfunc(
        lambda bb, p, w: bb.emit(relax.op.sigmoid(bb.emit(relax.op.nn.conv2d(p, w)))),
        [(1, 8, 1, 1), (32, 8, 1, 1)], "conv2d")
    assert ReduceBroadcast().apply(small, TARGET) is None


@pytest.mark.parametrize("c,r,h", [(32, 8, 14), (24, 6, 7), (40, 10, 9), (512, 128, 7)])
def test_numerics_squeeze_excitation(c, r, h):
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((r, c, 1, 1)).astype("float32") * 0.3,
             "b1": rng.standard_normal(r).astype("float32"),
             "w2": rng.standard_normal((c, r, 1, 1)).astype("float32") * 0.3,
             "b2": rng.standard_normal(c).astype("float32")}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"], name="se.pool"),
             helper.make_node("Conv", ["p", "w1", "b1"], ["q"], name="se.fc1"),
             helper.make_node("Relu", ["q"], ["qr"], name="se.relu"),
             helper.make_node("Conv", ["qr", "w2", "b2"], ["e"], name="se.fc2"),
             helper.make_node("Sigmoid", ["e"], ["s"], name="se.sigmoid"),
             helper.make_node("Mul", ["x", "s"], ["y"], name="se.scale")]
    shape = (1, c, h, h)
    model = onnx_model(nodes, [("x", shape)], [("y", shape)], inits)
    check_against_ort(model, {"x": rng.standard_normal(shape).astype("float32")},
                      "cpu.reduce_broadcast")


def _excite_blocked(c=64, r=32, h=7, b=16):
    """The SE block's last kernel in NCHW[b]c (convert_layout's form): the 1x1 conv reads
    its weight ``[f, co, 0, 0, ci, v]`` along the output's channel lane ``v``."""
    import compiler  # noqa: F401 - installs the NCHW[b]c conv legalization

    def build(bb, x, pooled, w, bias):
        s = bb.emit(relax.op.nn.conv2d(pooled, w, data_layout=f"NCHW{b}c",
                                       kernel_layout=f"OIHW{b}i{b}o", out_layout=f"NCHW{b}c"))
        s = bb.emit(relax.op.sigmoid(relax.op.add(s, bias)))
        return bb.emit(relax.op.multiply(x, s))
    return fused_primfunc(build, [(1, c // b, h, h, b), (1, r // b, 1, 1, b),
                                  (c // b, r // b, 1, 1, b, b), (1, c // b, 1, 1, b)], "conv2d")


def test_structure_blocked_excitation_vectorised_along_the_lane():
    """NCHW[b]c: the excitation's reduction runs a vector FMA per step over the channel
    lane (contiguous weight rows), parallel over channel blocks; not one scalar chain per
    output (RegNet-Y-4GF's 272 -> 1088 excitation: 334 -> 96 us, one thread)."""
    sch = ReduceBroadcast().apply(_excite_blocked(c=512, r=128), TARGET)
    assert sch is not None
    text = sch.mod["main"].script()
    update = text[:text.index('T.sblock("conv2d_NCHWc_update")')]
    assert "for v in T.vectorized(T.int64(16)):" in update.splitlines()[-2]
    assert "T.parallel(T.int64(32))" in update  # the 32 output channel blocks


def test_scalar_excitation_where_the_lane_is_not_read_contiguously():
    """NCHW (the weight ``[f, c]``): no lane to vectorise the reduction over; the scalar
    form, parallel over its outputs."""
    sch = ReduceBroadcast().apply(_excite(c=64, r=16, h=14), TARGET)
    text = sch.mod["main"].script()
    head = text[text.index('T.sblock("pad_temp")'):text.index('T.sblock("conv2d_nchw")')]
    assert "T.vectorized" not in head.split("\n", 1)[1]
