"""Which ISA extensions this host has, in LLVM's names, read from /proc/cpuinfo.

The loader compares them with the features an artifact was compiled for: code built
for AVX-512 dies of SIGILL on a CPU without it, so it must be refused before it runs.
Standard library only: the runtime must load without the compiler (and without LLVM).
"""

from __future__ import annotations

import platform

# LLVM feature name -> /proc/cpuinfo flag, where the two differ beyond '_' and '.'.
_X86_ALIASES = {"sse3": "pni", "bmi": "bmi1", "lzcnt": "abm", "pclmul": "pclmulqdq",
                "sha": "shani", "amx-tile": "amxtile", "amx-int8": "amxint8",
                "amx-bf16": "amxbf16"}
_ARM_ALIASES = {"neon": "asimd", "dotprod": "asimddp", "fullfp16": "asimdhp"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace(".", "").replace("-", "")


def host_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def host_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set[str] | None:
    """Normalised CPU flags of this host, or None where they cannot be read."""
    try:
        with open(cpuinfo_path) as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return {_norm(v) for v in value.split()}
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
        if _norm(aliases.get(feat, feat)) not in flags and _norm(feat) not in flags:
            missing.append(feat)
    return missing
