"""The aarch64 targets: presets, cross-compiled artifacts, refusal on x86, emulated numerics.

Default tier: needs the cross toolchain (``apt-get install g++-aarch64-linux-gnu``), no
emulation.  Slow tier (``-m slow``): runs the artifacts under qemu-aarch64 with the
emulated Python that ``scripts/setup_arm_emulation.sh`` prepares, against onnxruntime.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import compiler
import runtime
import targets
from runtime.artifact import read_artifact
from runtime.cpu_features import host_arch
from tests.conftest import REPO, assert_close, ort_run, zoo, zoo_model

HAVE_CROSS = all(shutil.which(t) for t in ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++"))
needs_cross = pytest.mark.skipif(not HAVE_CROSS, reason="no aarch64 cross toolchain: "
                                 "apt-get install g++-aarch64-linux-gnu")
EM_AARCH64 = 183


@pytest.mark.parametrize("name, feats", [("arm", {"neon"}), ("arm-dotprod", {"neon", "dotprod"}),
                                         ("arm-i8mm", {"neon", "dotprod", "i8mm"}),
                                         ("arm-sve", {"neon", "sve"})])
def test_arm_presets(name, feats):
    t = targets.resolve(name)
    assert t.arch == "aarch64" and t.is_cpu and t.lanes_fp32 == 4
    assert t.tvm["mtriple"] == "aarch64-linux-gnu" and "+neon" in t.tvm["mattr"]
    assert feats <= set(t.features) and not {"avx2", "sse4.2"} & set(t.features)
    assert t.toolchain == (None if host_arch() == "aarch64" else
                           {"cc": "aarch64-linux-gnu-gcc", "cxx": "aarch64-linux-gnu-g++",
                            "install": "apt-get install g++-aarch64-linux-gnu"})
    assert "arm" in targets.PRESETS


def test_arm_json_dict():
    t = targets.resolve({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"],
                         "num-cores": 8})
    assert t.arch == "aarch64" and t.cores == 8 and t.lanes_fp32 == 4 and "neon" in t.features


@pytest.fixture(scope="module")
def arm_so(tmp_path_factory):
    if not HAVE_CROSS:
        pytest.skip("no aarch64 cross toolchain: apt-get install g++-aarch64-linux-gnu")
    d = tmp_path_factory.mktemp("arm")
    model = d / "mlp.onnx"
    model.write_bytes(zoo_model("mlp").SerializeToString())
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(model), "--target",
                        "arm", "-o", str(d / "mlp.so"), "--report", str(d / "r.json")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return d / "mlp.so"


def test_compile_arm_writes_aarch64_elf_with_blob(arm_so):
    data = arm_so.read_bytes()
    assert data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 18)[0] == EM_AARCH64
    meta, params, arch = read_artifact(str(arm_so))
    assert arch == "aarch64"
    assert meta["manifest"]["target"]["arch"] == "aarch64"
    assert meta["manifest"]["target"]["lanes_fp32"] == 4
    assert len(params) == sum(p["nbytes"] for p in meta["graph"]["params"]) or len(params) > 0
    report = json.loads((arm_so.parent / "r.json").read_text())
    assert report["target"]["name"] == "arm" and report["kernels"] > 0


def test_arm_kernels_use_neon(arm_so):
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is None:
        pytest.skip("aarch64-linux-gnu-objdump not installed")
    asm = subprocess.run([objdump, "-d", str(arm_so)], capture_output=True, text=True).stdout
    assert "fmla" in asm and ".4s" in asm  # fp32x4 NEON multiply-adds


@pytest.mark.skipif(host_arch() == "aarch64", reason="this host is aarch64: it can load it")
def test_load_refuses_aarch64_artifact_on_x86(arm_so):
    with pytest.raises(runtime.ArtifactError, match=r"built for aarch64.*this host is x86_64"):
        runtime.load(str(arm_so))


def test_missing_cross_toolchain_is_a_clear_error(tmp_path, monkeypatch):
    if host_arch() == "aarch64":
        pytest.skip("no cross compilation on aarch64")
    cm = compiler.compile(zoo_model("mlp"), target="arm")
    monkeypatch.setattr(cm, "_toolchain", {"cc": "no-such-aarch64-gcc", "cxx": "no-such-g++",
                                           "install": "apt-get install g++-aarch64-linux-gnu"})
    with pytest.raises(compiler.CompileError, match="cross compiler 'no-such-aarch64-gcc' is "
                       "not installed.*g\\+\\+-aarch64-linux-gnu"):
        cm.export(str(tmp_path / "m.so"))


# -- slow tier: numerics under emulation ---------------------------------------------------

CACHE = Path(os.environ.get("ONNXC_ARM_CACHE", Path.home() / ".cache" / "onnxc-arm"))
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")


def _emulation_reason():
    if host_arch() == "aarch64":
        return None
    if not HAVE_CROSS:
        return "no aarch64 cross toolchain: apt-get install g++-aarch64-linux-gnu"
    if QEMU is None:
        return "no qemu-aarch64: apt-get install qemu-user-static"
    if not (CACHE / "ok").exists():
        return f"aarch64 emulation not set up in {CACHE}: run scripts/setup_arm_emulation.sh"
    return None


def run_on_arm(so: Path, feeds: dict, tmp: Path) -> dict:
    """Run ``so`` with scripts/arm_run.py on aarch64 (natively or under qemu)."""
    np.savez(tmp / "in.npz", **feeds)
    script = [str(REPO / "scripts" / "arm_run.py"), str(so), str(tmp / "in.npz"),
              str(tmp / "out.npz")]
    if host_arch() == "aarch64":
        cmd = [sys.executable, *script]
    else:
        root = CACHE / "root"
        cmd = [QEMU, "-L", str(root), str(root / "usr/bin/python3.11"), *script,
               "--site", str(CACHE / "site")]
    env = dict(os.environ, PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(tmp / "out.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_arm_emulated_matches_onnxruntime(name, tmp_path):
    reason = _emulation_reason()
    if reason:
        pytest.skip(reason)
    model = zoo_model(name)
    so = tmp_path / f"{name}.so"
    compiler.compile(model, target="arm").export(str(so))
    feeds = zoo.random_inputs(model, seed=3)
    out = run_on_arm(so, feeds, tmp_path)
    names = [o.name for o in model.graph.output]
    assert_close([out[n] for n in names], ort_run(model, feeds))


@pytest.mark.slow
@pytest.mark.parametrize("preset,act,step", [("arm-dotprod", "uint8", "sdot"),
                                             ("arm-i8mm", "int8", "usdot"),
                                             ("arm", "uint8", None)])
def test_arm_int8_dots_emulated_match_onnxruntime(preset, act, step, tmp_path):
    """A QDQ conv and a dynamically quantized MatMul built for each aarch64 int8 preset: the
    dot in the artifact's code (``sdot`` with u8 activations flipped into s8, ``usdot`` with
    s8 ones flipped into u8), outputs as onnxruntime's under emulation."""
    reason = _emulation_reason()
    if reason:
        pytest.skip(reason)
    from tests.passes.test_pack_int_matmul import dynamic_model
    from tests.passes.test_qdq_conv_integer import qdq_conv_model

    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (72, 40)).astype(np.int8)
    models = {"conv": (qdq_conv_model(16, 32, 11, 3, 1, 1, relu=True, act=act), 0.03 + 1e-6),
              "matmul": (dynamic_model(9, 72, 40, w, np.zeros((), np.int8)), None)}
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    for name, (model, tol) in models.items():
        so = tmp_path / f"{name}.so"
        compiler.compile(model, target=preset).export(str(so))
        if objdump and step:
            asm = subprocess.run([objdump, "-d", str(so)], capture_output=True, text=True).stdout
            assert f"\t{step}\t" in asm, (name, step)
        feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                 .astype(np.float32) * 2 + 1 for i in model.graph.input}
        got = run_on_arm(so, feeds, tmp_path)[model.graph.output[0].name]
        ref = ort_run(model, feeds)[0]
        if tol is None:  # the exact integer sum, dequantised alike
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())
        else:  # at most one output step apart where float sums round differently
            assert np.abs(got - ref).max() <= tol and np.mean(got != ref) < 0.02


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_arm_tuning_over_rpc_under_qemu(tmp_path):
    """`onnxc tune --target arm` measured on an aarch64 RPC server (emulated) registered at a
    loopback tracker; the database it writes is applied by an ARM compile whose artifact
    still matches onnxruntime under emulation.  Emulated timings prove the plumbing only."""
    import time

    reason = _emulation_reason()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("tornado")  # TVM's tracker needs it
    port = _free_port()
    key = "arm-qemu-test"
    env = dict(os.environ, PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host",
                                "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = CACHE / "root"
    server = subprocess.Popen([QEMU, "-L", str(root), str(root / "usr/bin/python3.11"),
                               str(REPO / "scripts" / "arm_rpc_server.py"), "--site",
                               str(CACHE / "site"), "--tracker", f"127.0.0.1:{port}",
                               "--key", key, "--port", str(sp := _free_port()), "--port-end", str(sp + 1)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env)
    try:
        from tvm import rpc

        deadline = time.time() + 240
        while True:  # the emulated server takes tens of seconds to import tvm
            try:
                summary = rpc.connect_tracker("127.0.0.1", port).summary()
                if summary.get("queue_info", {}).get(key, {}).get("free", 0) > 0:
                    break
            except Exception:
                pass
            assert time.time() < deadline, "the emulated RPC server never registered"
            assert server.poll() is None, f"the emulated RPC server exited: {server.stdout.read()}"
            time.sleep(2)
        db = tmp_path / "db"
        r = subprocess.run([sys.executable, "-m", "compiler.cli", "tune", str(REPO / "examples" /
                            "cnn.onnx"), "--target", "arm", "--db", str(db), "--trials", "16",
                            "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", key],
                           capture_output=True, text=True, cwd=REPO, timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"measured with rpc 127.0.0.1:{port} key {key}" in r.stdout + r.stderr
        lines = [json.loads(ln) for f in db.glob("*.jsonl") for ln in f.read_text().splitlines()]
        assert lines and all(rec["target"]["mtriple"].startswith("aarch64") for rec in lines)
        assert all(rec["valid_trials"] > 0 for rec in lines)
        import onnx

        cnn = onnx.load(str(REPO / "examples" / "cnn.onnx"))
        cm = compiler.compile(cnn, target="arm", tuning_db=str(db))
        assert cm.report["tuned_kernels"] >= 1  # the records apply to the ARM compile
        so = tmp_path / "cnn.so"
        cm.export(str(so))
        feeds = zoo.random_inputs(cnn, seed=5)
        out = run_on_arm(so, feeds, tmp_path)
        assert_close([out[o.name] for o in cnn.graph.output], ort_run(cnn, feeds))
    finally:
        server.kill()
        tracker.kill()
