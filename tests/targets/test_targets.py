"""Target presets resolve to LLVM CPU names and features; host is detected, not 'native'."""

from __future__ import annotations

import pytest

import targets


def test_host_is_detected_not_generic():
    from tvm.target import codegen

    t = targets.resolve("host")
    assert t.cpu == codegen.llvm_get_system_cpu() != "generic"
    assert t.tvm["mcpu"] == t.cpu and t.tvm["kind"] == "llvm"
    assert t.cores >= 1 and t.tvm["num-cores"] == t.cores
    assert t.arch in ("x86_64", "aarch64")


def test_presets_lanes():
    assert targets.resolve("x86").lanes_fp32 == 4
    assert targets.resolve("x86-avx2").lanes_fp32 == 8
    assert "avx2" in targets.resolve("x86-avx2").features
    t = targets.resolve("x86-avx512")
    assert t.lanes_fp32 == 16 and "avx512f" in t.features and "avx512fp16" not in t.features


def test_json_dict_and_string():
    d = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake"}
    a = targets.resolve(d)
    b = targets.resolve('{"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake"}')
    assert a == b and a.lanes_fp32 == 8 and "avx512f" not in a.features


@pytest.mark.parametrize("spec, message", [
    ("sparc", "unknown target 'sparc'"),
    ("arm-v9", "unknown target 'arm-v9'"),
    ("cuda:90", "expected cuda:sm_XY"),
    ('{"kind": "llvm",', "not valid JSON"),
    ({"kind": "opencl"}, "not available"),
])
def test_refusals(spec, message):
    with pytest.raises(targets.TargetError, match=message):
        targets.resolve(spec)


def test_cpu_feature_names_match_cpuinfo():
    from runtime.cpu_features import missing_features

    flags = {"pni", "sse41", "sse42", "bmi1", "avx2", "avx512f", "avx512vnni", "abm"}
    assert missing_features(["sse3", "sse4.1", "bmi", "lzcnt", "avx512vnni"], "x86_64",
                            flags) == []
    assert missing_features(["avx512fp16", "avx2"], "x86_64", flags) == ["avx512fp16"]
    assert missing_features(["neon", "dotprod"], "aarch64", {"asimd"}) == ["dotprod"]
