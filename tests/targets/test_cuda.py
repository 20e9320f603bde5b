"""CUDA targets: presets, dlight GPU schedules, GPU code verification, nvcc, the artifact.

Default tier: no GPU needed (kernels are generated, verified and compiled with nvcc for
sm_90).  ``-m gpu``: numerics on a GPU against onnxruntime (needs a CUDA-enabled TVM).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import tvm

import compiler
import runtime
import schedules.cuda as gpu_schedules
import targets
from runtime.device import DeviceSession
from tests.conftest import assert_close, ort_run, zoo, zoo_model


@pytest.mark.parametrize("spec, arch", [("cuda:sm_80", "sm_80"), ("cuda:sm_90", "sm_90")])
def test_cuda_presets(spec, arch):
    t = targets.resolve(spec)
    assert t.arch == "cuda" and t.is_cuda and not t.is_cpu and t.cpu == arch
    assert t.tvm["kind"] == "cuda" and t.tvm["arch"] == arch
    assert t.tvm_target().kind.name == "cuda" and t.toolchain is None
    assert t.host_arch == runtime.cpu_features.host_arch()


def test_cuda_detected_or_clear_error():
    if shutil.which("nvidia-smi") is None:
        with pytest.raises(targets.TargetError, match="no NVIDIA GPU detected.*cuda:sm_90"):
            targets.resolve("cuda")
    else:
        assert targets.resolve("cuda").cpu.startswith("sm_")


def test_cuda_json_dict():
    t = targets.resolve({"kind": "cuda", "arch": "sm_80"})
    assert t.name == "cuda:sm_80" and t.tvm["host"]["kind"] == "llvm"


@pytest.fixture(scope="module")
def mlp_sm90():
    from compiler.driver import lower_to_kernels

    t = targets.resolve("cuda:sm_90")
    _, funcs = lower_to_kernels(zoo_model("mlp"), t)
    mod = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
    return t, funcs, gpu_schedules.apply_schedules(mod, t)


def test_every_kernel_bound_and_verified(mlp_sm90):
    t, funcs, (mod, used) = mlp_sm90
    assert set(used) == set(funcs) and "none" not in used.values()
    assert any(r == "dlight.gpu.matmul" for r in used.values())
    assert gpu_schedules.unbound_kernels(mod) == []
    assert gpu_schedules.verify(mod, t) == {}


def test_unscheduled_kernel_is_reported_unbound(mlp_sm90):
    t, funcs, _ = mlp_sm90
    raw = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
    assert sorted(gpu_schedules.unbound_kernels(raw)) == sorted(funcs)
    assert set(gpu_schedules.verify(raw, t)) == set(funcs)


def cuda_source(cm) -> str:
    mod = cm._kernels.mod if hasattr(cm._kernels, "mod") else cm._kernels
    (dev,) = [m for m in mod.imports if m.kind == "cuda"]
    return dev.inspect_source()


@pytest.fixture(scope="module")
def cnn_sm90():
    return compiler.compile(zoo_model("cnn"), target="cuda:sm_90")


def test_compile_cuda_report_and_nvcc_accepts(cnn_sm90, tmp_path):
    cm = cnn_sm90
    assert cm.report["target"]["arch"] == "cuda" and cm.report["target"]["cpu"] == "sm_90"
    assert all(k.startswith("dlight.gpu.") for k in cm.report["schedules"])
    src = cuda_source(cm)
    assert "__global__" in src
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    (tmp_path / "k.cu").write_text(src)
    r = subprocess.run([nvcc, "-w", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"),
                        str(tmp_path / "k.cu")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "k.cubin").stat().st_size > 0


def test_cuda_artifact_embeds_kernels_and_refuses_without_cuda(cnn_sm90, tmp_path):
    so = tmp_path / "cnn_cuda.so"
    cnn_sm90.export(str(so))
    meta, _, elf_arch = runtime.artifact.read_artifact(str(so))
    assert meta["manifest"]["target"]["arch"] == "cuda"
    assert elf_arch == runtime.cpu_features.host_arch()
    data = so.read_bytes()  # the imported CUDA module (source here, fatbin with CUDA TVM)
    assert all(f"{c['kernel']}_kernel".encode() in data for c in meta["graph"]["calls"])
    if tvm.runtime.enabled("cuda") and tvm.cuda(0).exist:
        pytest.skip("this host can run CUDA artifacts (see the gpu tests)")
    with pytest.raises(runtime.ArtifactError, match="NVIDIA GPU \\(sm_90\\)"):
        runtime.load(str(so))


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_device_session_mechanism_on_cpu(name):
    """The device arena (DLPack views at moved data pointers) on tvm.cpu(0)."""
    from tests.conftest import compiled

    cm = compiled(name)
    sess = DeviceSession(cm.meta, cm._payload, cm._kernels, device=tvm.cpu(0))
    feeds = zoo.random_inputs(zoo_model(name), seed=5)
    assert_close(sess.run(None, feeds), ort_run(zoo_model(name), feeds))
    assert [i.name for i in sess.get_inputs()] == list(feeds)


def test_device_session_takes_and_returns_narrow_types_on_cpu():
    """bfloat16 / float8 inputs and outputs through the device session (on tvm.cpu(0)): fed
    and returned as ml_dtypes arrays, held as their bit codes, as the CPU session does."""
    import ml_dtypes
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["f", "f"], ["sq"]),
         helper.make_node("Cast", ["sq"], ["y"], to=TensorProto.FLOAT8E5M2)], "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E5M2, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    cm = compiler.compile(m)
    sess = DeviceSession(cm.meta, cm._payload, cm._kernels, device=tvm.cpu(0))
    assert [a.type for a in sess.get_inputs()] == ["tensor(bfloat16)"]
    assert [a.type for a in sess.get_outputs()] == ["tensor(float8e5m2)"]
    x = np.array([[1.5, -2, 3], [0.25, 100, -7]], np.float32).astype(ml_dtypes.bfloat16)
    (y,) = sess.run(None, {"x": x})
    assert y.dtype == np.dtype(ml_dtypes.float8_e5m2)
    want = np.square(x.astype(np.float32)).astype(ml_dtypes.float8_e5m2)
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))
    with pytest.raises(ValueError, match="bfloat16"):
        sess.run(None, {"x": x.astype(np.float32)})


def _gpu_ready():
    return tvm.runtime.enabled("cuda") and tvm.cuda(0).exist


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_gpu_numerics(name, tmp_path):
    if not _gpu_ready():
        pytest.skip("no CUDA device, or this TVM has no CUDA runtime")
    model = zoo_model(name)
    so = tmp_path / f"{name}.so"
    compiler.compile(model, target="cuda").export(str(so))
    sess = runtime.load(str(so))
    feeds = zoo.random_inputs(model, seed=2)
    got = sess.run(None, feeds)
    assert_close(got, ort_run(model, feeds), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], got[0])
