"""aarch64 (ARM64) Linux presets: cross-compiled kernels, NEON vectors (4 fp32 lanes).

``arm`` is any ARMv8-A core with NEON (Advanced SIMD, mandatory on aarch64 Linux);
``arm-dotprod`` adds the ARMv8.2 dot-product instructions (Cortex-A55/A76 and later,
Neoverse N1: int8 kernels by ``sdot``); ``arm-i8mm`` adds the ARMv8.6 int8 matrix multiply
too (int8 kernels by ``usdot``: u8 activations as they come); ``arm-sve`` adds SVE
(Neoverse V1/N2, Graviton 3).  The kernels' fixed-width vectors stay 128-bit NEON vectors
for all of them (lanes 4, NCHWc block 4): SVE is a feature LLVM may use, not a wider fixed
vector.

The artifact is linked with the cross toolchain (``aarch64-linux-gnu-gcc`` / ``-g++``,
Debian's ``g++-aarch64-linux-gnu``): :data:`TOOLCHAIN`.

Imports nothing of ours.
"""

from __future__ import annotations

# preset -> (LLVM mattr, description)
ARM_PRESETS = {
    "arm": (("+neon",), "aarch64 Linux with NEON (cross-compiled)"),
    "arm-dotprod": (("+neon", "+dotprod"), "aarch64 with NEON and dot product (ARMv8.2+)"),
    "arm-i8mm": (("+neon", "+dotprod", "+i8mm"),
                 "aarch64 with NEON, dot product and int8 matrix multiply (ARMv8.6: Neoverse "
                 "N2 / V1 / V2, Graviton 3 / 4)"),
    "arm-sve": (("+neon", "+sve"), "aarch64 with NEON and SVE (Neoverse V1, Graviton 3)"),
}

TRIPLE = "aarch64-linux-gnu"

# Threads the kernels are scheduled for when the device's core count is unknown
# (override with a JSON target: {"kind": "llvm", "mtriple": "aarch64-linux-gnu",
# "mattr": ["+neon"], "num-cores": 8}).
DEFAULT_CORES = 4

# The C compilers that assemble the blob and link the .so, per target arch.
TOOLCHAIN = {
    "aarch64": {"cc": "aarch64-linux-gnu-gcc", "cxx": "aarch64-linux-gnu-g++",
                "install": "apt-get install g++-aarch64-linux-gnu"},
}


def tvm_dict(preset: str, cores: int = DEFAULT_CORES) -> dict:
    mattr, _ = ARM_PRESETS[preset]
    return {"kind": "llvm", "mtriple": TRIPLE, "mcpu": "generic", "mattr": list(mattr),
            "num-cores": cores}
