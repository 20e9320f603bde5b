"""Default schedule rules for CPU kernels, tried in order; first match wins, fallback last.

Each rule is dlight-shaped: ``apply(func, target) -> tvm.s_tir.Schedule | None``.
The list is the start the default-schedules work builds on: TVM's dlight CPU rules for
GEMV and row reductions (softmax, layer norm), then a fallback that inlines elementwise
producers, parallelises the outer spatial loops over the cores and vectorises the
innermost spatial loop.
"""

from __future__ import annotations

import functools

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.cpu import GEMV, Reduction
from tvm.target import codegen

from .base import ScheduleRule
from .x86.conv2d import Conv2dNCHW
from .x86.conv2d_nchwc import Conv2dNCHWc
from .x86.conv2d_nhwc import Conv2dNHWC
from .x86.conv2d_packed import Conv2dPacked
from .x86.depthwise import DepthwiseConv2dNCHW
from .x86.pool import Pool2dNCHW, Pool2dNCHWc
from .x86.matmul import MatmulNN
from .x86.matmul_packed import MatmulPacked
from .x86.row_reduction import RowReduction


class _Dlight(ScheduleRule):
    """Adapter for a TVM dlight rule (whose apply takes a third ``tunable`` argument)."""

    def __init__(self, name, rule):
        self.name, self._rule = name, rule

    def apply(self, func, target):
        sch = self._rule.apply(func, target, False)
        return sch[0] if isinstance(sch, list) else sch


@functools.lru_cache(maxsize=16)
def _lanes_fp32(target_json: str, target) -> int:
    feats = codegen.llvm_get_cpu_features(target)
    return 16 if "avx512f" in feats else 8 if "avx" in feats else 4


def _extent(sch, loop):
    e = sch.get(loop).extent
    return e.value if isinstance(e, tirx.IntImm) else None


def _lane_dependent_select(sch, info) -> bool:
    """The block chooses between loads with ``if_then_else`` on an index it also divides
    or takes modulo (RotaryEmbedding's half rotation: ``x[.., v % 8 - 4]`` when
    ``v % 8 >= 4``).  TVM 0.27 vectorises such a block wrongly when its outer loops are
    serial (lanes 8-15 of 16 read the wrong elements: ONNX
    ``test_rotary_embedding_3d_input`` on a 1-core target); such blocks are left scalar."""
    body = str(sch.get(info.block_rv).body)
    return "if_then_else" in body and ("%" in body or "//" in body)


class Fallback(ScheduleRule):
    """Inline elementwise producers; per remaining block, fuse and parallelise the leading
    spatial loops and vectorise the innermost loop when every loop is spatial."""

    name = "fallback"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        lanes = _lanes_fp32(str(target), target)
        cores = int(target.attrs.get("num-cores", 1) or 1)
        kept = []
        for info in reversed(infos):
            if info is not infos[-1] and info.is_injective():
                try:
                    sch.compute_inline(info.block_rv)
                    continue
                except Exception:  # e.g. read by a reduction at a non-inlinable index
                    pass
            kept.append(info)
        for info in kept:
            loops = sch.get_loops(info.block_rv)
            kinds = info.dom_kind()
            if len(loops) != len(kinds):  # not in one-loop-per-iter form: leave it
                continue
            n_lead = len(kinds) - len(kinds.lstrip("S"))
            if n_lead == len(kinds) and n_lead and not _lane_dependent_select(sch, info):
                ext = _extent(sch, loops[-1])
                # odd widths (56, 28, 7): fuse the last two spatial loops when their product
                # is whole vectors (56x56 = 196 x 16), instead of leaving the loop scalar
                if (ext is not None and ext % lanes and n_lead >= 2
                        and (_extent(sch, loops[-2]) or 1) * ext % lanes == 0):
                    loops = [*loops[:-2], sch.fuse(loops[-2], loops[-1])]
                    n_lead -= 1
                    ext = _extent(sch, loops[-1])
                if ext is not None and ext % lanes == 0 and ext >= lanes:
                    _, vec = sch.split(loops[-1], [None, lanes])
                    sch.vectorize(vec)
                    loops = sch.get_loops(info.block_rv)[:-1]
                    n_lead = len(loops)
            if n_lead and cores > 1:
                fused = sch.fuse(*loops[:n_lead]) if n_lead > 1 else loops[0]
                ext = _extent(sch, fused)
                if ext is None or ext >= 2:
                    sch.parallel(fused)
        return sch


RULES = [
    Conv2dNCHWc(),  # convs convert_layout put in NCHW[b]c (dense and depthwise)
    Conv2dNHWC(),  # --layout NHWC
    Conv2dPacked(),  # convs whose weights pack_conv_weights pre-packed OIHW[b]o
    DepthwiseConv2dNCHW(),  # before conv2d_nchw, which would take it as a 1-channel GEMM
    Conv2dNCHW(),
    Pool2dNCHW(),
    Pool2dNCHWc(),
    MatmulPacked(),  # matmuls whose weights pack_matmul_weights pre-packed [N/32, K, 32]
    MatmulNN(),
    RowReduction(),  # softmax / layer norm rows: vectorised (rfactored) reductions
    _Dlight("dlight.gemv", GEMV()),
    _Dlight("dlight.reduction", Reduction()),
    Fallback(),
]
