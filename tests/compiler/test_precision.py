"""precision= / --precision (compiler/precision.py): the refusal for targets without
AVX512-BF16, the report's precision entry (measured where this host runs the build,
emulated and labelled so where it cannot), the manifest's record of the feature, the
loader's refusal on a host without it (a fabricated Zen 5 build loaded on Zen 3), and
the max-relative-error helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest

import compiler
import runtime
from compiler.errors import CompileError
from compiler.precision import WARN_ABOVE, max_rel_error
from runtime.cpu_features import missing_features
from tests.hosts import HOSTS, fake_host
from tests.passes.test_pack_bf16_matmul import mlp

ZEN5 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 2}


def _host_has_bf16() -> bool:
    return not missing_features(["avx512bf16"], "x86_64")


def test_bf16_refused_for_a_target_without_avx512_bf16():
    model, _ = mlp()
    for target in ("x86-avx2", "x86-avx512"):  # x86-64-v4 has AVX-512 but not BF16
        with pytest.raises(CompileError, match="precision 'bf16' needs a target with "
                                               "AVX512-BF16.*bf16-emulated"):
            compiler.compile(model, target=target, precision="bf16")
    with pytest.raises(CompileError, match="precision 'fp16' is not one of"):
        compiler.compile(model, target="host", precision="fp16")
    with pytest.raises(CompileError, match="'bf16-emulated' is for CPU targets"):
        compiler.compile(model, target="cuda:sm_90", precision="bf16-emulated")


def test_bf16_target_report_error_and_manifest(tmp_path):
    """A Zen 5 bf16 build compiled on this host: the error is measured when this host can
    run it (a Zen 5), else emulated (and says so); never a number without its source."""
    model, _ = mlp()
    cm = compiler.compile(model, target=ZEN5, precision="bf16")
    # an Intel host with AVX512-BF16 still cannot run a znver5 build (SSE4A, VP2INTERSECT)
    runs_here = not missing_features(cm.meta["manifest"]["target"]["features"], "x86_64")
    p = cm.report["precision"]
    assert p["mode"] == "bf16" and p["warn_above"] == WARN_ABOVE
    assert p["error_source"] == ("measured" if runs_here else "emulated")
    assert 1e-5 < p["max_rel_error"] < 2e-2 and p["why"].startswith(
        "this build" if runs_here else "emulated:")
    assert cm.report["schedules"].get("cpu.matmul_bf16") == 2
    man = cm.meta["manifest"]
    assert man["precision"] == "bf16" and "avx512bf16" in man["target"]["features"]
    json.dumps(cm.report)  # the report stays JSON
    path = cm.export(str(tmp_path / "bf16.so"))
    if runs_here:
        runtime.load(path)
    else:  # this host would die of SIGILL: refused at load, naming the feature it lacks
        with pytest.raises(runtime.ArtifactError, match="avx512bf16.*SIGILL" if not
                           _host_has_bf16() else "this host lacks.*SIGILL"):
            runtime.load(path)


def test_fabricated_zen5_host_compiles_bf16_and_zen3_refuses_it(monkeypatch, tmp_path):
    """``--target host`` on a (fabricated) Zen 5: bf16 kernels; its artifact loaded on a
    (fabricated) Zen 3 is refused.  Nothing compiled for the fake host runs."""
    model, _ = mlp()
    fake_host(monkeypatch, "zen5", tmp_path)
    cm = compiler.compile(model, target="host", precision="bf16", precision_check=False)
    assert cm.report["target"]["cpu"] == HOSTS["zen5"][0]
    assert cm.report["schedules"].get("cpu.matmul_bf16") == 2
    assert cm.report["precision"]["max_rel_error"] is None
    assert "not measured" in cm.report["precision"]["why"]
    path = cm.export(str(tmp_path / "zen5.so"))
    monkeypatch.undo()
    fake_host(monkeypatch, "zen3", tmp_path)
    with pytest.raises(runtime.ArtifactError, match="avx512bf16"):
        runtime.load(path)


def test_warning_above_threshold(monkeypatch):
    from compiler import precision

    monkeypatch.setattr(precision, "WARN_ABOVE", 1e-6)
    cm = compiler.compile(mlp()[0], target="host", precision="bf16-emulated")
    assert cm.report["precision"]["error_source"] == "measured"
    assert any("max relative error" in w for w in cm.report["warnings"])


def test_max_rel_error_is_normwise_per_output():
    ref = [np.array([1.0, -4.0, 0.0], np.float32), np.array([1, 2], np.int64)]
    out = [np.array([1.1, -4.0, 0.2], np.float32), np.array([5, 2], np.int64)]
    assert max_rel_error(out, ref) == pytest.approx(0.2 / 4.0, rel=1e-6)  # ints ignored
    assert max_rel_error([np.zeros(2, np.float32)], [np.zeros(2, np.float32)]) == 0.0


def test_bf16_speed_warning_names_cpus_without_a_full_rate_vdpbf16ps():
    """Zen 4/5 run vdpbf16ps at the fp32 FMA rate (bf16 does twice the work); Intel cores at
    half of it (emeraldrapids: BERT-base bf16 2.06x onnxruntime's fp32): the report says so."""
    model, _ = mlp()
    spr = {**ZEN5, "mcpu": "sapphirerapids"}
    cm = compiler.compile(model, target=spr, precision="bf16", precision_check=False)
    assert any("vdpbf16ps" in w and "sapphirerapids" in w for w in cm.report["warnings"])
    cm = compiler.compile(model, target=ZEN5, precision="bf16", precision_check=False)
    assert not any("vdpbf16ps" in w for w in cm.report["warnings"])
