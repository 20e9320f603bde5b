"""Default schedules for CUDA kernels: TVM's dlight GPU rules, first match wins.

``apply_schedules(mod, target)`` (the same contract as ``schedules.apply_schedules``)
schedules every PrimFunc with the first of ``RULES`` that applies: Matmul, GEMV,
LowBatchGEMV, Reduction, GeneralReduction, Transpose, then Fallback, which binds the
spatial loops of any kernel to blocks and threads.  A GPU kernel no rule schedules cannot
be built (its loops are not bound to threads), so that is an error here, not a slow path.

``verify(mod, target)`` lowers the scheduled module as the build does and checks every
kernel with TVM's GPU code verifier (threads per block, shared and local memory, vector
width): what the compile-time tests assert without a GPU.
"""

from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir.dlight import gpu as dl_gpu

from ..base import Dlight

__all__ = ["apply_schedules", "verify", "unbound_kernels", "RULES", "constraints"]

log = logging.getLogger("onnxc.schedules.cuda")


RULES = [
    Dlight("dlight.gpu.matmul", dl_gpu.Matmul()),
    Dlight("dlight.gpu.gemv", dl_gpu.GEMV()),
    Dlight("dlight.gpu.low_batch_gemv", dl_gpu.LowBatchGEMV()),
    Dlight("dlight.gpu.reduction", dl_gpu.Reduction()),
    Dlight("dlight.gpu.general_reduction", dl_gpu.GeneralReduction()),
    Dlight("dlight.gpu.transpose", dl_gpu.Transpose()),
    Dlight("dlight.gpu.fallback", dl_gpu.Fallback()),
]


class GPUScheduleError(RuntimeError):
    """A kernel no GPU rule could schedule."""


def apply_schedules(mod, target) -> tuple:
    """Schedule each PrimFunc of ``mod`` for a CUDA ``target`` (targets.TargetInfo).

    Returns (scheduled IRModule, {kernel symbol: rule name}).  Raises GPUScheduleError
    naming the kernels that no rule binds to threads.
    """
    tvm_target = target.tvm_target()
    out, used, failed = {}, {}, []
    for gv, func in mod.functions.items():
        name = gv.name_hint
        out[gv], used[name] = func, "none"
        for rule in RULES:
            try:
                with tvm_target:
                    sch = rule.apply(func, tvm_target)
            except Exception as e:  # a rule that cannot handle a kernel: try the next one
                log.debug("rule %s failed on %s: %s", rule.name, name, e)
                continue
            if sch is not None:
                out[gv], used[name] = sch.mod["main"].with_attrs(func.attrs), rule.name
                break
        else:
            failed.append(name)
    if failed:
        raise GPUScheduleError(f"no GPU schedule rule applies to kernel(s) {', '.join(failed)}")
    return tvm.IRModule(out), used


def unbound_kernels(mod) -> list[str]:
    """Kernels of a scheduled module with no loop bound to a GPU thread or block."""
    out = []
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        found = []

        def visit(node):
            if node.kind == tirx.ForKind.THREAD_BINDING:
                found.append(node)

        tvm_ffi.structural_walk(func.body, [(tirx.For, visit)], order="post")
        if not found:
            out.append(gv.name_hint)
    return out


def constraints(tvm_target) -> dict:
    """GPU code verification limits of ``tvm_target`` (static shared memory: 48 KiB)."""
    attrs = tvm_target.attrs
    max_threads = int(attrs.get("max_num_threads", 1024))
    return {
        "max_threads_per_block": max_threads,
        "max_thread_x": max_threads, "max_thread_y": max_threads, "max_thread_z": 64,
        "max_shared_memory_per_block": int(attrs.get("max_shared_memory_per_block", 48 * 1024)),
        "max_local_memory_per_block": 2 ** 31 - 1,
        "max_vthread": 8,
        "max_vector_bytes": 16,
    }


def verify(mod, target) -> dict:
    """Lower a scheduled module as ``tvm.compile`` does and run TVM's GPU verifier on each
    kernel.  Returns {kernel symbol: reason} for the kernels that fail (empty: all pass)."""
    from tvm.s_tir.analysis import verify_gpu_code

    tvm_target = target.tvm_target()
    st = tvm.s_tir.transform
    # the passes MetaSchedule's VerifyGPUCode postprocessor runs before verifying
    lower = tvm.ir.transform.Sequential([
        st.LowerCrossThreadReduction(), st.LowerInitBlock(),
        st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
        st.CompactBufferAllocation(), st.LowerMatchBuffer(), st.InjectSoftwarePipeline(),
        st.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
        tirx.transform.NarrowDataType(32), tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True), st.InjectVirtualThread(),
        tirx.transform.StorageRewrite(), st.MergeSharedMemoryAllocations(),
    ])
    bad = {name: "not bound to GPU threads" for name in unbound_kernels(mod)}
    limits = constraints(tvm_target)
    with tvm_target, tvm.transform.PassContext(opt_level=3):
        lowered = lower(tvm.tirx.transform.BindTarget(tvm_target)(mod))
    for gv, func in lowered.functions.items():
        if gv.name_hint in bad or not isinstance(func, tirx.PrimFunc):
            continue
        if not verify_gpu_code(func, limits):
            bad[gv.name_hint] = f"fails verify_gpu_code {limits}"
    return bad
