"""matmul(x, W) => matmul_bf16(bf16(x), [N/nr, K/2, nr, 2](bf16(W))), fp32 accumulation.

``--precision bf16`` (API ``precision="bf16"``): a float32 matmul with a constant 2-D weight
(MatMul / Gemm projections, BERT's 72 of them) keeps its weight as bfloat16 codes (uint16,
rounded to nearest even once, here), packed into ``[N/nr, K/2, nr, 2]`` panels: a column's
two consecutive k values side by side, the operand layout of ``vdpbf16ps`` (AVX512-BF16:
per fp32 lane ``acc += a[2k+1] b[2k+1]``, then ``+= a[2k] b[2k]``, each product exact in
fp32).  The activation is rounded to bf16 codes the same way in a stage of the same kernel
(``matmul_bf16_a``, M x K work against the matmul's M x N x K); the reduction then runs in
fp32 over the codes widened back (``float32(u16 << 16)``), which the CPU rule
``cpu.matmul_bf16`` tensorizes as one ``vdpbf16ps`` per (16 columns, k pair) on targets
with avx512bf16, and leaves as plain fp32 vector code elsewhere (``precision=
"bf16-emulated"``: the same numbers on any host, for checking the error).  An odd K gets a
zero k, N not a multiple of ``panel`` zero columns, an M with no register-tile divisor
padded rows (as pack_matmul_weights; a symbolic M always so), all cut off by a second
stage.  Everything else stays
float32.  Does nothing unless the option ``precision`` is ``bf16`` (compile_static sets it).
Runs after fold_constants and the fusions, before pack_matmul_weights (which would take
these matmuls as fp32).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from .context import GraphPass, PassReport
from .dataflow import record_calls, rewrite_calls
from .pack_matmul_weights import float_weight_matmul, pad_rows, shared_pack

RULE = "matmul(x, W) => matmul_bf16(bf16(x), [N/nr, K/2, nr, 2](bf16(W)))"
PRECISIONS = ("fp32", "bf16")


class PackBf16Matmul(GraphPass):
    """float32 matmul by a constant weight => bf16 operands, fp32 accumulation (opt-in)."""

    name = "pack_bf16_matmul"
    opt_level = 0  # a precision the user asked for, not an optimisation to turn down
    options = {"precision": "fp32", "panel": 32, "rows": 12}

    def rewrite(self, mod, report: PassReport, options: dict):
        if options["precision"] not in PRECISIONS:
            raise ValueError(f"pack_bf16_matmul: precision {options['precision']!r} is not "
                             f"one of {', '.join(PRECISIONS)}")
        if options["precision"] != "bf16":
            return mod
        panel, rows = int(options["panel"]), int(options["rows"])
        packs: dict = {}  # one packed constant per weight (pack_matmul_weights' reason)
        out, rewritten = rewrite_calls(mod, "relax.matmul",
                                       lambda m, call: _packed(m, call, panel, rows, packs))
        record_calls(report, RULE, rewritten)
        return out


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 codes (uint16), rounded to nearest even; NaN stays a (quiet)
    NaN.  The same rounding as the kernel's activation stage (``_round_bf16``)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def from_bf16(codes: np.ndarray) -> np.ndarray:
    """bfloat16 codes (uint16) -> float32, exactly."""
    return (np.asarray(codes, np.uint16).astype(np.uint32) << 16).view(np.float32)


def pack_bf16(w: np.ndarray, nr: int) -> np.ndarray:
    """W [K, N] float32 -> wp [ceil(N/nr), ceil(K/2), nr, 2] bf16 codes: ``wp[jo, ko, ji,
    ki] = bf16(W[2 ko + ki, jo nr + ji])``; zero columns up to whole panels, a zero row for
    odd K."""
    k, n = w.shape
    np_, kp = -(-n // nr) * nr, -(-k // 2) * 2
    w = np.pad(np.asarray(w, np.float32), ((0, kp - k), (0, np_ - n)))
    wp = w.reshape(kp // 2, 2, np_ // nr, nr).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(to_bf16(np.ascontiguousarray(wp)))


def widen(code):
    """A bf16 code (uint16 TIR value) as the float32 it stands for: ``float32(u << 16)``.
    cpu.matmul_bf16's tensor intrinsic is written with this same expression."""
    return tvm.tirx.reinterpret(
        "float32", tvm.tirx.shift_left(code.astype("uint32"), tvm.tirx.const(16, "uint32")))


