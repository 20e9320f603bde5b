"""cpu.conv2d_nchwc and its legalization: tile choice, structure under a Target, numerics
against onnxruntime through convert_layout (dense, depthwise, strided, dilated, padded,
1x1, AVX2 blocks), negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
import tvm
from tvm import relax

import compiler.lowering
from schedules.cpu.conv2d_nchwc import Conv2dNCHWc, depthwise_tile, tile
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

compiler.lowering.install()  # the NCHWc legalization on relax.nn.conv2d


def _blocked(c, h, f, k, groups=1, b=16, pad=1, stride=1):
    """The fused NCHW16c conv + bias + relu PrimFunc."""
    kin = 1 if groups > 1 else b

    def build(bb, x, w, bias):
        y = relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=groups,
                               data_layout=f"NCHW{b}c", kernel_layout=f"OIHW{kin}i{b}o")
        return bb.emit(relax.op.nn.relu(relax.op.add(bb.emit(y), bias)))
    return fused_primfunc(build, [(1, c // b, h, h, b), (f // b, c // kin if groups == 1 else 1,
                                                         k, k, kin, b), (1, f // b, 1, 1, b)],
                          "conv2d")


def test_tile_choice():
    assert tile(56, 56, 4) == (1, 4, 4)      # 4 channel blocks x 4 pixels: 16 accumulators
    assert tile(7, 7, 32) == (1, 7, 2)       # 7-wide rows: 2 blocks x 7 pixels
    yt, xt, ft = tile(13, 13, 3)
    assert 13 % yt == 0 and 13 % xt == 0 and 3 % ft == 0 and yt * xt * ft <= 20
    assert depthwise_tile(112) == 16 and depthwise_tile(7) == 7


def test_legalized_and_scheduled_dense():
    func = _blocked(16, 14, 64, 3)
    text = Conv2dNCHWc().apply(func, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(16))" in text
    assert "_local" in text and "T.unroll" in text
    # bias and relu are applied in the register tile's write-back, not as stages of their own
    assert 'T.sblock("T_add")' not in text and 'T.sblock("T_relu")' not in text


def test_dense_channel_chunks_accumulate_in_a_row_cache():
    """Input channel blocks whose weights outgrow L1 are chunked (conv2d_packed.
    channel_chunk): the chunk loop outside the row's pixel tiles, the row tile's
    accumulators in a global cache written back (bias + relu inlined) once."""
    func = _blocked(64, 14, 64, 3)
    text = Conv2dNCHWc().apply(func, TARGET).mod["main"].script()
    assert "_global" in text and "_local" not in text
    assert "for rco_0, y_0_1, x_0, rco_1, ry, rx, rci in" in text


def test_channel_chunks_serve_several_rows():
    """A chunk's weights, once in L1, serve several row tiles of a task (960 -> 256 3x3 at
    20 x 20: a 4-block tile's weights, 2.2 MB, outgrew L2 and were re-streamed from L3 for
    every row): the row loop inside the chunk loop, the rows' cache within
    ROW_CACHE_BYTES, enough tasks left for the cores."""
    from schedules.cpu.conv2d_nchwc import ROW_CACHE_BYTES, chunk_rows

    assert chunk_rows(20, 4, 5120, 2) == 4                 # 4 x 5 KB, 20 tasks
    assert chunk_rows(20, 4, 5120, 8) == 2                 # 8 cores: 40 tasks
    assert chunk_rows(20, 4, 5120, 16) == 1                # 16: every row its task
    assert chunk_rows(7, 4, 1024, 2) == 1                  # 7 rows: 4 tasks would not do
    assert chunk_rows(28, 16, ROW_CACHE_BYTES, 2) == 1     # one row fills the cache
    text = Conv2dNCHWc().apply(_blocked(256, 20, 64, 3), TARGET).mod["main"].script()
    rows = [ln for ln in text.splitlines() if "for rco_0, y_0_1, x_0," in ln]
    assert rows and "T.grid(T.int64(16), T.int64(1)," not in rows[0]
    assert 'T.sblock("T_add")' not in text and 'T.sblock("T_relu")' not in text


@pytest.mark.parametrize("b", [8, 16])  # AVX2's and AVX-512's blocks
def test_strided_1x1_reads_a_contiguous_subsample(b):
    """A strided 1x1 conv without padding (ResNet's downsampling shortcut) reads a copy of
    the pixels it uses: the legalization's ``subsample`` stage, kept by the rule as a
    parallel, vectorised stage; the conv itself then runs with stride 1."""
    func = _blocked(64, 14, 64, 1, pad=0, stride=2, b=b)
    text = func.script()
    sub, conv = text.split('T.sblock("subsample")')[1].split('T.sblock("conv2d_NCHWc")')
    assert "v_y * T.int64(2), v_x * T.int64(2)" in sub
    assert "subsample[v_i, v_rco, v_y + v_ry, v_x + v_rx, v_rci]" in conv  # stride 1
    out = Conv2dNCHWc().apply(func, TARGET).mod["main"].script()
    before = out.split('T.sblock("subsample")')[0].split("sblock_alloc_buffer")[-1]
    assert "T.parallel" in before and f"T.vectorized(T.int64({b}))" in before
    assert "_local" in out  # the conv's register tile as for any other conv


@pytest.mark.parametrize("k,stride,pad", [(1, 1, 0), (1, 2, 1), (3, 2, 1)])
def test_no_subsample_for_other_convs(k, stride, pad):
    """Stride 1, a padded 1x1 and a 3x3 read the (padded) input in place: no copy."""
    assert 'T.sblock("subsample")' not in _blocked(32, 14, 32, k, pad=pad,
                                                    stride=stride).script()


def test_legalized_and_scheduled_depthwise():
    func = _blocked(32, 14, 32, 3, groups=32)
    text = Conv2dNCHWc().apply(func, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(16))" in text


def test_legalized_and_scheduled_grouped():
    """Two groups of 2 blocks in, 3 out: the register tile's channel blocks stay in one
    group (its input block range read at the group's offset)."""
    def build(bb, x, w, bias):
        y = relax.op.nn.conv2d(x, w, padding=1, groups=2, data_layout="NCHW16c",
                               kernel_layout="OIHW16i16o")
        return bb.emit(relax.op.nn.relu(relax.op.add(bb.emit(y), bias)))
    func = fused_primfunc(build, [(1, 4, 14, 14, 16), (6, 2, 3, 3, 16, 16), (1, 6, 1, 1, 16)],
                          "conv2d")
    sch = Conv2dNCHWc().apply(func, TARGET)
    text = sch.mod["main"].script()
    assert "group_conv2d_NCHWc" in text and "T.parallel" in text
    assert "T.vectorized(T.int64(16))" in text
    ft = sch.get(sch.get_loops(sch.get_sblock("group_conv2d_NCHWc_update"))[-4]).extent
    assert 3 % int(ft) == 0  # a divisor of the 3 output blocks of one group


@pytest.mark.parametrize("groups,fblocks", [(2, 4), (4, 4)])
def test_grouped_one_input_block_per_group(groups, fblocks):
    """One input block per group (TVM folds ``* 1``: the index is ``f // fpg + co``), and
    with as many groups as output blocks also ``// 1`` (``f + co``): still the grouped
    kernel (AVX-512's 16-lane blocks on groups of 16 channels)."""
    def build(bb, x, w, bias):
        y = relax.op.nn.conv2d(x, w, padding=1, groups=groups, data_layout="NCHW16c",
                               kernel_layout="OIHW16i16o")
        return bb.emit(relax.op.nn.relu(relax.op.add(bb.emit(y), bias)))
    func = fused_primfunc(build, [(1, groups, 10, 10, 16), (fblocks, 1, 3, 3, 16, 16),
                                  (1, fblocks, 1, 1, 16)], "conv2d")
    sch = Conv2dNCHWc().apply(func, TARGET)
    assert sch is not None and "group_conv2d_NCHWc" in sch.mod["main"].script()


def test_narrow_groups_stay_nchw():
    """Groups of 4 channels (ResNeXt-50's 32 x 4d) are not whole blocks: the conv stays NCHW
    (pack_conv_weights' kernel) and still matches onnxruntime."""
    import compiler
    import onnxruntime as ort
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((32, 4, 3, 3)) * 0.2).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4,
                              group=8)]
    model = onnx_model(nodes, [("x", (1, 32, 9, 9))], [("y", (1, 32, 9, 9))], {"w": w})
    cm = compiler.compile(model, target="host")
    assert "cpu.conv2d_nchwc" not in cm.report["schedules"]
    x = rng.standard_normal((1, 32, 9, 9)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)


