"""Target presets: what a target name means for code generation and for the artifact.

``resolve("host")`` detects this machine (LLVM CPU name, ISA features, core count);
``x86``, ``x86-avx2`` and ``x86-avx512`` are portable x86-64 levels; ``arm``,
``arm-dotprod``, ``arm-i8mm`` and ``arm-sve`` are aarch64 Linux (cross-compiled, ``targets/arm.py``);
``cuda``, ``cuda:sm_80``, ``cuda:sm_90`` are NVIDIA GPUs (``targets/cuda.py``); a TVM
target JSON dict is accepted as is.  The result, :class:`TargetInfo`, carries everything later
stages ask of a target: the TVM target dict, the vector width (lanes per fp32 vector,
which is also the NCHWc channel block), and the ISA features the generated code may use,
which the artifact records so that a loader can refuse a host that lacks them.

This package imports nothing of ours (see DESIGN.md).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, field

from . import arm as _arm
from . import cuda as _cuda

__all__ = ["TargetInfo", "TargetError", "resolve", "PRESETS", "cpu_facts", "vector_bits",
           "vector_registers"]


class TargetError(ValueError):
    """An unknown or unusable target name."""


# ISA extensions whose instructions compute on data (vector, bit, crypto, AMX), checked
# against the loading host.  Not checked: LLVM's tuning flags ("fast-bextr"), which no CPU
# advertises, and system instructions (waitpkg, serialize, movdiri, shstk, clflushopt,
# rdpid, ...), which only intrinsics emit and hypervisors often hide.  Each name here must
# have a /proc/cpuinfo flag (runtime/cpu_features.py maps the names that differ), or a host
# would refuse its own artifact.  Not checkable, because Linux does not print them:
# amx-fp16 (Granite Rapids), avxifma, avxneconvert, avxvnniint8/16, cmpccxadd, sha512,
# sm3, sm4, the avx10.x levels and APX (egpr, ndd, ...); a target using them (graniterapids,
# arrowlake, diamondrapids) is checked on the rest only.  tests/targets/
# test_fabricated_hosts.py lists what is left out for the CPUs the suite runs on, and why.
X86_ISA = (
    "sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx",
    "avx2", "fma", "f16c", "bmi", "bmi2", "lzcnt", "movbe",
    "avxvnni", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512vnni",
    "avx512bf16", "avx512fp16", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg",
    "avx512vpopcntdq", "avx512vp2intersect", "gfni", "vaes", "vpclmulqdq", "amx-tile",
    "amx-int8", "amx-bf16",
    # AMD only: LLVM lowers byte/word shuffles to SSE4A's EXTRQ/INSERTQ on Zen (no Intel
    # CPU has them), and FMA4/XOP/TBM code on Bulldozer targets
    "sse4a", "fma4", "xop", "tbm",
)
AARCH64_ISA = ("neon", "dotprod", "i8mm", "sve", "sve2", "fullfp16", "bf16")

# (mcpu, description) of the portable x86-64 levels.
_X86_LEVELS = {
    "x86": ("x86-64-v2", "portable x86-64 (SSE4.2)"),
    "x86-avx2": ("x86-64-v3", "x86-64 with AVX2 and FMA"),
    "x86-avx512": ("x86-64-v4", "x86-64 with AVX-512 (F, BW, CD, DQ, VL)"),
}
PRESETS = {"host": "this machine, detected", **{k: v[1] for k, v in _X86_LEVELS.items()},
           **{k: v[1] for k, v in _arm.ARM_PRESETS.items()},
           **_cuda.CUDA_PRESETS,
           "cuda:sm_XX": "NVIDIA GPU of the given arch"}


@dataclass(frozen=True)
class TargetInfo:
    """A resolved target.

    Attributes
    ----------
    name : str
        The preset or a short label for a JSON target.
    tvm : dict
        The TVM target as a JSON dict (``tvm.target.Target(info.tvm)``).
    arch : str
        ``"x86_64"``, ``"aarch64"`` or ``"cuda"``.
    cpu : str
        LLVM CPU name (``"znver5"``), or the GPU arch.
    features : tuple of str
        ISA extensions the generated code may use (LLVM names).
    cores : int
        Threads the kernels should use.
    vector_bits : int
        Width of the widest fp32 vector unit.
    """

    name: str
    tvm: dict
    arch: str
    cpu: str
    features: tuple = field(default_factory=tuple)
    cores: int = 1
    vector_bits: int = 128

    @property
    def lanes_fp32(self) -> int:
        """fp32 lanes per vector: the NCHWc channel block and the vectorisation factor."""
        return max(1, self.vector_bits // 32)

    @property
    def is_cpu(self) -> bool:
        return self.tvm.get("kind") == "llvm"

    @property
    def is_cuda(self) -> bool:
        return self.tvm.get("kind") == "cuda"

    @property
    def host_arch(self) -> str:
        """Architecture of the host code in the artifact (the ELF machine)."""
        if self.is_cuda:
            return self.tvm["host"]["mtriple"].split("-")[0]
        return self.arch

    @property
    def toolchain(self) -> dict | None:
        """Cross compilers for the artifact (``cc``, ``cxx``), or None for the system's."""
        if self.host_arch == _this_arch():
            return None
        return _arm.TOOLCHAIN.get(self.host_arch)

    def tvm_target(self):
        """The ``tvm.target.Target`` object (imports TVM)."""
        import tvm

        return tvm.target.Target(self.tvm)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["features"] = list(self.features)
        d["lanes_fp32"] = self.lanes_fp32
        return d