def _round_bf16(v):
    """float32 TIR value -> bf16 code (uint16), round to nearest even, NaN kept a NaN."""
    u = tvm.tirx.reinterpret("uint32", v)
    c = lambda x: tvm.tirx.const(x, "uint32")  # noqa: E731
    r = (u + c(0x7FFF) + ((u >> c(16)) & c(1))) >> c(16)
    return te.if_then_else(v != v, (u >> c(16)) | c(0x40), r).astype("uint16")


def matmul_bf16(x, wp, n: int, rows: int = 1):
    """TE compute.  ``a[.., i, k] = bf16(x[.., i, k])`` (0 for k >= K, K odd; row
    ``min(i, M - 1)`` when ``rows`` > 1 pads M to a multiple of it), then ``out[.., i, j] =
    sum_{ko, ki} widen(a[.., i, 2 ko + ki]) * widen(wp[j // nr, ko, j % nr, ki])`` in
    float32; a second stage drops padded rows and the last panel's zero columns."""
    *bat, m, kk = x.shape
    no, k2, nr, _ = (int(d) for d in wp.shape)
    kk = int(kk)
    if isinstance(m, (int, tvm.tirx.IntImm)):
        m = int(m)
        mp = -(-m // rows) * rows
    else:  # symbolic rows (batch x tokens): rounded up to whole multiples of ``rows``
        mp = te.indexdiv(m + (rows - 1), rows) * rows
    static = isinstance(mp, int) and mp == m

    def rounded(*idx):
        i, k = idx[-2:]
        v = _round_bf16(x[(*idx[:-2], i if static else te.min(i, m - 1),
                           te.min(k, kk - 1) if kk != 2 * k2 else k)])
        if kk == 2 * k2:
            return v
        return te.if_then_else(k < kk, v, tvm.tirx.const(0, "uint16"))

    a = te.compute((*bat, mp, 2 * k2), rounded, name="matmul_bf16_a")
    ko = te.reduce_axis((0, k2), "ko")
    ki = te.reduce_axis((0, 2), "ki")
    acc = te.compute(
        (*bat, mp, no * nr),
        lambda *idx: te.sum(
            widen(a[(*idx[:-1], ko * 2 + ki)])
            * widen(wp[te.indexdiv(idx[-1], nr), ko, te.indexmod(idx[-1], nr), ki]),
            axis=[ko, ki]),
        name="matmul_bf16")
    if n == no * nr and static:
        return acc
    return te.compute((*bat, m, n), lambda *idx: acc[idx], name="matmul_bf16_cut")


def _packed(m, call, panel: int, rows: int, packs=None):
    """``call`` (a relax.matmul) as matmul_bf16, emitted through ``m``; None when it does
    not qualify (not float32, W not a constant 2-D float32 tensor, symbolic K).  ``packs``
    ({weight's memory: packed constant}) shares one packed copy between the matmuls that
    read one weight (an unrolled recurrence's, every step)."""
    qualified = float_weight_matmul(call, rows)
    if qualified is None or qualified[1].shape[0] < 2:
        return None
    x, w, pad = qualified
    wp = shared_pack(packs, call.args[1], w, panel, lambda: relax.const(pack_bf16(w, panel)))
    return m.builder_.call_te(matmul_bf16, m.visit_expr(x), wp, int(w.shape[1]), pad,
                              primfunc_name_hint="matmul_bf16")
