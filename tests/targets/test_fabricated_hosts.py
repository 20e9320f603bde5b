"""The host-dependent logic of the tests under four fabricated hosts (tests/hosts.py): a
Zen 3 (AVX2), a Zen 5 (AVX-512), a Sapphire Rapids (AVX-512 FP16, AMX) and an Emerald
Rapids guest with AMX hidden, whichever machine runs the suite.  Nothing compiled here runs: the checks are what the compiler and
the loader decide (host target, lanes, registers, which artifacts load, which schedule
rules the NaN tests assert on ``host``)."""

from __future__ import annotations

import re

import pytest
from onnx import helper, numpy_helper
from tvm.target import codegen

import compiler
import runtime
import targets
from runtime import ArtifactError, cpu_features
from tests.hosts import HOSTS, fake_host

# artifact target -> hosts that may load it
LOADS = {
    "x86-avx2": {"zen3", "zen5", "sapphirerapids", "emeraldrapids-vm"},
    "x86-avx512": {"zen5", "sapphirerapids", "emeraldrapids-vm"},
    "znver3": {"zen3", "zen5"},              # SSE4A: no Intel CPU has it
    "znver4": {"zen5"},
    "znver5": {"zen5"},                      # AVX512-VP2INTERSECT and SSE4A: not on Intel
    "sapphirerapids": {"sapphirerapids"},
    "emeraldrapids": {"sapphirerapids"},
    # AMX-FP16 is not in /proc/cpuinfo, so not checked (only AMX intrinsics emit it)
    "graniterapids": {"sapphirerapids"},
}


def _manifest(spec) -> dict:
    if not spec.startswith("x86"):
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
    assert ("amx-tile" in t.features) == has["amx"]
    assert ("avx512fp16" in t.features) == (cpu in ("sapphirerapids", "emeraldrapids"))
    # what the host lacks is switched off in LLVM too, not only left out of the manifest
    assert not set(targets.X86_ISA) - set(t.features) & set(
        codegen.llvm_get_cpu_features(t.tvm_target()))
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


@pytest.mark.parametrize("host,spec,named", [
    ("sapphirerapids", "znver5", ["avx512vp2intersect", "sse4a"]),
    ("sapphirerapids", "znver4", ["sse4a"]),
    ("zen5", "sapphirerapids", ["avx512fp16", "amx-tile", "amx-int8", "amx-bf16"]),
    ("zen3", "znver5", ["avx512f", "avx512vp2intersect"]),
    ("zen3", "sapphirerapids", ["avx512f", "avx512fp16", "amx-tile"]),
])
def test_loader_names_the_missing_features(host, spec, named, monkeypatch, tmp_path):
    """The refusal names each feature the host lacks (LLVM's names), and only those: a
    znver5 artifact on Sapphire Rapids would use VP2INTERSECT and SSE4A, which it lacks."""
    fake_host(monkeypatch, host, tmp_path)
    with pytest.raises(ArtifactError) as e:
        runtime.check_compatible(_manifest(spec), f"{spec}.so")
    listed = str(e.value).split("with features ")[1].split(" that this host lacks")[0]
    listed = listed.split(", ")
    assert set(named) <= set(listed), listed
    flags = cpu_features.host_flags()
    assert not [f for f in listed if cpu_features.normalize(f) in flags]


# What LLVM enables for the x86 server CPUs the suite runs on and the loader does not check,
# by reason.  A feature outside these and targets.X86_ISA fails the test below: decide.
UNCHECKED = {
    "every x86-64 CPU": {"64bit", "64bit-mode", "cmov", "cx8", "fxsr", "mmx", "x87", "nopl"},
    "part of sse4.2, which is checked": {"crc32"},
    "hints that run as NOPs where absent": {"prfchw", "prefetchi", "branch-hint"},
    "string-copy speed, no new instruction": {"ermsb", "fsrm"},
    # only intrinsics emit them; hypervisors often hide them from a guest's cpuinfo
    "system instructions": {"cldemote", "clflushopt", "clwb", "clzero", "enqcmd", "fsgsbase",
                            "invpcid", "movdir64b", "movdiri", "mwaitx", "pconfig", "pku",
                            "ptwrite", "rdpid", "rdpru", "rdrnd", "rdseed", "serialize",
                            "shstk", "tsxldtrk", "uintr", "waitpkg", "wbnoinvd", "xsave",
                            "xsavec", "xsaveopt", "xsaves"},
    "not in /proc/cpuinfo (AMX: intrinsics only)": {"amx-fp16"},
    # crypto, carry chains, 16-byte atomics, flag moves: arithmetic kernels never emit them
    # (only intrinsics do), and a hypervisor that hides one from the guest's cpuinfo would
    # make the host refuse its own artifacts
    "only intrinsics emit them": {"aes", "pclmul", "sha", "adx", "cx16", "sahf"},
}
_TUNING = re.compile(r"^(fast-|slow-|false-deps-|prefer-|no-bypass-|tuning-|allow-light|"
                     r"branchfusion|macrofusion|idivq-|sbb-dep|vzeroupper|faster-)")


def test_loader_checks_every_isa_extension_llvm_enables():
    """Each feature LLVM enables for znver3/4/5 and Sapphire / Emerald / Granite Rapids is
    checked by the loader (targets.X86_ISA), a tuning flag, or listed above with why not:
    avx512vp2intersect (Zen 5 only) was once in none of them."""
    import tvm
    from tvm.target import codegen

    unchecked = set().union(*UNCHECKED.values())
    assert not unchecked & set(targets.X86_ISA)
    for cpu in ("znver3", "znver4", "znver5", "sapphirerapids", "emeraldrapids",
                "graniterapids"):
        feats = codegen.llvm_get_cpu_features(
            tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu}))
        left = {f for f in feats if f not in targets.X86_ISA and f not in unchecked
                and not _TUNING.match(f)}
        assert not left, f"{cpu}: LLVM enables {sorted(left)}: check or list them"
        assert set(_manifest(cpu)["target"]["features"]) == set(feats) & set(targets.X86_ISA)
