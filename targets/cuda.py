"""NVIDIA GPU presets: ``cuda`` (arch detected with nvidia-smi), ``cuda:sm_80``, ``cuda:sm_90``.

The TVM target is ``{"kind": "cuda", "arch": "sm_XX", "host": <portable host CPU>}``: the
kernels are CUDA, the host side (argument unpacking, launches) is LLVM code for this
machine's architecture at a portable level (no CPU features to check at load).

Imports nothing of ours.
"""

from __future__ import annotations

import re
import shutil
import subprocess

# archs with a preset name; any ``cuda:sm_XY`` with a two- or three-digit XY is accepted
CUDA_PRESETS = {
    "cuda": "NVIDIA GPU, arch detected with nvidia-smi",
    "cuda:sm_80": "NVIDIA Ampere (A100)",
    "cuda:sm_90": "NVIDIA Hopper (H100, H200)",
}
_ARCH = re.compile(r"^sm_(\d{2,3})[a-z]?$")


def detect_arch() -> str | None:
    """``sm_XY`` of GPU 0 from ``nvidia-smi``, or None (no nvidia-smi, no GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[:1]
    if out.returncode != 0 or not first:
        return None
    m = re.match(r"^\s*(\d+)\.(\d+)", first[0])
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


def parse_arch(spec: str) -> str | None:
    """``cuda:sm_90`` -> ``sm_90``; None when ``spec`` names no valid arch."""
    _, _, arch = spec.partition(":")
    return arch if _ARCH.match(arch) else None


def host_dict(arch: str) -> dict:
    """The LLVM target of the host code: this machine's architecture, portable level."""
    mcpu = "x86-64" if arch == "x86_64" else "generic"
    return {"kind": "llvm", "mtriple": f"{arch}-linux-gnu", "mcpu": mcpu}


def tvm_dict(arch: str, host_arch: str) -> dict:
    return {"kind": "cuda", "arch": arch, "max_num_threads": 1024, "thread_warp_size": 32,
            "host": host_dict(host_arch)}
