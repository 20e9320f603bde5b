"""Which ISA extensions this host has, in LLVM's names, read from /proc/cpuinfo.

The loader compares them with the features an artifact was compiled for: code built
for AVX-512 dies of SIGILL on a CPU without it, so it must be refused before it runs.
Standard library only: the runtime must load without the compiler (and without LLVM).
"""

from __future__ import annotations

import platform

# LLVM feature name -> /proc/cpuinfo flag, where the two differ beyond '_' and '.'.
_X86_ALIASES = {"sse3": "pni", "bmi": "bmi1", "lzcnt": "abm", "pclmul": "pclmulqdq",
                "sha": "shani", "sahf": "lahf_lm", "amx-tile": "amxtile",
                "amx-int8": "amxint8", "amx-bf16": "amxbf16"}
_ARM_ALIASES = {"neon": "asimd", "dotprod": "asimddp", "fullfp16": "asimdhp"}


def normalize(name: str) -> str:
    """A CPU feature name as compared: lower case, no "_", "." or "-"."""
    return name.lower().replace("_", "").replace(".", "").replace("-", "")


def host_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


# aarch64 HWCAP bits (linux/arch/arm64/include/uapi/asm/hwcap.h) -> /proc/cpuinfo names
_AARCH64_HWCAP = {1: "asimd", 10: "asimdhp", 20: "asimddp", 22: "sve"}
_AARCH64_HWCAP2 = {1: "sve2", 13: "i8mm", 14: "bf16"}


def _aarch64_hwcap_flags() -> set[str] | None:
    """aarch64 features from the auxiliary vector (what /proc/cpuinfo prints, but also right
    under user-mode emulation, where /proc/cpuinfo is the x86 host's)."""
    try:
        import ctypes

        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype = ctypes.c_ulong
        getauxval.argtypes = [ctypes.c_ulong]
        hwcap, hwcap2 = getauxval(16), getauxval(26)  # AT_HWCAP, AT_HWCAP2
    except (OSError, AttributeError):
        return None
    if not hwcap:
        return None
    flags = {"fp"} | {n for b, n in _AARCH64_HWCAP.items() if hwcap >> b & 1}
    return flags | {n for b, n in _AARCH64_HWCAP2.items() if hwcap2 >> b & 1}


def host_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set[str] | None:
    """Normalised CPU flags of this host, or None where they cannot be read."""
    if host_arch() == "aarch64" and cpuinfo_path == "/proc/cpuinfo":
        flags = _aarch64_hwcap_flags()
        if flags is not None:
            return flags
    try:
        with open(cpuinfo_path) as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return {normalize(v) for v in value.split()}
    return None


def missing_features(required, arch: str, flags: set[str] | None = None) -> list[str]:
    """The LLVM feature names in ``required`` that this host does not have.

    Returns an empty list when the host's flags cannot be read (nothing to compare with).
    """
    flags = host_flags() if flags is None else flags
    if flags is None:
        return []
    aliases = _X86_ALIASES if arch == "x86_64" else _ARM_ALIASES
    missing = []
    for feat in required:
        if normalize(aliases.get(feat, feat)) not in flags and normalize(feat) not in flags:
            missing.append(feat)
    return missing


def cpu_ghz(cpuinfo_path: str = "/proc/cpuinfo") -> float | None:
    """The clock /proc/cpuinfo reports ("cpu MHz", the highest over the CPUs), in GHz."""
    try:
        with open(cpuinfo_path) as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        return None
    return max(mhz) / 1e3 if mhz else None


def nominal_peak_gflops(lanes_fp32: int, threads: int, fma_pipes: int = 2) -> float | None:
    """fp32 peak of ``threads`` cores: GHz x lanes x 2 (an FMA is two FLOPs) x FMA pipes.

    The clock is what /proc/cpuinfo reports (often the base clock under a hypervisor; boost
    not counted) and two FMA pipes are assumed (Zen 3-5, Sapphire Rapids, Neoverse V1): a
    yardstick for how far a kernel is from the machine, not a measured ceiling.  None where
    the clock cannot be read."""
    ghz = cpu_ghz()
    if not ghz or lanes_fp32 <= 0 or threads <= 0:
        return None
    return ghz * lanes_fp32 * 2 * fma_pipes * threads
