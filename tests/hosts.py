"""Fabricated x86 hosts for tests that must mean the same on any machine (issue #17 item 5).

A host is what the two host readers return: the LLVM CPU name that ``targets.resolve("host")``
asks TVM for (``codegen.llvm_get_system_cpu``), and the ``/proc/cpuinfo`` flags that the
loader compares an artifact's features with (``runtime.cpu_features.host_flags``).
:func:`fake_host` replaces both (through ``monkeypatch``), so a test can ask "what would
happen on a Zen 5" on a Zen 3 and the other way round.  Nothing compiled under a fake host
may be *run*: the code would use the fake host's instructions.

:func:`compile_only` makes every way a test runs compiled code raise :class:`CompileOnly`, a
pytest skip: ``python -m pytest --fake-host zen5 tests/schedules`` (tests/conftest.py) runs
each test as that host would up to its first run, so the structure and rule assertions a
test makes before running are checked as they would be there.

The flag lines are those kernels print, trimmed to the ISA flags and a few others:
Zen 3 (EPYC 7003: AVX2, no AVX-512), Zen 5 (EPYC 9005: AVX-512 with BF16/VNNI, no FP16,
no AMX), Sapphire Rapids (Xeon 4th gen: AVX-512 with FP16, AMX tile/int8/bf16), and an
Emerald Rapids virtual machine whose hypervisor hides AMX (AVX-512 FP16, no AMX flags).
"""

from __future__ import annotations

import pytest

_COMMON = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
           "mmx fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl "
           "cpuid pni pclmulqdq monitor ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
           "aes xsave avx f16c rdrand lahf_lm abm 3dnowprefetch fsgsbase bmi1 avx2 smep bmi2 "
           "erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 "
           "xsaves umip pku ospke vaes vpclmulqdq rdpid fsrm")
_AMD = ("mmxext fxsr_opt extd_apicid cmp_legacy svm sse4a misalignsse topoext mwaitx clzero "
        "rdpru wbnoinvd")
_AVX512 = ("avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi "
           "avx512_vbmi2 gfni avx512_vnni avx512_bitalg avx512_vpopcntdq avx_vnni movdiri "
           "movdir64b")

# name -> (LLVM CPU name, /proc/cpuinfo "flags" line, what the host has)
HOSTS = {
    "zen3": ("znver3", f"{_COMMON} {_AMD}", {"avx512": False, "amx": False}),
    "zen5": ("znver5", f"{_COMMON} {_AMD} {_AVX512} avx512_vp2intersect",
             {"avx512": True, "amx": False}),
    "sapphirerapids": ("sapphirerapids",
                       f"{_COMMON} {_AVX512} ss vmx est tm2 waitpkg cldemote serialize "
                       "tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8",
                       {"avx512": True, "amx": True}),
    # what this project's Intel machines report: an Emerald Rapids guest whose hypervisor
    # hides AMX (LLVM's emeraldrapids implies amx-tile/int8/bf16; the host target must not)
    "emeraldrapids-vm": ("emeraldrapids",
                         f"{_COMMON} {_AVX512} hypervisor cldemote serialize tsxldtrk "
                         "avx512_fp16",
                         {"avx512": True, "amx": False}),
}


def fake_host(monkeypatch, name: str, tmp_path, cores: int = 2) -> str:
    """Make this process see host ``name`` (a key of :data:`HOSTS`) with ``cores`` CPUs:
    ``targets.resolve("host")`` gives its LLVM CPU, the loader its cpuinfo flags (read
    through ``host_flags`` from a written cpuinfo file, so the parser is exercised too).
    Returns the LLVM CPU name."""
    from tvm.target import codegen

    import targets
    from runtime import cpu_features

    cpu, flags, _ = HOSTS[name]
    info = tmp_path / f"cpuinfo-{name}"
    info.write_text(f"processor\t: 0\nvendor_id\t: fake\nflags\t\t: {flags}\n\n")
    parsed = cpu_features.host_flags(str(info))
    assert parsed, f"fabricated cpuinfo of {name} has no flags line"
    real_reader = cpu_features.host_flags
    monkeypatch.setattr(cpu_features, "host_flags",
                        lambda path="/proc/cpuinfo": set(parsed) if path == "/proc/cpuinfo"
                        else real_reader(path))
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: cpu)
    monkeypatch.setattr(targets, "_host_cores", lambda: cores)
    return cpu


class CompileOnly(pytest.skip.Exception):
    """Raised where a test under a fabricated host would run compiled code (a pytest skip
    outcome; a BaseException, so no ``except Exception`` in the code under test hides it)."""


def compile_only(monkeypatch) -> None:
    """Make running compiled code raise :class:`CompileOnly`: sessions (in memory, from a
    ``.so``, on a device) and kernel lookup in a TVM module (a test that builds and calls a
    kernel itself).  Compiling for a fabricated host is what the tests check; running its
    code here could die of SIGILL."""
    import tvm_ffi

    import runtime
    from runtime import device, session

    def refuse(*args, **kwargs):
        raise CompileOnly("compile-only (fabricated host): the test reached a run")

    monkeypatch.setattr(session.Session, "__init__", refuse)
    monkeypatch.setattr(device.DeviceSession, "__init__", refuse)
    monkeypatch.setattr(runtime, "load", refuse)
    monkeypatch.setattr(tvm_ffi.Module, "get_function", refuse)
    monkeypatch.setattr(tvm_ffi.Module, "__getitem__", refuse)
    monkeypatch.setattr(tvm_ffi.Module, "__call__", refuse)
