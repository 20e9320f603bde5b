"""cpu.conv2d_int8: the packed integer NCHW[b]c conv (passes/pack_int_conv.py): structure under
AVX2 / AVX-512 / aarch64 targets (tensorized vpmaddwd, parallel, vectorised, epilogue in the
write-back), exact results on the host, vpdpwssd on VNNI, and kernels it must not take."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
import tvm
from tvm import te

from passes.pack_int_conv import (conv2d_int_packed, conv2d_u8s8_packed, pack_conv_int,
                                   pack_conv_quads)
from schedules.cpu.conv2d_int8 import Conv2dInt8
from schedules.cpu.conv2d_nchwc import Conv2dNCHWc

AVX2 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3",
                          "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                            "mcpu": "sapphirerapids", "num-cores": 4})
ZEN5 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5",
                          "num-cores": 2})
ARM = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72",
                         "num-cores": 4, "mattr": ["+neon"]})


def weights(c, f, k, b, blocked=True, seed=0):
    """A random int weight OIHW [f, c, k, k] in [-100, 100), and its blocked form."""
    w = np.random.default_rng(seed).integers(-100, 100, (f, c, k, k))
    if blocked:
        wb = w.reshape(f // b, b, c // b, b, k, k).transpose(0, 2, 4, 5, 3, 1)
    else:
        wb = w.reshape(f // b, b, c, k, k).transpose(0, 2, 3, 4, 1)
    return w, pack_conv_int(wb, blocked)


def kernel(c, f, hw, k, b, stride=1, pad=0, blocked=True, a_dtype="uint8"):
    """The packed integer conv with a dequantising epilogue (cast, scale) as one PrimFunc."""
    w, wp = weights(c, f, k, b, blocked)
    shape = (1, c // b, hw, hw, b) if blocked else (1, c, hw, hw)
    a = te.placeholder(shape, a_dtype, "a")
    za = te.placeholder((), "int16", "za")
    wpt = te.placeholder(wp.shape, str(wp.dtype), "wp")
    s = te.placeholder((), "float32", "s")
    acc = conv2d_int_packed(a, za, wpt, (stride, stride), (pad,) * 4, (1, 1), c)
    y = te.compute(acc.shape, lambda *i: acc[i].astype("float32") * s(), name="deq")
    return te.create_prim_func([a, za, wpt, s, y]).with_attr("global_symbol", "k"), w, wp


def test_structure_avx2_tensorized_parallel_epilogue_in_write_back():
    f, _, _ = kernel(64, 64, 14, 3, 8, pad=1)
    text = Conv2dInt8().apply(f, AVX2).mod["main"].script()
    assert "llvm.x86.avx2.pmadd.wd" in text and "int16x16" in text
    assert "T.parallel" in text and "T.vectorized" in text
    assert "_local" in text and 'T.Cast("float32"' in text  # dequantised in the write-back
    assert "conv_int_a16" in text  # widened + padded activation: a stage of its own


def test_structure_avx512_uses_zmm_pmaddwd():
    f, _, _ = kernel(32, 48, 7, 1, 16, stride=2)
    text = Conv2dInt8().apply(f, AVX512).mod["main"].script()
    assert "llvm.x86.avx512.pmaddw.d.512" in text and "int16x32" in text


def test_structure_stem_reads_nchw():
    f, _, _ = kernel(3, 16, 20, 7, 8, stride=2, pad=3, blocked=False)
    text = Conv2dInt8().apply(f, AVX2).mod["main"].script()
    assert "llvm.x86.avx2.pmadd.wd" in text and "T.parallel" in text


def test_structure_aarch64_plain_vectors():
    f, _, _ = kernel(16, 16, 6, 3, 4, pad=1)
    text = Conv2dInt8().apply(f, ARM).mod["main"].script()
    assert "llvm.x86" not in text and "T.vectorized" in text and "T.parallel" in text


def test_float_conv_not_taken_and_int_conv_not_taken_by_float_rule():
    x = te.placeholder((1, 2, 6, 6, 8), "float32", "x")
    w = te.placeholder((2, 2, 3, 3, 8, 8), "float32", "w")
    from compiler.lowering.legalize_conv_nchwc import conv2d_nchwc

    y = conv2d_nchwc(x, w, (1, 1), (1, 1, 1, 1), (1, 1), False)
    assert Conv2dInt8().apply(te.create_prim_func([x, w, y]), AVX2) is None
    f, _, _ = kernel(16, 16, 6, 3, 8, pad=1)
    assert Conv2dNCHWc().apply(f, AVX2) is None


def _reference(a, za, w, stride, pad, blocked, b):
    """Exact int64 conv of NCHW[b]c (or NCHW) ``a`` minus ``za`` (0 in the padding)."""
    if blocked:
        a = a.transpose(0, 1, 4, 2, 3).reshape(1, -1, a.shape[2], a.shape[3])
    x = np.pad(a.astype(np.int64) - za, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    f, c, k, _ = w.shape
    oh = (x.shape[2] - k) // stride + 1
    out = np.zeros((1, f, oh, oh), np.int64)
    for ry in range(k):
        for rx in range(k):
            patch = x[:, :, ry:ry + stride * oh:stride, rx:rx + stride * oh:stride]
            out += np.einsum("nchw,fc->nfhw", patch, w[:, :, ry, rx].astype(np.int64))
    return out.reshape(1, f // b, b, oh, oh).transpose(0, 1, 3, 4, 2)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 assembly")
# channel counts in blocks of the host's lanes (8 on AVX2, 16 on AVX-512), so every host
# gets whole blocks; the stem's input is 3 plain channels
@pytest.mark.parametrize("cb,fb,hw,k,stride,pad,blocked,a_dtype", [
    (2, 3, 9, 3, 1, 1, True, "uint8"),     # odd size, 3 channel blocks out
    (2, 2, 11, 1, 2, 0, True, "int8"),     # 1x1 stride 2, s8 activations
    (None, 2, 12, 7, 2, 3, False, "uint8"),  # RGB stem: odd C
])
def test_host_assembly_has_vpmaddwd_and_result_is_exact(cb, fb, hw, k, stride, pad, blocked,
                                                        a_dtype):
    import targets

    target = tvm.target.Target(targets.resolve("host").tvm)
    if targets.cpu_facts(target)["int16_dot"] is None:
        pytest.skip("host has no AVX2")
    b = targets.cpu_facts(target)["lanes"]
    c, f = (3 if cb is None else cb * b), fb * b
    fn, w, wp = kernel(c, f, hw, k, b, stride, pad, blocked, a_dtype)
    lib = tvm.compile(Conv2dInt8().apply(fn, target).mod, target=target)
    assert re.search(r"vpmaddwd|vpdpwssd", lib.mod.inspect_source("asm"))
    rng = np.random.default_rng(1)
    info = np.iinfo(a_dtype)
    shape = (1, c // b, hw, hw, b) if blocked else (1, c, hw, hw)
    a = rng.integers(info.min, info.max + 1, shape).astype(a_dtype)
    za = np.array(info.max // 2 - 3, np.int16)
    ref = _reference(a, int(za), w, stride, pad, blocked, b)
    out = tvm.runtime.tensor(np.zeros(ref.shape, np.float32))
    lib["k"](*[tvm.runtime.tensor(v) for v in (a, za, wp, np.array(0.5, np.float32))], out)
    np.testing.assert_array_equal(out.numpy(), ref.astype(np.float32) * 0.5)


def test_avx512_vnni_target_gets_vpdpwssd():
    # assembly only: nothing runs, so any host checks it
    f, _, _ = kernel(32, 32, 7, 3, 16, pad=1)
    asm = tvm.compile(Conv2dInt8().apply(f, ZEN5).mod, target=ZEN5).mod.inspect_source("asm")
    assert "vpdpwssd" in asm


def quad_kernel(c, f, hw, k, b, stride=1, pad=0, blocked=True, za=77, lo=-64, hi=65,
                a_dtype="uint8", shift=0):
    """The 8-bit x s8 conv by fours (pack_int_conv's form on int8-dot targets, the
    activation shifted by ``shift`` into the dot's type), zero point ``za`` corrected after
    the sum, with a dequantising epilogue, as one PrimFunc."""
    w = np.random.default_rng(0).integers(lo, hi, (f, c, k, k))
    if blocked:
        wb = w.reshape(f // b, b, c // b, b, k, k).transpose(0, 2, 4, 5, 3, 1)
    else:
        wb = w.reshape(f // b, b, c, k, k).transpose(0, 2, 3, 4, 1)
    wq = pack_conv_quads(wb, blocked)
    corr = ((za - shift) * wq.astype(np.int64).sum(axis=(1, 2, 3, 4, 6))).astype(np.int32)
    shape = (1, c // b, hw, hw, b) if blocked else (1, c, hw, hw)
    a = te.placeholder(shape, a_dtype, "a")
    wqt = te.placeholder(wq.shape, "int8", "wq")
    ct = te.placeholder(corr.shape, "int32", "corr")
    s = te.placeholder((), "float32", "s")
    acc = conv2d_u8s8_packed(a, za, wqt, ct, (stride, stride), (pad,) * 4, (1, 1), c,
                             shift=shift)
    y = te.compute(acc.shape, lambda *i: acc[i].astype("float32") * s(), name="deq")
    fn = te.create_prim_func([a, wqt, ct, s, y]).with_attr("global_symbol", "k")
    return fn, w, wq, corr


@pytest.mark.parametrize("cpu,want,absent", [
    ("znver3", "vpmaddubsw", "vpdpbusd"), ("skylake-avx512", "vpmaddubsw", "vpdpbusd"),
    ("alderlake", "vpdpbusd", "vpmaddubsw"), ("arrowlake", "vpdpbusd", "vpmaddubsw"),
    ("znver5", "vpdpbusd", "vpmaddubsw"), ("sapphirerapids", "vpdpbusd", "vpmaddubsw")])
def test_u8s8_assembly_per_cpu(cpu, want, absent):
    # compiled only (nothing runs), so any host checks every CPU; b = the CPU's fp32 lanes
    import targets

    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu,
                                "num-cores": 2})
    b = targets.cpu_facts(target)["lanes"]
    f, *_ = quad_kernel(2 * b, 2 * b, 9, 3, b, pad=1)
    sch = Conv2dInt8().apply(f, target)
    assert "conv_int_a8" in sch.mod["main"].script()
    asm = tvm.compile(sch.mod, target=target).mod.inspect_source("asm")
    assert want in asm and absent not in asm
    if want == "vpmaddubsw":
        assert "vpmaddwd" in asm  # the i16 pair sums added by ones


@pytest.mark.parametrize("mattr,a_dtype,shift,za,want,absent", [
    (("+dotprod",), "uint8", 128, 77, "sdot", "usdot"),          # u8 flipped into s8
    (("+dotprod", "+i8mm"), "uint8", 0, 77, "usdot", "\tsdot"),
    (("+dotprod", "+i8mm"), "int8", -128, -51, "usdot", "\tsdot"),  # s8 flipped into u8
    ((), "uint8", 0, 77, "mul", "sdot")])                             # plain NEON
def test_aarch64_dot_assembly(mattr, a_dtype, shift, za, want, absent):
    # compiled only (tests/targets/test_arm.py runs them under qemu); NCHW4c blocks
    target = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                "mcpu": "generic", "num-cores": 4,
                                "mattr": ["+neon", *mattr]})
    f, *_ = quad_kernel(8, 8, 9, 3, 4, pad=1, za=za, a_dtype=a_dtype, shift=shift)
    asm = tvm.compile(Conv2dInt8().apply(f, target).mod, target=target).mod.inspect_source("asm")
    assert re.search(want, asm) and not re.search(absent, asm)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 assembly")
@pytest.mark.parametrize("cb,fb,hw,k,stride,pad,blocked,za", [
    (2, 3, 9, 3, 1, 1, True, 77),      # 3x3, padded with the zero point
    (2, 2, 11, 1, 2, 0, True, 0),      # 1x1 stride 2, no zero point (no correction)
    (None, 2, 12, 7, 2, 3, False, 128),  # RGB stem: 3 channels padded to a four
])
def test_u8s8_host_result_is_exact_for_saturation_proof_weights(cb, fb, hw, k, stride, pad,
                                                                 blocked, za):
    import targets

    target = tvm.target.Target(targets.resolve("host").tvm)
    if targets.cpu_facts(target)["int8_dot"] is None:
        pytest.skip("host has no u8 x s8 dot")
    b = targets.cpu_facts(target)["lanes"]
    c, f = (3 if cb is None else cb * b), fb * b
    fn, w, wq, corr = quad_kernel(c, f, hw, k, b, stride, pad, blocked, za)
    lib = tvm.compile(Conv2dInt8().apply(fn, target).mod, target=target)
    shape = (1, c // b, hw, hw, b) if blocked else (1, c, hw, hw)
    a = np.random.default_rng(1).integers(0, 256, shape).astype(np.uint8)
    ref = _reference(a, za, w, stride, pad, blocked, b)
    out = tvm.runtime.tensor(np.zeros(ref.shape, np.float32))
    lib["k"](*[tvm.runtime.tensor(v) for v in (a, wq, corr, np.array(0.5, np.float32))], out)
    np.testing.assert_array_equal(out.numpy(), ref.astype(np.float32) * 0.5)


@pytest.mark.parametrize("cpu,want,absent", [
    ("sapphirerapids", "vpdpbusd", "zmm"), ("znver5", "vpdpbusd", "zmm"),
    ("skylake-avx512", "vpmaddubsw", "zmm")])
def test_u8s8_half_blocks_on_avx512_take_the_ymm_dot(cpu, want, absent):
    # convert_layout's half blocks (8 channels on 16-lane targets: EfficientNet's 40,
    # RegNet-X's 408) were refused by the rule (no 16-lane vector in a block) and stayed
    # float convs; the block is now one ymm of the same dot
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu,
                                "num-cores": 2})
    f, *_ = quad_kernel(16, 24, 9, 3, 8, pad=1)
    sch = Conv2dInt8().apply(f, target)
    assert sch is not None and "T.parallel" in sch.mod["main"].script()
    asm = tvm.compile(sch.mod, target=target).mod.inspect_source("asm")
    assert re.search(rf"{want}\s+[^\n]*ymm", asm) and not re.search(rf"{want}\s+[^\n]*{absent}", asm)


def test_int16_pairs_half_blocks_on_avx512_take_the_ymm_pmaddwd():
    f, _, _ = kernel(16, 24, 7, 3, 8, pad=1)
    text = Conv2dInt8().apply(f, AVX512).mod["main"].script()
    assert "llvm.x86.avx2.pmadd.wd" in text and "int16x16" in text


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 assembly")
def test_u8s8_half_blocks_host_result_is_exact():
    import targets

    target = tvm.target.Target(targets.resolve("host").tvm)
    lanes = targets.cpu_facts(target)["lanes"]
    if targets.cpu_facts(target)["int8_dot"] is None or lanes < 16:
        pytest.skip("no half blocks on this host (fp32 lanes < 16 or no u8 x s8 dot)")
    b, za = lanes // 2, 77
    c, f, hw = 2 * b, 3 * b, 9
    fn, w, wq, corr = quad_kernel(c, f, hw, 3, b, 1, 1, True, za)
    lib = tvm.compile(Conv2dInt8().apply(fn, target).mod, target=target)
    a = np.random.default_rng(1).integers(0, 256, (1, c // b, hw, hw, b)).astype(np.uint8)
    ref = _reference(a, za, w, 1, 1, True, b)
    out = tvm.runtime.tensor(np.zeros(ref.shape, np.float32))
    lib["k"](*[tvm.runtime.tensor(v) for v in (a, wq, corr, np.array(0.5, np.float32))], out)
    np.testing.assert_array_equal(out.numpy(), ref.astype(np.float32) * 0.5)
