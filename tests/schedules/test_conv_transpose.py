"""cpu.conv_transpose: tile choice, structure under AVX-512 and AVX2 Targets (parallel,
vectorised over the channel block, register tile, epilogue in the write-back, channels-last
input copy), negatives.  Numerics: tests/passes/test_pack_conv_transpose.py."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

from passes.pack_conv_transpose import conv_transpose_packed
from schedules.cpu import common
from schedules.cpu.conv_transpose import ConvTranspose, tile
from tests.schedules.util import fused_primfunc

AVX512 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5",
                            "num-cores": 2})
AVX2 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3",
                          "num-cores": 2})


def _phased(c, size, f, k, s, p, b):
    nd = len(size)
    taps = -(-k // s)
    out = [(i - 1) * s - 2 * p + k for i in size]

    def build(bb, x, wp, bias):
        y = bb.emit_te(conv_transpose_packed, x, wp, [s] * nd, [p] * nd, out,
                       primfunc_name_hint="conv_transpose")
        return bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
    return fused_primfunc(build, [(1, c, *size), (f // b, c, *[taps] * nd, *[s] * nd, b),
                                  (1, f, *[1] * nd)], "conv_transpose")


def test_tile_choice():
    # k2 s2: 4 inputs x 2 phases of one vector beat 1 input x 2 phases x 2 vectors
    yt, xt, vt, px = tile(128, 128, 2, 2, 4, budget=12)
    assert (yt * xt * vt <= 12 and xt % 2 == 0 and px == 0)
    # s8 on AVX2: a phase tile (several inputs x some phases), not 8 consecutive pixels
    yt, xt, vt, px = tile(1, 1600, 1, 8, 4, budget=12)
    assert px and xt // px > 1 and xt * vt <= 12
    # odd output (k5 s3 p2 on 5): sides may not be stride multiples; still a divisor
    yt, xt, vt, px = tile(13, 13, 3, 3, 2, budget=20)
    assert 13 % yt == 0 and 13 % xt == 0


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize("size,k,s,p", [((16, 16), 2, 2, 0), ((8, 8), 4, 2, 1),
                                        ((100,), 4, 2, 1), ((40,), 16, 8, 4),
                                        ((4, 8, 8), 2, 2, 0)])
def test_structure_register_tile_and_epilogue(target, size, k, s, p):
    text = ConvTranspose().apply(_phased(32, size, 64, k, s, p, 32), target).mod["main"].script()
    lanes = common.lanes_fp32(target)
    vectors = [int(v.split(")")[0]) for v in text.split("T.vectorized(T.int64(")[1:]]
    assert "T.parallel" in text and any(v % lanes == 0 for v in vectors)
    assert "_local" in text and "T.unroll" in text
    # bias + relu in the write-back, the input read channels-last
    assert 'T.sblock("T_add")' not in text and 'T.sblock("compute")' not in text
    assert ("pad_temp" in text) == (k > s or p > 0)


@pytest.mark.parametrize("k,s,p", [(8, 4, 2), (4, 2, 1)])
def test_1d_of_one_channel_block_runs_chunks_of_positions(k, s, p):
    """HiFi-GAN's 64 -> 32 upsampler (k8 s4 over 6400 samples): one channel block was one
    task, one of the two cores idle; now chunks of output positions are the tasks too."""
    text = ConvTranspose().apply(_phased(64, (640,), 32, k, s, p, 32), AVX512).mod["main"].script()
    extents = [int(v.split(")")[0]) for v in text.split("T.parallel(T.int64(")[1:]]
    # the conv's own parallel loop (after the channels-last copy's) has several tasks
    assert max(extents[1:]) >= 4


def test_register_tile_fits_avx2():
    """AVX2's 16 registers take 12 accumulators: the unrolled tile x vectors fits."""
    text = ConvTranspose().apply(_phased(32, (16, 16), 64, 2, 2, 0, 32), AVX2).mod["main"].script()
    update = text[text.index('"conv2d_transpose_phased_update"') - 600:]
    unrolled = [int(u.split(")")[0]) for u in update.split("T.unroll(T.int64(")[1:3]]
    assert unrolled[0] * unrolled[1] <= common.acc_budget(AVX2)


def test_rejects_plain_conv_and_packed_conv():
    conv = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w, padding=1)),
                          [(1, 8, 8, 8), (16, 8, 3, 3)], "conv2d")
    assert ConvTranspose().apply(conv, AVX512) is None
    tconv = fused_primfunc(
        lambda bb, x, w: bb.emit(relax.op.nn.conv2d_transpose(x, w, strides=2)),
        [(1, 8, 8, 8), (8, 16, 2, 2)], "conv2d_transpose")
    assert ConvTranspose().apply(tconv, AVX512) is None
