"""Default schedules for LLVM CPU kernels (x86 and aarch64), tried in order; first match
wins, the fallback last.

Each rule is dlight-shaped: ``apply(func, target) -> tvm.s_tir.Schedule | None``.  The
rules read the target's vector width, vector registers and cores (``targets.cpu_facts``),
never one machine's constants; ``tests/schedules`` checks each rule's structure under
``Target`` objects, with no hardware needed.
"""

from __future__ import annotations

from tvm.s_tir.dlight.cpu import GEMV, Reduction

from ..base import Dlight
from .arg_reduction import ArgReduction
from .concat import Concat
from .conv2d import Conv2dNCHW
from .conv2d_int8 import Conv2dInt8
from .conv2d_nchwc import Conv2dNCHWc
from .conv2d_nhwc import Conv2dNHWC
from .conv2d_packed import Conv2dPacked
from .conv_transpose import ConvTranspose
from .depthwise import DepthwiseConv2dNCHW
from .elementwise import Elementwise
from .fallback import Fallback
from .inner_reduction import InnerReduction
from .matmul import Matmul
from .matmul_packed import MatmulPacked
from .matmul_int8 import MatmulInt8
from .matmul_bf16 import MatmulBf16
from .pool import Pool2dNCHW, Pool2dNCHWc
from .pool_strided import PoolStrided
from .reduce_broadcast import ReduceBroadcast
from .row_reduction import RowReduction
from .tiled_reduction import TiledReduction
from .transpose import TransposeTiled
from .upsample import UpsampleNearest

__all__ = ["RULES", "Fallback"]

RULES = [
    Conv2dInt8(),  # integer convs pack_int_conv packed [F/b, CO, KH, KW, CP, b, 2]: vpmaddwd
    Conv2dNCHWc(),  # convs convert_layout put in NCHW[b]c (dense and depthwise)
    Conv2dNHWC(),  # --layout NHWC
    Conv2dPacked(),  # convs whose weights pack_conv_weights pre-packed OIHW[b]o
    ConvTranspose(),  # transposed convs pack_conv_transpose wrote per output phase
    DepthwiseConv2dNCHW(),  # before conv2d_nchw, which would take it as a 1-channel GEMM
    Conv2dNCHW(),
    PoolStrided(),  # 1-D / 2-D / 3-D windows of stride > 1: before pool2d_nchw's vectors
    Pool2dNCHW(),
    Pool2dNCHWc(),
    MatmulPacked(),  # matmuls whose weights pack_matmul_weights pre-packed [N/nr, K, nr]
    MatmulInt8(),  # integer matmuls pack_int_matmul packed [N/nr, K/2, nr, 2]: vpmaddwd
    MatmulBf16(),  # --precision bf16 matmuls pack_bf16_matmul packed [N/nr, K/2, nr, 2]
    Matmul(),  # any M / N (padded to whole tiles), B [K, N] or [N, K], M = 1 streamed
    RowReduction(),  # softmax / layer norm rows: vectorised (rfactored) reductions
    # any other reduction vectorisable over its innermost output dim: grouped and
    # transposed convs, pooling 1-D/3-D, reductions over a non-last axis; register tile
    TiledReduction(),
    ArgReduction(),  # ArgMax / ArgMin over a non-last axis: lanes of the innermost output dim
    # reductions over the innermost contiguous axis (reduce-all, ReduceSum(-1), RMS norm's
    # mean(x^2)): vector partial sums
    InnerReduction(),
    TransposeTiled(),  # out[.., x, c] = in[.., c, .., x] (NCHW -> NHWC): lanes x lanes tiles
    UpsampleNearest(),  # out[.., x] = in[.., x // s] (Resize nearest x2): no per-lane loads
    Concat(),  # Concat on an outer axis (a decoder's cache + new row): a copy per input
    # a reduction's small result broadcast into a large output (squeeze-and-excitation):
    # each block once at the root, nothing small recomputed per output element
    ReduceBroadcast(),
    # no reduction at all (after the two spatial rules above): elementwise chains,
    # layout transforms, pads
    Elementwise(),
    Dlight("dlight.gemv", GEMV()),
    Dlight("dlight.reduction", Reduction()),
    Fallback(),  # anything else: inlined, parallel outer loops, vectorised inner loop
]
