"""bf16 matmul with the weight pre-packed [N/nr, K/2, nr, 2] (passes/pack_bf16_matmul.py).

``C[b.., i, j] += f32(A[b.., i, 2 ko + ki]) * f32(Wp[j // nr, ko, j % nr, ki])``, A and Wp
bfloat16 codes (uint16; A the activation rounded in a stage of the same kernel), C float32.
The register tile and loop order are cpu.matmul_int8's (``schedule_pairs``); on targets
with AVX512-BF16 the inner step over (16 columns, k pair) is one ``vdpbf16ps``: the row's
code pair broadcast as one dword, 16 x 2 weight codes loaded as they lie, fp32 accumulate.

TVM 0.27 cannot call the LLVM intrinsic itself: its argument type ``<32 x bfloat>`` exists
only as TIR's bfloat16, which TVM legalizes to fp32 / uint16 before LLVM sees it (and its
codegen crashes on it unlegalized).  So the step calls ``onnxc_dpbf16ps_512`` (integer
vectors in, fp32 out), a 4-line LLVM IR function that bitcasts to ``<32 x bfloat>`` and
calls ``llvm.x86.avx512bf16.dpbf16ps.512``; TVM links that IR into the kernel's module
(the ``pragma_import_llvm`` attribute on the outer loop) and LLVM inlines it
(``alwaysinline``): the kernel's assembly has ``vdpbf16ps``, no call.  Other targets
(``precision="bf16-emulated"``) get the same tile as plain fp32 vector code on the codes,
the same rounding of the inputs.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..base import MatchingCPURule
from . import common
from .matmul_int8 import match_pair_matmul, schedule_pairs

LANES = 16
EXTERN = "onnxc_dpbf16ps_512"
LLVM_IR = f"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define linkonce_odr <16 x float> @{EXTERN}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) alwaysinline {{
  %ab = bitcast <16 x i32> %a to <32 x bfloat>
  %bb = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %ab, <32 x bfloat> %bb)
  ret <16 x float> %r
}}
"""
INTRIN = "onnxc_dpbf16ps_16x2"
_REGISTERED: set = set()


def dot_intrin() -> str:
    """The tensor intrinsic ``C[0:16] += sum_k f32(A[k]) * f32(B[0:16, k])`` (k < 2, A and
    B bf16 codes) as one ``vdpbf16ps``, registered once."""
    if INTRIN in _REGISTERED:
        return INTRIN

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((2,), "uint16", offset_factor=1),
             B: T.Buffer((LANES, 2), "uint16", offset_factor=1),
             C: T.Buffer((LANES,), "float32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:LANES], A[0:2], B[0:LANES, 0:2])
            T.writes(C[0:LANES])
            for i in T.serial(0, LANES):
                for k in T.serial(0, 2):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.reinterpret(
                            "float32", T.shift_left(T.Cast("uint32", A[vk]), T.uint32(16))) * \
                            T.reinterpret("float32", T.shift_left(T.Cast("uint32", B[vi, vk]),
                                                                  T.uint32(16)))

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((2,), "uint16", offset_factor=1),
             B: T.Buffer((LANES, 2), "uint16", offset_factor=1),
             C: T.Buffer((LANES,), "float32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:LANES], A[0:2], B[0:LANES, 0:2])
            T.writes(C[0:LANES])
            pair = T.reinterpret(A.vload([0], "uint16x2"), dtype="int32")
            b = T.reinterpret(B.vload([0, 0], "uint16x32"), dtype="int32x16")
            C[T.ramp(T.int32(0), 1, LANES)] = T.call_extern(
                "float32x16", EXTERN, C.vload([0], "float32x16"), T.broadcast(pair, LANES), b)

    TensorIntrin.register(INTRIN, desc, impl)
    _REGISTERED.add(INTRIN)
    return INTRIN


class MatmulBf16(MatchingCPURule):
    """bf16 activation codes x packed bf16 weight codes -> fp32 (+ fused epilogue)."""

    name = "cpu.matmul_bf16"

    def match(self, sch):
        return match_pair_matmul(sch, "float32", ("uint16",), ("uint16",))

    def schedule(self, sch, m, target):
        mm, nr, _, _ = m
        name = sch.get(mm).name_hint
        native = common.targets.cpu_facts(target)["bf16_dot"] is not None
        lanes = LANES if native else common.lanes_fp32(target)
        if nr % lanes:
            return None
        out = schedule_pairs(sch, mm, nr, "_bf16_a", dot_intrin() if native else None, lanes,
                             target)
        if out is not None and native:
            # links LLVM_IR into this kernel's LLVM module (TVM's codegen reads the
            # attribute once, at the outermost loop)
            init = sch.get_sblock(f"{name}_init")  # tensorize replaced the update block
            sch.annotate(sch.get_loops(init)[0], "pragma_import_llvm", LLVM_IR)
        return out