def _host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _llvm_features(tvm_dict: dict) -> tuple:
    import tvm
    from tvm.target import codegen

    feats = codegen.llvm_get_cpu_features(tvm.target.Target(tvm_dict))
    known = X86_ISA if tvm_dict.get("mtriple", "").startswith("x86_64") else AARCH64_ISA
    return tuple(f for f in known if f in feats)


def vector_bits(arch: str, features) -> int:
    """Width of the widest fp32 vector unit that code for ``arch`` with ``features`` may use."""
    if arch == "x86_64":
        if "avx512f" in features:
            return 512
        if "avx" in features:
            return 256
    return 128


def vector_registers(arch: str, features) -> int:
    """Architectural vector registers: 32 (AVX-512 zmm0-31, aarch64 v0-31), else 16 (x86
    xmm/ymm).  Register tiles are sized from this: an AVX-512 tile on AVX2 spills."""
    if arch == "aarch64" or (arch == "x86_64" and "avx512f" in features):
        return 32
    return 16


@functools.lru_cache(maxsize=64)
def _llvm_facts(target_str: str, tvm_target) -> tuple:
    from tvm.target import codegen

    triple = str(tvm_target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    return triple.split("-")[0], frozenset(codegen.llvm_get_cpu_features(tvm_target))


def int16_dot(arch: str, features) -> str | None:
    """The x86 pair-wise i16 dot (``vpmaddwd``: 2 products summed into each i32 lane) at the
    widest width ``features`` allow: "avx512" (512-bit, AVX512BW), "avx2" (256-bit), else
    None (no such instruction: the integer matmul stays plain vectorised i32 code)."""
    if arch != "x86_64":
        return None
    if "avx512bw" in features:
        return "avx512"
    return "avx2" if "avx2" in features else None


def int8_dot(arch: str, features) -> str | None:
    """The 8-bit dot by fours (four byte products summed into each i32 lane) at the widest
    width ``features`` allow.  x86, u8 x s8: "avx512vnni" (zmm ``vpdpbusd``, AVX512-VNNI),
    "avxvnni" (ymm ``vpdpbusd``, AVX-VNNI: Alder Lake, Arrow Lake), both exact; "avx512"
    (zmm ``vpmaddubsw`` + ``vpmaddwd`` by ones, AVX512BW) and "avx2" (ymm), whose first
    step saturates a pair sum to int16 (onnxruntime's AVX2 kernel does the same).  aarch64,
    exact: "neoni8mm" (``usdot``, u8 x s8, FEAT_I8MM: Neoverse N2 / V1 / V2, Graviton 3 / 4,
    Apple M2), "neondot" (``sdot``, s8 x s8, ARMv8.2 dot product: the activation's operand
    is signed, see :data:`INT8_DOT_ACTIVATION`).  Else None."""
    if arch == "aarch64":
        if "i8mm" in features:
            return "neoni8mm"
        return "neondot" if "dotprod" in features else None
    if arch != "x86_64":
        return None
    if "avx512vnni" in features and "avx512bw" in features:
        return "avx512vnni"
    if "avx512bw" in features:
        return "avx512"
    if "avxvnni" in features:
        return "avxvnni"
    return "avx2" if "avx2" in features else None


# int8_dot kinds whose pair step saturates (vpmaddubsw); the VNNI ones sum in int32, exact
INT8_DOT_SATURATES = ("avx2", "avx512")
# the activation operand's type of each int8_dot kind (the weight's is int8): an activation
# of the other 8-bit type is shifted by 128 into it (passes/int8_quads.py)
INT8_DOT_ACTIVATION = {"avx2": "uint8", "avx512": "uint8", "avxvnni": "uint8",
                       "avx512vnni": "uint8", "neoni8mm": "uint8", "neondot": "int8"}


def bf16_dot(arch: str, features) -> str | None:
    """The x86 bf16 pair dot (``vdpbf16ps``: 2 bf16 products added into each fp32 lane):
    "avx512" (512-bit, AVX512-BF16: Zen 4/5, Cooper Lake, Sapphire Rapids and later), else
    None (``precision="bf16"`` is refused for such a target: compiler/driver.py)."""
    return "avx512" if arch == "x86_64" and "avx512bf16" in features else None


def cpu_facts(tvm_target) -> dict:
    """What schedule rules ask of an LLVM CPU target (a ``tvm.target.Target``): ``lanes``
    (fp32 per vector), ``vector_registers``, ``cores`` (the target's ``num-cores``),
    ``int16_dot`` (see ``int16_dot``), ``int8_dot`` (see ``int8_dot``), ``bf16_dot`` (see
    ``bf16_dot``)."""
    arch, feats = _llvm_facts(str(tvm_target), tvm_target)
    return {"arch": arch, "lanes": vector_bits(arch, feats) // 32,
            "vector_registers": vector_registers(arch, feats),
            "cores": int(tvm_target.attrs.get("num-cores", 1) or 1),
            "int16_dot": int16_dot(arch, feats), "int8_dot": int8_dot(arch, feats),
            "bf16_dot": bf16_dot(arch, feats)}


# Per-core L2 assumed for a CPU other than the host: 1 MB (Zen 4 / 5, Intel server cores
# since Skylake-SP 1-2 MB, Neoverse N1 / V1 / V2 1-2 MB; Zen 3 512 KB).
DEFAULT_L2_BYTES = 1 << 20


def l2_bytes(tvm_target) -> int:
    """Per-core L2 cache bytes of an LLVM CPU target: the host's (from sysfs) when the
    target is the host's CPU, else :data:`DEFAULT_L2_BYTES`."""
    from tvm.target import codegen

    mcpu = str(tvm_target.attrs.get("mcpu", ""))
    if not mcpu or mcpu != codegen.llvm_get_system_cpu():
        return DEFAULT_L2_BYTES
    return _host_l2_bytes()


@functools.lru_cache(maxsize=1)
def _host_l2_bytes() -> int:
    """The host's per-core unified L2, from /sys/devices/system/cpu/cpu0/cache (Linux)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            d = os.path.join(base, index)
            with open(os.path.join(d, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            if level == "2" and kind in ("Unified", "Data"):
                with open(os.path.join(d, "size")) as f:
                    size = f.read().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return DEFAULT_L2_BYTES


def _this_arch() -> str:
    import platform

    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def _cpu_target(name: str, mcpu: str, triple: str, arch: str, cores: int,
                mattr=None) -> TargetInfo:
    tvm_dict = {"kind": "llvm", "mtriple": triple, "mcpu": mcpu, "num-cores": cores}
    if mattr:
        tvm_dict["mattr"] = list(mattr)
    features = _llvm_features(tvm_dict)
    return TargetInfo(name=name, tvm=tvm_dict, arch=arch, cpu=mcpu, features=features,
                      cores=cores, vector_bits=vector_bits(arch, features))


def _host() -> TargetInfo:
    from tvm.target import codegen

    triple = codegen.llvm_get_system_triple()
    arch = triple.split("-")[0]
    if arch not in ("x86_64", "aarch64"):
        raise TargetError(f"host architecture {arch!r} is not supported (x86_64 or aarch64)")
    # The build's LLVM reports "x86_64-conda-linux-gnu"; keep the vendor-neutral triple so
    # the artifact links with the system toolchain.
    triple = f"{arch}-linux-gnu"
    # "mcpu": "native" is silently downgraded to "generic" by this LLVM build: ask for the
    # name of this CPU instead.
    mcpu = codegen.llvm_get_system_cpu()
    return _cpu_target("host", mcpu, triple, arch, _host_cores(), _hidden(mcpu, triple, arch))


def _hidden(mcpu: str, triple: str, arch: str) -> list:
    """``-feature`` attributes for the ISA extensions LLVM's CPU ``mcpu`` implies but this
    host does not report: a hypervisor may hide some (an Emerald Rapids VM without AMX), and
    an artifact built with them would be refused by the loader on the host that built it."""
    from runtime.cpu_features import missing_features

    implied = _llvm_features({"kind": "llvm", "mtriple": triple, "mcpu": mcpu})
    return [f"-{f}" for f in missing_features(implied, arch)]


def resolve(spec="host") -> TargetInfo:
    """Resolve a target name, JSON dict or JSON string to a :class:`TargetInfo`.

    Raises
    ------
    TargetError
        Unknown preset, or a target this version cannot compile for yet.
    """
    if isinstance(spec, TargetInfo):
        return spec
    if isinstance(spec, str) and spec.strip().startswith("{"):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise TargetError(f"target {spec!r} is not valid JSON: {e}") from None
    if isinstance(spec, dict):
        return _from_dict(spec)
    if spec == "host":
        return _host()
    if spec in _X86_LEVELS:
        return _cpu_target(spec, _X86_LEVELS[spec][0], "x86_64-linux-gnu", "x86_64", _host_cores())
    if spec in _arm.ARM_PRESETS:
        mattr, _ = _arm.ARM_PRESETS[spec]
        return _cpu_target(spec, "generic", _arm.TRIPLE, "aarch64", _arm.DEFAULT_CORES, mattr)
    if spec == "cuda" or str(spec).startswith("cuda:"):
        return _cuda_target(spec)
    names = ", ".join(k for k in PRESETS if k != "cuda:sm_XX")
    raise TargetError(f"unknown target {spec!r}: use one of {names}, or a TVM target JSON dict")


def _cuda_target(spec: str, extra: dict | None = None) -> TargetInfo:
    if spec == "cuda":
        arch = _cuda.detect_arch()
        if arch is None:
            raise TargetError("target 'cuda': no NVIDIA GPU detected (nvidia-smi is missing or "
                              "lists no GPU); name the arch, e.g. --target cuda:sm_90")
    else:
        arch = _cuda.parse_arch(spec)
        if arch is None:
            raise TargetError(f"target {spec!r}: expected cuda:sm_XY, e.g. cuda:sm_80 or "
                              "cuda:sm_90")
    host = _this_arch()
    if host not in ("x86_64", "aarch64"):
        raise TargetError(f"host architecture {host!r} is not supported (x86_64 or aarch64)")
    tvm_dict = dict(_cuda.tvm_dict(arch, host), **(extra or {}))
    try:
        import tvm

        tvm.target.Target(tvm_dict)
    except Exception as e:
        raise TargetError(f"TVM rejects target {json.dumps(tvm_dict)}: "
                          f"{str(e).splitlines()[-1]}") from None
    return TargetInfo(name=spec if spec != "cuda" else f"cuda:{arch}", tvm=tvm_dict,
                      arch="cuda", cpu=arch, features=(), cores=1, vector_bits=128)


def _from_dict(d: dict) -> TargetInfo:
    if d.get("kind") == "cuda":
        arch = d.get("arch") or _cuda.detect_arch()
        if arch is None:
            raise TargetError("CUDA target dict without 'arch' and no GPU detected; add "
                              "\"arch\": \"sm_90\"")
        extra = {k: v for k, v in d.items() if k not in ("kind", "arch")}
        return _cuda_target(f"cuda:{arch}", extra)
    if d.get("kind") != "llvm":
        raise TargetError(f"target kind {d.get('kind')!r} is not available (llvm or cuda)")
    triple = d.get("mtriple") or "x86_64-linux-gnu"
    arch = triple.split("-")[0]
    if arch not in ("x86_64", "aarch64"):
        raise TargetError(f"target triple {triple!r}: architecture {arch!r} is not supported")
    tvm_dict = dict(d, mtriple=triple)
    tvm_dict.setdefault("mcpu", "generic")
    tvm_dict.setdefault("num-cores", _host_cores())
    try:
        features = _llvm_features(tvm_dict)
    except Exception as e:  # TVM rejects the dict
        raise TargetError(f"TVM rejects target {json.dumps(d)}: {str(e).splitlines()[-1]}") from None
    return TargetInfo(name=tvm_dict["mcpu"], tvm=tvm_dict, arch=arch, cpu=tvm_dict["mcpu"],
                      features=features, cores=int(tvm_dict["num-cores"]),
                      vector_bits=vector_bits(arch, features))
