"""The host-dependent logic of the tests under three fabricated hosts (tests/hosts.py): a
Zen 3 (AVX2), a Zen 5 (AVX-512) and a Sapphire Rapids (AVX-512 FP16, AMX), whichever
machine runs the suite.  Nothing compiled here runs: the checks are what the compiler and
the loader decide (host target, lanes, registers, which artifacts load, which schedule
rules the NaN tests assert on ``host``)."""

from __future__ import annotations

import pytest
from onnx import helper, numpy_helper

import compiler
import runtime
import targets
from runtime import ArtifactError
from tests.hosts import HOSTS, fake_host

# artifact target -> hosts that may load it
LOADS = {
    "x86-avx2": {"zen3", "zen5", "sapphirerapids"},
    "x86-avx512": {"zen5", "sapphirerapids"},
    # every Zen 5 ISA extension the loader checks (targets.X86_ISA) is on Sapphire Rapids
    # too; avx512vp2intersect (Zen 5 only) is not in that list
    "znver5": {"zen5", "sapphirerapids"},
    "sapphirerapids": {"sapphirerapids"},
}


def _manifest(spec) -> dict:
    if spec in ("znver5", "sapphirerapids"):
        spec = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": spec}
    import tvm

    return {"target": targets.resolve(spec).to_dict(), "tvm_version": tvm.__version__}


@pytest.mark.parametrize("host", list(HOSTS))
def test_host_target_follows_the_host(host, monkeypatch, tmp_path):
    """test_targets' host detection: the CPU, lanes, registers and features; an artifact
    for ``host`` loads on that host (its features are all in the cpuinfo flags)."""
    cpu = fake_host(monkeypatch, host, tmp_path)
    has = HOSTS[host][2]
    t = targets.resolve("host")
    assert t.cpu == cpu and t.tvm["mcpu"] == cpu and t.cores == 2
    assert t.lanes_fp32 == (16 if has["avx512"] else 8)
    facts = targets.cpu_facts(t.tvm_target())
    assert facts["lanes"] == t.lanes_fp32
    assert facts["vector_registers"] == (32 if has["avx512"] else 16)
    assert ("avx512f" in t.features) == has["avx512"]
    assert ("amx-tile" in t.features) == has["amx"] == ("avx512fp16" in t.features)
    runtime.check_compatible({"target": t.to_dict(), "tvm_version": _manifest("x86")
                              ["tvm_version"]}, "host.so")


@pytest.mark.parametrize("host", list(HOSTS))
def test_loader_refuses_exactly_what_the_host_lacks(host, monkeypatch, tmp_path):
    """The loader's decision that test_artifact and test_convert_layout's ``_check`` (which
    recompiles for ``host`` when an AVX-512 artifact is refused) rely on."""
    fake_host(monkeypatch, host, tmp_path)
    for spec, hosts in LOADS.items():
        manifest = _manifest(spec)
        if host in hosts:
            runtime.check_compatible(manifest, f"{spec}.so")
        else:
            with pytest.raises(ArtifactError, match="this host lacks.*SIGILL"):
                runtime.check_compatible(manifest, f"{spec}.so")


@pytest.mark.parametrize("host", list(HOSTS))
def test_nan_tests_schedule_rules_on_every_host(host, monkeypatch, tmp_path):
    """The schedule rules that test_legalize_reductions and test_legalize_pool assert for
    target ``host`` are those each fabricated host gets (compiled, not run)."""
    from tests.compiler.lowering.test_legalize_reductions import REDUCE_CASES
    from tests.nan_helpers import graph_model

    fake_host(monkeypatch, host, tmp_path)
    for _, shape, axes, rule in REDUCE_CASES:
        if rule is None:
            continue
        out_shape = [d for i, d in enumerate(shape) if i not in axes]
        m = graph_model([helper.make_node("ReduceMax", ["x"], ["y"], axes=axes, keepdims=0,
                                          name="r")], shape, out_shape)
        cm = compiler.compile(m, target="host")
        assert cm.report["target"]["cpu"] == HOSTS[host][0]
        assert [k["rule"] for k in cm.report["kernel_table"]] == [rule]
    import numpy as np

    w = np.eye(16, dtype=np.float32).reshape(16, 16, 1, 1)
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                     helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3],
                                      strides=[2, 2], pads=[1, 1, 1, 1], name="pool")],
                    [1, 16, 16, 16], [1, 16, 8, 8], [numpy_helper.from_array(w, "w")])
    cm = compiler.compile(m, target="host")
    assert "cpu.pool2d_nchwc" in [k["rule"] for k in cm.report["kernel_table"]]
    assert cm.report["layout"]["block"] == (16 if HOSTS[host][2]["avx512"] else 8)
