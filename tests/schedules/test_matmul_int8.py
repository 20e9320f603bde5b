"""cpu.matmul_int8: structure under Target objects (vpmaddwd tensorized on AVX2 / AVX-512,
plain vectors on aarch64, parallel, epilogue in the write-back), the host's assembly, and
kernels it must not take.  Numerics against onnxruntime: tests/passes/test_pack_int_matmul.py."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
import tvm
from tvm import te

from passes.pack_int_matmul import (matmul_int_packed, matmul_u8s8_packed, pack_int, pack_quads,
                                     pad_rows)
from schedules.cpu.matmul_int8 import MatmulInt8
from tests.schedules.util import fused_primfunc

AVX2 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3",
                          "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                            "mcpu": "skylake-avx512", "num-cores": 4})
ARM = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72",
                         "num-cores": 4, "mattr": ["+neon"]})


def kernel(m, k, n, a_dtype="uint8", w_dtype="int8", zp=True):
    """The packed integer matmul with a dequantising epilogue (cast, scale) as one PrimFunc."""
    w = np.random.default_rng(0).integers(-100, 100, (k, n))
    wp = pack_int(w, 16).astype(w_dtype)
    a = te.placeholder((m, k), a_dtype, "a")
    za = te.placeholder((), a_dtype, "za") if zp else None
    wpt = te.placeholder(wp.shape, w_dtype, "wp")
    s = te.placeholder((), "float32", "s")
    acc = matmul_int_packed(a, za, wpt, n)
    y = te.compute(acc.shape, lambda i, j: acc[i, j].astype("float32") * s(), name="deq")
    args = [a] + ([za] if zp else []) + [wpt, s, y]
    return te.create_prim_func(args).with_attr("global_symbol", "k"), wp


def test_structure_avx2_tensorized_parallel_epilogue_in_write_back():
    f, _ = kernel(128, 768, 768)
    text = MatmulInt8().apply(f, AVX2).mod["main"].script()
    assert "llvm.x86.avx2.pmadd.wd" in text and "int16x16" in text
    assert "T.parallel" in text and "T.vectorized" in text
    assert "_local" in text and 'T.Cast("float32"' in text  # dequantised in the write-back
    # the widened activation is its own stage (a parallel loop), not inlined into the step
    assert "matmul_int_a16" in text


def test_structure_avx512_uses_zmm_pmaddwd():
    f, _ = kernel(7, 65, 100)    # odd K, N cut in the last panel
    text = MatmulInt8().apply(f, AVX512).mod["main"].script()
    assert "llvm.x86.avx512.pmaddw.d.512" in text and "int16x32" in text


def test_structure_aarch64_plain_vectors():
    f, _ = kernel(16, 64, 32, "int8", "int16")
    text = MatmulInt8().apply(f, ARM).mod["main"].script()
    assert "llvm.x86" not in text and "T.vectorized" in text and "T.parallel" in text


def test_rejects_float_and_unpacked_matmuls():
    f = fused_primfunc(lambda bb, a, b: bb.emit(tvm.relax.op.matmul(a, b)),
                       [(8, 16), (16, 32)], "matmul")
    assert MatmulInt8().apply(f, AVX2) is None
    a = te.placeholder((8, 16), "int32", "a")
    b = te.placeholder((16, 32), "int32", "b")
    k = te.reduce_axis((0, 16), "k")
    c = te.compute((8, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    assert MatmulInt8().apply(te.create_prim_func([a, b, c]), AVX2) is None


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 assembly")
@pytest.mark.parametrize("m,k,n,a_dtype,w_dtype", [(7, 65, 100, "uint8", "int8"),
                                                   (4, 32, 48, "int8", "int16")])
def test_host_assembly_has_vpmaddwd_and_result_is_exact(m, k, n, a_dtype, w_dtype):
    import targets

    target = tvm.target.Target(targets.resolve("host").tvm)
    if targets.cpu_facts(target)["int16_dot"] is None:
        pytest.skip("host has no AVX2")
    f, wp = kernel(m, k, n, a_dtype, w_dtype)
    lib = tvm.compile(MatmulInt8().apply(f, target).mod, target=target)
    # with AVX512-VNNI and fast-dpwssd (Zen 4/5) LLVM fuses each vpmaddwd + vpaddd into
    # vpdpwssd (test_avx512_vnni_target_gets_vpdpwssd): either is the pair-wise i16 dot
    assert re.search(r"vpmaddwd|vpdpwssd", lib.mod.inspect_source("asm"))
    rng = np.random.default_rng(1)
    info = np.iinfo(a_dtype)
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(a_dtype)
    za = np.array(info.max // 2, a_dtype)
    out = tvm.runtime.tensor(np.zeros((m, n), np.float32))
    lib["k"](*[tvm.runtime.tensor(v) for v in (a, za, wp, np.array(0.5, np.float32))], out)
    w = wp.astype(np.int64).transpose(1, 3, 0, 2).reshape(-1, wp.shape[0] * 16)[:k, :n]
    exact = ((a.astype(np.int64) - int(za)) @ w).astype(np.float32) * 0.5
    np.testing.assert_array_equal(out.numpy(), exact)


def test_avx512_vnni_target_gets_vpdpwssd():
    # on AVX512-VNNI LLVM fuses the step's vpmaddwd + vpaddd into vpdpwssd (assembly only:
    # nothing runs, so any host checks it)
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                                "mcpu": "cascadelake", "num-cores": 2})
    f, _ = kernel(32, 128, 32)
    asm = tvm.compile(MatmulInt8().apply(f, target).mod, target=target).mod.inspect_source("asm")
    assert "vpdpwssd" in asm and "vpmaddwd" not in asm


def quad_kernel(m, k, n, lo=-100, hi=100, a_dtype="uint8", shift=0):
    """The 8-bit x s8 matmul by fours (pack_int_matmul's form on int8-dot targets, the
    activation shifted by ``shift`` into the dot's type) with its zero-point correction and
    a dequantising epilogue, as one PrimFunc."""
    w = np.random.default_rng(0).integers(lo, hi, (k, n))
    wq = pack_quads(w, 16)
    a = te.placeholder((m, k), a_dtype, "a")
    za = te.placeholder((), a_dtype, "za")
    wqt = te.placeholder(wq.shape, "int8", "wq")
    cs = te.placeholder((n,), "int32", "cs")
    s = te.placeholder((), "float32", "s")
    acc = matmul_u8s8_packed(a, za, wqt, cs, n, pad_rows(m), shift)
    y = te.compute(acc.shape, lambda i, j: acc[i, j].astype("float32") * s(), name="deq")
    return te.create_prim_func([a, za, wqt, cs, s, y]).with_attr("global_symbol", "k"), w, wq


# (LLVM CPU, the u8 x s8 step in its assembly, what must not be there)
QUAD_CPUS = [("znver3", "vpmaddubsw", "vpdpbusd"),            # AVX2: onnxruntime's step
             ("skylake-avx512", "vpmaddubsw", "vpdpbusd"),    # AVX-512BW without VNNI
             ("alderlake", "vpdpbusd", "vpmaddubsw"),         # AVX-VNNI (ymm)
             ("arrowlake", "vpdpbusd", "vpmaddubsw"),
             ("znver5", "vpdpbusd", "vpmaddubsw"),            # AVX512-VNNI (zmm)
             ("sapphirerapids", "vpdpbusd", "vpmaddubsw")]


@pytest.mark.parametrize("cpu,want,absent", QUAD_CPUS)
def test_u8s8_assembly_per_cpu(cpu, want, absent):
    # compiled only (nothing runs), so any host checks every CPU
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu,
                                "num-cores": 2})
    f, _, _ = quad_kernel(24, 256, 64)
    sch = MatmulInt8().apply(f, target)
    asm = tvm.compile(sch.mod, target=target).mod.inspect_source("asm")
    assert want in asm and absent not in asm
    zmm = "zmm" in " ".join(ln for ln in asm.splitlines() if want in ln)
    assert zmm == (cpu in ("skylake-avx512", "znver5", "sapphirerapids"))


def test_u8s8_structure_aarch64_plain_vectors():
    f, _, _ = quad_kernel(16, 64, 32)
    text = MatmulInt8().apply(f, ARM).mod["main"].script()
    assert "llvm.x86" not in text and "T.vectorized" in text and "matmul_int_a8" in text


def test_s8_activation_shifted_into_vpdpbusd():
    """s8 activations reach the u8 dot with their sign bit flipped (``a + 128``)."""
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                                "mcpu": "znver5", "num-cores": 2})
    f, _, _ = quad_kernel(24, 256, 64, a_dtype="int8", shift=-128)
    asm = tvm.compile(MatmulInt8().apply(f, target).mod, target=target).mod.inspect_source("asm")
    assert "vpdpbusd" in asm


def arm_target(*mattr):
    return tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                              "mcpu": "generic", "num-cores": 4, "mattr": ["+neon", *mattr]})


# (aarch64 features, activation, shift into the dot's type, the step, what must not be there)
ARM_DOTS = [(("+dotprod",), "uint8", 128, "sdot", "usdot"),     # u8 flipped into s8
            (("+dotprod",), "int8", 0, "sdot", "usdot"),
            (("+dotprod", "+i8mm"), "uint8", 0, "usdot", "\tsdot"),
            (("+dotprod", "+i8mm"), "int8", -128, "usdot", "\tsdot"),
            ((), "uint8", 0, "mul", "sdot")]                     # plain NEON: no dot


@pytest.mark.parametrize("mattr,a_dtype,shift,want,absent", ARM_DOTS)
def test_aarch64_dot_assembly(mattr, a_dtype, shift, want, absent):
    # compiled only (nothing runs: tests/targets/test_arm.py runs them under qemu)
    target = arm_target(*mattr)
    f, _, _ = quad_kernel(24, 256, 64, a_dtype=a_dtype, shift=shift)
    asm = tvm.compile(MatmulInt8().apply(f, target).mod, target=target).mod.inspect_source("asm")
    assert re.search(want, asm) and not re.search(absent, asm)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 assembly")
@pytest.mark.parametrize("m,k,n,lo,hi", [(7, 65, 100, -64, 65), (37, 130, 48, -128, 128)])
def test_u8s8_host_result(m, k, n, lo, hi):
    import targets

    from tests.passes.test_pack_int_matmul import saturating_matmul

    target = tvm.target.Target(targets.resolve("host").tvm)
    kind = targets.cpu_facts(target)["int8_dot"]
    if kind is None:
        pytest.skip("host has no u8 x s8 dot")
    f, w, wq = quad_kernel(m, k, n, lo, hi)
    lib = tvm.compile(MatmulInt8().apply(f, target).mod, target=target)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    za = np.array(91, np.uint8)
    cs = w.sum(axis=0).astype(np.int32)
    out = tvm.runtime.tensor(np.zeros((m, n), np.float32))
    lib["k"](*[tvm.runtime.tensor(v) for v in (a, za, wq, cs, np.array(0.5, np.float32))], out)
    prod = saturating_matmul(a, w) if kind in targets.INT8_DOT_SATURATES else a.astype(
        np.int64) @ w
    np.testing.assert_array_equal(out.numpy(), (prod - 91 * cs).astype(np.float32) * 0.5)
    if hi <= 65:  # |w0| + |w1| <= 128: no pair saturates, the result is exact
        exact = (a.astype(np.int64) - 91) @ w
        np.testing.assert_array_equal(out.numpy(), exact.astype(np.float32) * 0.5)