def test_rejects_nchw_conv():
    conv = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1)),
                          [(1, 16, 8, 8), (16, 16, 3, 3)], "conv2d")
    assert Conv2dNCHWc().apply(conv, TARGET) is None


@pytest.mark.parametrize("k,stride,pad,dil,c,f,hw,group", [
    (3, 1, 1, 1, 32, 64, 13, 1),     # odd width
    (1, 1, 0, 1, 64, 32, 7, 1),      # 1x1
    (1, 2, 0, 1, 32, 64, 14, 1),     # 1x1 strided (ResNet downsampling): a subsample stage
    (1, 2, 0, 1, 48, 32, 13, 1),     # ... odd input: 7 x 7 out of 13 x 13
    (1, 3, 0, 1, 32, 48, 11, 1),     # ... stride 3
    (1, 2, 0, 1, 64, 64, 9, 2),      # ... grouped
    (1, 2, 1, 1, 32, 32, 10, 1),     # 1x1 strided and padded: no subsample
    (3, 2, 1, 1, 16, 16, 15, 1),     # 3x3 stride 2
    (3, 1, 2, 2, 16, 32, 9, 1),      # dilated
    (3, 1, 1, 1, 32, 32, 14, 32),    # depthwise
    (3, 2, 1, 1, 48, 48, 11, 48),    # depthwise strided, odd size
    (5, 1, 2, 1, 16, 16, 10, 16),    # depthwise 5x5
    (3, 1, 1, 1, 32, 64, 10, 2),     # grouped: whole channel blocks per group (RegNet)
    (3, 2, 1, 1, 48, 48, 11, 3),     # grouped, strided, odd size
    (1, 1, 0, 1, 64, 128, 7, 4),     # grouped 1x1, more outputs than inputs per group
])
def test_numerics_conv_bias_relu_residual(k, stride, pad, dil, c, f, hw, group):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((f, c // group, k, k)) * 0.2).astype("float32")
    b = rng.standard_normal(f).astype("float32")
    oh = (hw + 2 * pad - dil * (k - 1) - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k],
                              strides=[stride] * 2, pads=[pad] * 4, dilations=[dil] * 2,
                              group=group, name="conv"),
             helper.make_node("Add", ["c", "r"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    shape, out = (1, c, hw, hw), (1, f, oh, oh)
    model = onnx_model(nodes, [("x", shape), ("r", out)], [("y", out)], {"w": w, "b": b})
    feeds = {"x": rng.standard_normal(shape).astype("float32"),
             "r": rng.standard_normal(out).astype("float32")}
    check_against_ort(model, feeds, "cpu.conv2d_nchwc")


def test_numerics_avx2_block_8():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    model = onnx_model(nodes, [("x", (1, 8, 9, 9))], [("y", (1, 16, 9, 9))], {"w": w})
    import compiler
    cm = compiler.compile(model, target="x86-avx2")
    assert cm.report["layout"]["block"] == 8
    assert cm.report["schedules"].get("cpu.conv2d_nchwc") == 1
    import onnxruntime as ort
    x = rng.standard_normal((1, 8, 9, 9)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-5)


def test_nchw_stem_pad_rows_partitioned():
    """An RGB stem's pad (a 73-pixel row: no whole vectors) runs row by row, each row's loop
    partitioned at its bounds tests (LLVM vectorises the interior copy), rows in parallel;
    it was one fused loop paying a division per dim and a test per element."""
    def build(bb, x, w):
        y = relax.op.nn.conv2d(x, w, strides=2, padding=1, data_layout="NCHW",
                               kernel_layout="OIHW16o", out_layout="NCHW16c")
        return bb.emit(relax.op.nn.relu(bb.emit(y)))
    func = fused_primfunc(build, [(1, 3, 71, 71), (2, 3, 3, 3, 16)], "conv2d")
    sch = Conv2dNCHWc().apply(func, TARGET)
    assert sch is not None
    pad = sch.get_sblock("pad_temp")
    row = sch.get(sch.get_loops(pad)[-1])
    assert int(row.extent) == 73 and "pragma_loop_partition_hint" in row.annotations
    assert any(sch.get(lp).kind == tvm.tirx.ForKind.PARALLEL for lp in sch.get_loops(pad))


@pytest.mark.parametrize("hw,stride", [(71, 2), (64, 2), (30, 1)])
def test_numerics_nchw_stem(hw, stride):
    """RGB stems (NCHW in, blocked out) against onnxruntime, pad rows of 73, 66 and 32."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((32, 3, 3, 3)) * 0.2).astype("float32")
    b = rng.standard_normal(32).astype("float32")
    oh = (hw + 2 - 3) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3],
                              strides=[stride] * 2, pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    model = onnx_model(nodes, [("x", (1, 3, hw, hw))], [("y", (1, 32, oh, oh))],
                       {"w": w, "b": b})
    check_against_ort(model, {"x": rng.standard_normal((1, 3, hw, hw)).astype("float32")},
                      "cpu.conv2d_nchwc")


def test_padded_width_choice():
    """A row with no good register tile runs over a few more columns, on a target's tile
    parameters only (none while lowering for no CPU); widths with good tiles, and narrow
    rows, stay."""
    from compiler.lowering.legalize_conv_nchwc import MIN_WIDTH, padded_width, register_tiles

    assert padded_width(71, 71, 12, 16) == 71            # no target: never
    with register_tiles(16, 20):
        assert padded_width(71, 71, 12, 16) > 71          # prime: 1-pixel tiles otherwise
        assert padded_width(73, 73, 12, 16) > 73
        assert padded_width(56, 56, 4, 16) == 56          # 4-pixel tiles already
        assert padded_width(17, 17, 12, 16) == 17 < MIN_WIDTH
    with register_tiles(8, 12):                           # AVX2: 8 lanes, 12 accumulators
        assert padded_width(71, 71, 12, 16) > 71


def _prime_width_func(k=3, pad=0, c=32, f=64, h=73, groups=1):
    from compiler.lowering.legalize_conv_nchwc import register_tiles

    def build(bb, x, w, bias):
        y = relax.op.nn.conv2d(x, w, padding=pad, groups=groups, data_layout="NCHW16c",
                               kernel_layout="OIHW16i16o")
        return bb.emit(relax.op.nn.relu(relax.op.add(bb.emit(y), bias)))
    with register_tiles(16, 20):
        return fused_primfunc(build, [(1, c // 16, h, h, 16),
                                      (f // 16, c // 16 // groups, k, k, 16, 16),
                                      (1, f // 16, 1, 1, 16)], "conv2d")


@pytest.mark.parametrize("k,pad", [(3, 0), (1, 0), (3, 1)])
def test_prime_width_computed_over_padded_columns(k, pad):
    """The conv runs over more columns than the output has (a ``conv_columns`` stage drops
    them); the extra columns read in bounds: a wider padding stage, or without one the
    column index clamped.  The rule folds the drop into its register tile's write-back."""
    func = _prime_width_func(k, pad)
    text = func.script()
    assert 'T.sblock("conv_columns")' in text
    assert ("T.min(" in text) == (pad == 0)
    out = Conv2dNCHWc().apply(func, TARGET).mod["main"].script()
    assert 'T.sblock("conv_columns")' not in out and 'T.sblock("T_relu")' not in out
    assert "T.parallel" in out and "T.vectorized(T.int64(16))" in out
    assert "conv2d_NCHWc_local" in out or "conv2d_NCHWc_global" in out  # a register / row tile


def test_good_widths_are_not_padded():
    assert 'T.sblock("conv_columns")' not in _prime_width_func(h=58).script()  # 56 out


@pytest.mark.parametrize("k,pad,c,f,hw,group", [
    (3, 0, 32, 48, 73, 1),     # Inception-v3's Conv2d_4a at 73 x 73: padding stage widened
    (1, 0, 32, 48, 73, 1),     # its 1x1 before it: clamped columns
    (3, 1, 32, 64, 71, 2),     # grouped
    (3, 1, 32, 32, 37, 1),     # padded 3x3
])
def test_numerics_padded_columns(k, pad, c, f, hw, group):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((f, c // group, k, k)) * 0.2).astype("float32")
    b = rng.standard_normal(f).astype("float32")
    oh = hw + 2 * pad - k + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k],
                              pads=[pad] * 4, group=group, name="conv"),
             helper.make_node("Relu", ["c"], ["y"])]
    shape, out = (1, c, hw, hw), (1, f, oh, oh)
    model = onnx_model(nodes, [("x", shape)], [("y", out)], {"w": w, "b": b})
    feeds = {"x": rng.standard_normal(shape).astype("float32")}
    check_against_ort(model, feeds, "cpu.conv2d_nchwc")
