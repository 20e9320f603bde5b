"""cpu.matmul_bf16: structure under Target objects (vdpbf16ps through the LLVM IR shim on
AVX512-BF16, plain fp32 vectors elsewhere), the assembly of every bf16 preset (compiled,
never run: any host checks it), the result on this host where it can run (the native
kernel only on an avx512bf16 host; the emulated one anywhere), kernels it must not take.
Model-level numerics: tests/passes/test_pack_bf16_matmul.py."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import tvm
from tvm import te

import targets
from passes.pack_bf16_matmul import from_bf16, matmul_bf16, pack_bf16, to_bf16
from runtime.cpu_features import missing_features
from schedules.cpu.matmul_bf16 import MatmulBf16
from tests.schedules.util import fused_primfunc


def _target(mcpu):
    return tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu,
                              "num-cores": 2})


ZEN5, SPR, ZEN3 = _target("znver5"), _target("sapphirerapids"), _target("znver3")


def kernel(m, k, n, rows=1, seed=0):
    """matmul_bf16 + a bias epilogue as one PrimFunc; (func, W, packed W)."""
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    wp = pack_bf16(w, 32)
    x = te.placeholder((m, k), "float32", "x")
    wpt = te.placeholder(wp.shape, "uint16", "wp")
    b = te.placeholder((n,), "float32", "b")
    acc = matmul_bf16(x, wpt, n, rows)
    y = te.compute(acc.shape, lambda i, j: acc[i, j] + b[j], name="bias")
    return te.create_prim_func([x, wpt, b, y]).with_attr("global_symbol", "k"), w, wp


def test_structure_avx512_bf16_tensorized_with_the_shim():
    f, _, _ = kernel(24, 64, 64)
    text = MatmulBf16().apply(f, ZEN5).mod["main"].script()
    assert "onnxc_dpbf16ps_512" in text and "pragma_import_llvm" in text
    assert "T.parallel" in text and "matmul_bf16_a" in text  # the rounding: its own stage


def test_structure_avx2_plain_vectors():
    f, _, _ = kernel(7, 65, 100, rows=3)
    text = MatmulBf16().apply(f, ZEN3).mod["main"].script()
    assert "onnxc_dpbf16ps" not in text and "T.vectorized" in text


@pytest.mark.parametrize("target", [ZEN5, SPR], ids=["znver5", "sapphirerapids"])
def test_bf16_presets_assembly_has_vdpbf16ps_and_no_call(target):
    f, _, _ = kernel(24, 64, 64)
    asm = tvm.compile(MatmulBf16().apply(f, target).mod, target=target).mod.inspect_source("asm")
    assert asm.count("vdpbf16ps") >= 4 and "onnxc_dpbf16ps" not in asm  # inlined


def test_rejects_fp32_and_int_matmuls():
    f = fused_primfunc(lambda bb, a, b: bb.emit(tvm.relax.op.matmul(a, b)),
                       [(8, 16), (16, 32)], "matmul")
    assert MatmulBf16().apply(f, ZEN5) is None


def _run(target, m, k, n, rows):
    f, w, wp = kernel(m, k, n, rows)
    lib = tvm.compile(MatmulBf16().apply(f, target).mod, target=target)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((m, n), np.float32))
    lib["k"](tvm.runtime.tensor(x), tvm.runtime.tensor(wp), tvm.runtime.tensor(b), out)
    exact = (from_bf16(to_bf16(x)).astype(np.float64) @ from_bf16(to_bf16(w)).astype(np.float64)
             + b)
    # fp32 accumulation against the exact sum of the same bf16 products
    np.testing.assert_allclose(out.numpy(), exact, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 host")
@pytest.mark.parametrize("m,k,n,rows", [(24, 64, 64, 1), (7, 65, 100, 4)])
def test_kernel_on_this_host(m, k, n, rows):
    # vdpbf16ps on an avx512bf16 host, plain vectors on any other
    _run(tvm.target.Target(targets.resolve("host").tvm), m, k, n, rows)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86 feature")
def test_native_kernel_on_avx512_bf16_host():
    # checked here, not at import: --fake-host replaces the host's flags in a fixture
    if missing_features(["avx512bf16"], "x86_64"):
        pytest.skip("host has no avx512bf16: vdpbf16ps cannot run here")
    target = tvm.target.Target(targets.resolve("host").tvm)
    assert targets.cpu_facts(target)["bf16_dot"] == "avx512"
    _run(target, 7, 65, 100, 4)
