"""cpu.conv2d_packed: tile choice, structure under a Target, numerics against onnxruntime
(through pack_conv_weights), negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from passes.pack_conv_weights import PackConvWeights, conv_packed
from schedules.cpu.conv2d_packed import Conv2dPacked, channel_chunk, tile
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def _packed(c, h, w, f, k, b, stride=1, pad=1):
    def build(bb, x, wp, bias):
        y = bb.emit_te(conv_packed, x, wp, [stride] * 2, [pad] * 4, [1, 1],
                       primfunc_name_hint="conv2d")
        return bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
    return fused_primfunc(build, [(1, c, h, w), (f // b, c, k, k, b), (1, f, 1, 1)], "conv2d")


def test_tile_choice():
    assert tile(56, 56, 2) == (1, 8, 2)    # 16 accumulators, two vectors per broadcast
    assert tile(13, 13, 2) == (1, 13, 1)   # 13 pixels x one vector beats 1 pixel x two
    yt, xt, vt = tile(111, 111, 2)
    assert 111 % yt == 0 and 111 % xt == 0 and yt * xt * vt <= 20


def test_structure_register_tile_and_epilogue():
    text = Conv2dPacked().apply(_packed(8, 14, 14, 64, 3, 32), TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(32))" in text
    assert "_local" in text and "T.unroll" in text
    assert 'T.sblock("T_add")' not in text and 'T.sblock("compute")' not in text
    # taps outside the input channels: the channel loop is the innermost reduction
    assert "for ry, rx, rc in" in text


def test_channel_chunks():
    """Input channels are chunked when a block's weights outgrow SLAB_BYTES (the chunk's
    weights stay in L1 across the pixel tiles), never for blocks that fit."""
    assert channel_chunk(512, 3, 16) == 16       # wav2vec2 conv1d: 3 KB chunks of 96 KB
    assert channel_chunk(8, 9, 32) == 0          # 9 KB: stays whole
    assert channel_chunk(48, 128, 16) == 0 or channel_chunk(48, 128, 16) == 1
    assert channel_chunk(7, 27, 64) in (0, 1)    # prime channel count: 1-channel chunks
    for c, taps, b in ((512, 3, 16), (80, 3, 32), (64, 27, 16), (144, 3, 16)):
        k = channel_chunk(c, taps, b)
        assert k == 0 or (c % k == 0 and k * taps * b * 4 <= 4096)
    # always: chunks of blocks that fit too, one chunk of all channels when they fit 4 KB
    assert channel_chunk(64, 1, 16, always=True) == 32
    assert channel_chunk(32, 1, 16, always=True) == 32
    assert channel_chunk(24, 1, 32, always=True) == 24


def test_structure_channel_chunks_accumulate_in_a_row_cache():
    """512 input channels x 3 taps x 32 lanes: chunks of channels outside the pixel tiles,
    the tile accumulating in a [pixels][channels] global cache written back once, with
    the epilogue vectorised."""
    func = _packed_nd(512, (64,), 64, 3, 32)
    text = Conv2dPacked().apply(func, TARGET).mod["main"].script()
    assert "_global" in text and "_local" not in text
    assert "rc_0" in text and "rc_1" in text
    # the chunk loop outside the pixel tiles (which take chunks of positions outside it:
    # 2 channel blocks for a 2-core target, see the next test)
    assert "for rc_0, x_0_1, f_1_0, rx, rc_1 in" in text
    assert text.count("T.vectorized") >= 3    # tile, init and write-back
    assert 'T.sblock("T_add")' not in text


def test_rejects_unpacked_conv_and_depthwise():
    conv = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1)),
                          [(1, 8, 8, 8), (16, 8, 3, 3)], "conv2d")
    assert Conv2dPacked().apply(conv, TARGET) is None
    dw = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=8)),
                        [(1, 8, 8, 8), (8, 1, 3, 3)], "conv2d")
    assert Conv2dPacked().apply(dw, TARGET) is None


@pytest.mark.parametrize("k,stride,pad,dil,shape,f", [
    (3, 1, 1, 1, (1, 8, 13, 11), 32),    # odd widths, 2-vector block
    (3, 2, 0, 1, (1, 3, 23, 23), 64),    # SqueezeNet stem, small
    (7, 2, 3, 1, (1, 3, 20, 20), 16),    # ResNet/Inception stem, small
    (3, 1, 2, 2, (1, 4, 9, 9), 24),      # dilated; ragged block (24 = 1.5 vectors)
    (3, 1, 1, 1, (1, 6, 7, 7), 40),      # 40 = 2.5 vectors
    (1, 3, 0, 1, (1, 8, 9, 9), 16),      # 1x3 kernel
    (1, 2, 0, 1, (1, 32, 14, 14), 64),   # 1x1 strided (ResNet downsampling)
])
def test_numerics_conv_bias_relu_add(k, stride, pad, dil, shape, f, monkeypatch):
    rng = np.random.default_rng(0)
    c = shape[1]
    kh, kw = (1, 3) if (k, stride) == (1, 3) else (k, k)
    stride_ = 1 if (k, stride) == (1, 3) else stride
    w = rng.standard_normal((f, c, kh, kw)).astype("float32") * 0.3
    b = rng.standard_normal((f,)).astype("float32")
    ho = (shape[2] + 2 * pad - dil * (kh - 1) - 1) // stride_ + 1
    wo = (shape[3] + 2 * pad - dil * (kw - 1) - 1) // stride_ + 1
    out = (1, f, ho, wo)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kh, kw],
                         strides=[stride_] * 2, pads=[pad] * 4, dilations=[dil] * 2,
                         name="conv"),
        helper.make_node("Add", ["c", "r"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    model = onnx_model(nodes, [("x", shape), ("r", out)], [("y", out)], {"w": w, "b": b})
    feeds = {"x": rng.standard_normal(shape).astype("float32"),
             "r": rng.standard_normal(out).astype("float32")}
    # ragged blocks (24, 40) are off by default: ask for them
    monkeypatch.setattr(PackConvWeights, "options",
                        {**PackConvWeights.options, "blocks": (32, 16, 48, 24, 40, 8)})
    check_against_ort(model, feeds, "cpu.conv2d_packed", layout="NCHW")


def test_tiles_fit_the_targets_registers():
    """AVX2 has 16 vector registers, AVX-512 and aarch64 32: a tile sized for 32 spills on 16."""
    import tvm

    from schedules.cpu import common

    avx2 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"})
    avx512 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5"})
    arm = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic"})
    assert [common.vector_registers(t) for t in (avx2, avx512, arm)] == [16, 32, 32]
    budget = common.acc_budget(avx2)
    assert budget == 12 and common.acc_budget(avx512) == 20
    yt, xt, vt = tile(56, 56, 2, budget=budget)
    assert yt * xt * vt <= 12
    assert common.reg_rows(128, 2, common.acc_budget(avx2, "matmul")) * 2 <= 12


def _packed_nd(c, size, f, k, b, stride=1, pad=1):
    nd = len(size)

    def build(bb, x, wp, bias):
        y = bb.emit_te(conv_packed, x, wp, [stride] * nd, [pad] * 2 * nd, [1] * nd,
                       primfunc_name_hint=f"conv{nd}d")
        return bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
    return fused_primfunc(build, [(1, c, *size), (f // b, c, *[k] * nd, b),
                                  (1, f, *[1] * nd)], f"conv{nd}d")


@pytest.mark.parametrize("size", [(3000,), (4, 14, 14)])
def test_structure_conv1d_conv3d(size):
    """conv1d (Whisper's stem) and conv3d get the same register tile as conv2d: parallel
    outer loops, the channel block vectorised, bias + relu in the write-back."""
    text = Conv2dPacked().apply(_packed_nd(4, size, 64, 3, 32), TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(32))" in text
    assert "_local" in text and "T.unroll" in text
    assert 'T.sblock("T_add")' not in text and 'T.sblock("compute")' not in text


def test_conv1d_of_few_channel_blocks_with_channel_chunks_runs_chunks_of_positions():
    # 64 channels x 3 taps: the block's weights are chunked (a row cache per task), and
    # the tasks are chunks of positions times blocks too (a TCN's k3 64 -> 64 dilated conv
    # over 4000 samples, two threads: 0.49 -> 0.34 ms)
    text = Conv2dPacked().apply(_packed_nd(64, (3998,), 64, 3, 32, pad=2),
                                TARGET).mod["main"].script()
    assert "rc_0" in text and "_global" in text          # channel chunks, row cache
    assert text.count("T.parallel") == 1 and "T.parallel(T.int64(4))" in text


def test_chunked_row_cache_writes_back_output_columns_in_vectors():
    """HiFi-GAN's 32 -> 32 k7 conv over 25600 samples: channel chunks (a row cache) and
    chunks of positions.  A task's chunk of columns is narrower than the output without
    being padded: the write-back must still run along the output's columns (contiguous in
    NCW), not across the channels (stores 100 KB apart; its residual add's kernel ran
    2.1x the same conv's without)."""
    text = Conv2dPacked().apply(_packed_nd(32, (25600,), 32, 7, 32, pad=3),
                                TARGET).mod["main"].script()
    assert "rc_0" in text and "T.parallel(T.int64(4))" in text   # both kinds of chunks
    wb = text[text.rindex("for "):]   # the write-back's loops come last
    tail = text[text.index('T.sblock("conv1d_packed_intermediate_global")') - 400:]
    assert "T.vectorized(T.int64(16))" in tail and "T.unroll(T.int64(2))" not in tail, wb


def test_conv1d_of_few_channel_blocks_runs_chunks_of_positions():
    """Two channel blocks on a two-core target: the parallel loop also takes chunks of
    output positions, each building its part of the padded input inside its task (the
    padding was its own parallel stage, and every block's task then read half its input
    from the other core: WaveNet's 64 -> 64 dilated conv ran 0.44 ms on one thread, 0.58 on
    two)."""
    from schedules.cpu.common import position_chunks

    assert position_chunks(2, 400, 2) == 2 and position_chunks(1, 400, 2) == 4
    assert position_chunks(4, 400, 2) == 0 and position_chunks(2, 400, 1) == 0
    assert position_chunks(2, 4001, 2) == 0 and position_chunks(1, 1, 2) == 0  # none fits
    # (k 2: a block's weights for all 64 channels fit SLAB_BYTES, no channel chunks; 4000
    # outputs: 400 tiles of 10, in 2 chunks)
    text = Conv2dPacked().apply(_packed_nd(64, (3999,), 64, 2, 32, pad=1),
                                TARGET).mod["main"].script()
    assert 'T.sblock("pad_temp' in text  # padded (1 + 3999 + 1), built in the tasks
    assert text.count("T.parallel") == 1  # the padding is built inside the tasks
    assert "T.parallel(T.int64(4))" in text


@pytest.mark.parametrize("size,k,stride,pad,dil,f", [
    ((301,), 3, 1, 1, 1, 32),         # Whisper stem (short): odd length
    ((301,), 3, 2, 1, 1, 16),         # Whisper's second conv: stride 2
    ((160,), 10, 5, 0, 1, 32),        # wav2vec2 feature extractor's first conv
    ((101,), 2, 1, 0, 4, 16),         # dilated (WaveNet)
    ((1000,), 2, 1, 2, 4, 64),        # dilated, padded, 2 channel blocks: position chunks
    ((997,), 3, 1, 1, 1, 32),         # a prime length: no position chunks (one tile size)
    ((5, 9, 9), 3, 1, 1, 1, 16),      # video conv3d
    ((4, 7, 6), 3, 2, 1, 1, 32),      # strided conv3d, odd sizes
])
def test_numerics_conv1d_conv3d(size, k, stride, pad, dil, f):
    rng = np.random.default_rng(1)
    nd, c = len(size), 5
    shape = (1, c, *size)
    w = rng.standard_normal((f, c, *[k] * nd)).astype("float32") * 0.3
    b = rng.standard_normal((f,)).astype("float32")
    out = (1, f, *[(s + 2 * pad - dil * (k - 1) - 1) // stride + 1 for s in size])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k] * nd,
                              strides=[stride] * nd, pads=[pad] * 2 * nd,
                              dilations=[dil] * nd, name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = onnx_model(nodes, [("x", shape)], [("y", out)], {"w": w, "b": b})
    check_against_ort(model, {"x": rng.standard_normal(shape).astype("float32")},
                      "cpu.conv2d_packed")


@pytest.mark.parametrize("size,groups,cin,f,k", [
    ((49,), 4, 64, 64, 9),            # wav2vec2's positional conv, small: 16 channels a group
    ((11, 13), 2, 8, 64, 3),          # 32 output channels a group
])
def test_numerics_grouped(size, groups, cin, f, k):
    rng = np.random.default_rng(2)
    nd = len(size)
    w = rng.standard_normal((f, cin // groups, *[k] * nd)).astype("float32") * 0.3
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[k] * nd,
                            pads=[k // 2] * 2 * nd, group=groups, name="conv")
    model = onnx_model([node], [("x", (1, cin, *size))], [("y", (1, f, *size))], {"w": w})
    check_against_ort(model, {"x": rng.standard_normal((1, cin, *size)).astype("float32")},
                      "cpu.conv2d_packed", layout="NCHW")


def test_grouped_structure_reads_the_groups_channels():
    def build(bb, x, wp):
        return bb.emit_te(conv_packed, x, wp, [1, 1], [1] * 4, [1, 1], 2,
                          primfunc_name_hint="conv2d")
    func = fused_primfunc(build, [(1, 16, 8, 8), (4, 8, 3, 3, 16)], "conv2d")
    text = Conv2dPacked().apply(func, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(16))" in text


@pytest.mark.parametrize("size,cin,f,k,stride,pad", [
    ((203,), 96, 32, 3, 2, 0),        # chunked channels, width 101: padded to whole tiles
    ((120,), 96, 32, 3, 1, 1),        # chunked, width divides the tile
    ((61,), 48, 16, 10, 5, 0),        # wav2vec2's first conv shape class, 11 outputs
    ((3, 9, 10), 48, 32, 3, 1, 1),    # conv3d with chunks and rows inside channel blocks
    ((13, 11), 64, 32, 3, 1, 1),      # conv2d with chunks (NCHW: not NCHWc's)
    ((32, 32), 256, 32, 1, 1, 0),     # 1x1, planes 4 KB apart: chunks copied contiguous
    ((30, 30), 64, 32, 3, 1, 1),      # 3x3 whose padded planes (32x32) are 4 KB apart
    ((16, 48), 128, 48, 1, 1, 0),     # 3 KB planes (no copy), a 48-channel block
    ((32, 32), 64, 64, 1, 1, 0),      # weights fit L1, 4 KB planes: chunked for the copy
    ((32, 64), 24, 48, 1, 1, 0),      # ... one chunk of all 24 channels, a 48-channel block
    ((32, 32), 8, 32, 1, 1, 0),       # 8 aliasing planes fit L1's ways: read in place
])
def test_numerics_chunked_and_padded(size, cin, f, k, stride, pad):
    """Channel chunks (global row cache) and output widths padded to whole register tiles
    (1-D) against onnxruntime, with a GELU epilogue (erf form) on the write-back."""
    rng = np.random.default_rng(3)
    nd = len(size)
    shape = (1, cin, *size)
    w = rng.standard_normal((f, cin, *[k] * nd)).astype("float32") * 0.1
    out = (1, f, *[(s + 2 * pad - (k - 1) - 1) // stride + 1 for s in size])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k] * nd,
                              strides=[stride] * nd, pads=[pad] * 2 * nd, name="conv"),
             helper.make_node("Div", ["c", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["c", "a"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "half"], ["y"], name="mul2")]
    model = onnx_model(nodes, [("x", shape)], [("y", out)],
                       {"w": w, "sqrt2": np.float32(2 ** 0.5), "one": np.float32(1),
                        "half": np.float32(0.5)})
    check_against_ort(model, {"x": rng.standard_normal(shape).astype("float32")},
                      "cpu.conv2d_packed", layout="NCHW")


def test_structure_aliasing_planes_are_copied_per_chunk():
    """Channel planes a multiple of ALIAS_BYTES apart (64x64 fp32: 16 KB) are copied into a
    contiguous buffer per channel chunk; planes of 14x14 (784 B) are read in place."""
    from schedules.cpu.conv2d_packed import ALIAS_BYTES
    assert (64 * 64 * 4) % ALIAS_BYTES == 0 and (14 * 14 * 4) % ALIAS_BYTES
    text = Conv2dPacked().apply(_packed(256, 64, 64, 32, 1, 32, pad=0),
                                TARGET).mod["main"].script()
    assert "_global" in text and text.count("alloc_buffer") >= 2  # row cache + input copy
    plain = Conv2dPacked().apply(_packed(256, 14, 14, 32, 1, 32, pad=0),
                                 TARGET).mod["main"].script()
    assert plain.count("alloc_buffer") == text.count("alloc_buffer") - 1


@pytest.mark.parametrize("c,h,w,copied", [
    (64, 64, 64, True),    # MobileViT-S's 64 -> 256 1x1 at 64 x 64: weights fit L1
    (32, 128, 128, True),  # 32 -> 128 at 128 x 128: one chunk of all channels
    (64, 56, 56, False),   # 12.25 KB planes: no aliasing, no chunks
    (8, 64, 64, False),    # 8 planes: fit one L1 set's ways
])
def test_aliasing_planes_copied_even_when_weights_fit(c, h, w, copied):
    """A block whose weights fit L1 is not chunked, unless a tile reads more channel planes
    that share L1 sets (a multiple of ALIAS_BYTES apart) than L1_WAYS: then chunks, each
    copied contiguous (the input copy is a third buffer next to the row cache)."""
    assert channel_chunk(c, 1, 16) == 0  # 1x1 weights of a 16-channel block fit L1
    text = Conv2dPacked().apply(_packed(c, h, w, 64, 1, 16, pad=0), TARGET).mod["main"].script()
    assert ("_global" in text) == copied
    assert text.count("alloc_buffer") == (2 if copied else 1)
    assert "T.parallel" in text and "T.vectorized(T.int64(16))" in text


# --- conv1d over a symbolic length (sequence models exported with a dynamic axis) ----------


def _conv1d_model(cin, f, k, stride, pad, groups):
    import onnx
    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(cin + f + k)
    w = (rng.standard_normal((f, cin // groups, k)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad, pad],
                              strides=[stride], group=groups),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(
        nodes, "conv1d_symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", cin, "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(rng.standard_normal(f).astype(np.float32), "b")])
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cin,f,k,stride,pad,groups", [
    (64, 64, 1, 1, 0, 4),     # SqueezeBERT's grouped pointwise conv
    (1, 32, 10, 5, 0, 1),     # wav2vec2's first feature-encoder conv, over raw samples
    (48, 60, 3, 2, 1, 1),     # strided, padded, channels padded to a block (60 -> 64)
])
def test_conv1d_over_a_symbolic_length_keeps_the_packed_rule(cin, f, k, stride, pad, groups,
                                                             tmp_path):
    """A symbolic length (and batch) packs the weights and takes cpu.conv2d_packed over
    whole register tiles of columns (it fell to the fallback: 24-65x onnxruntime's time),
    one artifact matching onnxruntime at lengths that are and are not whole tiles."""
    import compiler
    import runtime
    from tests.conftest import ort_run

    model = _conv1d_model(cin, f, k, stride, pad, groups)
    cm = compiler.compile(model, dims={"seq": (16, 4000, 400), "batch": (1, 2, 1)})
    rules = {kt["kernel"]: kt["rule"] for kt in cm.report["kernel_table"]}
    assert [r for n, r in rules.items() if "conv" in n] == ["cpu.conv2d_packed"], rules
    cm.export(str(tmp_path / "m.so"))
    sess = runtime.load(str(tmp_path / "m.so"))
    for batch, seq in ((1, 400), (1, 16), (2, 37), (1, 4000)):
        x = np.random.default_rng(seq).standard_normal((batch, cin, seq)).astype(np.float32)
        got, want = sess.run(None, {"x": x})[0], ort_run(model, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv1d_symbolic_structure():
    """The symbolic kernel: a register tile of whole columns (static, in registers),
    parallel tasks, the channel block vectorised in the init, the FMAs and the write-back
    with its epilogue (a scalar write-back ran SqueezeBERT's GELU 2.5x slower)."""
    from tvm import tirx

    seq = tirx.Var("seq", "int64")

    def build(bb, x, wp, bias):
        y = bb.emit_te(conv_packed, x, wp, [1], [1, 1], [1], 1, 6,
                       primfunc_name_hint="conv1d")
        return bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))

    func = fused_primfunc(build, [(1, 32, seq), (2, 32, 3, 16), (1, 32, 1)], "conv1d")
    text = Conv2dPacked().apply(func, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(16))" in text
    assert "_local" in text and "T.unroll(T.int64(6))" in text
    assert text.count("T.vectorized(T.int64(16))") == 3, text
