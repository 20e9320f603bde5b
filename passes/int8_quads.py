"""When the integer packing passes (pack_int_matmul, pack_int_conv) lay weights out by fours
for the u8 x s8 dot, and whether a kernel's products can saturate there.

The target's ``int8_dot`` (targets.int8_dot, set as the passes' ``u8_dot`` option by the
compile driver) multiplies 8-bit activations by s8 weights four at a time into each i32
lane: ``vpdpbusd`` on AVX512-VNNI / AVX-VNNI sums the four u8 x s8 products in int32
(exact); ``vpmaddubsw`` on AVX2 / AVX-512BW first sums each pair ``a[2p] w[2p] + a[2p+1]
w[2p+1]`` into int16 with saturation, as onnxruntime's AVX2 kernel does; aarch64's
``usdot`` (i8mm) takes u8 x s8, its ``sdot`` (dotprod) s8 x s8, both exact.  With ``a`` in
[0, 255] a pair cannot saturate when ``|w[2p]| + |w[2p+1]| <= 128`` (255 * 128 = 32640),
which holds for every weight quantized with ``reduce_range`` (7-bit) or in [-64, 64]; the
passes check this per kernel at compile time and report the kernels that can saturate.
Option ``exact`` keeps such targets on the exact i16 pair path (``vpmaddwd``: activations
widened to i16 minus their zero point, half the products per instruction).

An activation of the other 8-bit type than the dot's (``targets.INT8_DOT_ACTIVATION``: s8
activations, quantize_static's default, on x86; u8 ones under ``sdot``) is shifted into it
as the kernel copies it, ``a' = a - shift`` with ``shift`` = -128 (s8 -> u8) or 128 (u8 ->
s8), one XOR of the sign bit per byte; the zero-point correction then subtracts ``(za -
shift) * colsum(W)`` instead of ``za * colsum(W)``, so the result is exact as before
(onnxruntime's x86 kernels run s8 activations the same way, flipping their sign bit).
"""

from __future__ import annotations

import numpy as np

import targets

from .dataflow import Dataflow, record_calls, rewrite_calls

# pass report key: kernels whose pair sums can pass int16 on a vpmaddubsw target
SATURATING = "u8 x s8 kernels whose vpmaddubsw pair sums can saturate (weights |w0|+|w1| > 128)"
OPTIONS = {"u8_dot": "", "exact": False}


def use_quads(options: dict, a_dtype: str, w: np.ndarray) -> bool:
    """Whether a kernel of ``a_dtype`` activations by the integer weight ``w`` (zero point
    already subtracted) takes the layout by fours: the target has an 8-bit dot, the
    activation is u8 or s8, every weight fits s8, and ``exact`` does not ask to avoid a
    saturating dot."""
    kind = options.get("u8_dot") or ""
    if (not kind or a_dtype not in ("uint8", "int8") or w.size == 0 or w.min() < -128
            or w.max() > 127):
        return False
    return not (options.get("exact") and kind in targets.INT8_DOT_SATURATES)


def shift(options: dict, a_dtype: str) -> tuple[int, str]:
    """(shift, dtype): what to subtract from an ``a_dtype`` activation to bring it to the
    dot's activation type, and that type: (0, a_dtype) when they agree, (-128, "uint8")
    for s8 into a u8 dot, (128, "int8") for u8 into an s8 dot."""
    want = targets.INT8_DOT_ACTIVATION[options["u8_dot"]]
    by = 0 if want == a_dtype else -128 if a_dtype == "int8" else 128
    return by, shifted_type(a_dtype, by)


def shifted_type(a_dtype: str, by: int) -> str:
    """The 8-bit type of an ``a_dtype`` activation shifted by ``by`` (0 or +-128)."""
    return a_dtype if not by else ("int8" if by > 0 else "uint8")


def shifted(v, by: int):
    """The TE expression ``v - by`` (``by`` 0 or +-128), for +-128 in the other 8-bit type:
    the same bits with the sign bit flipped."""
    from tvm import tirx

    if by == 0:
        return v
    sign = tirx.const(-128 if str(v.dtype) == "int8" else 128, v.dtype)  # the bit 0x80
    return tirx.reinterpret(shifted_type(str(v.dtype), by), tirx.bitwise_xor(v, sign))


def can_saturate(options: dict, wq: np.ndarray) -> bool:
    """Whether a weight packed by fours (``wq[..., 4]``, each four one output lane's
    consecutive k) can saturate the target's dot: some pair's ``|w0| + |w1| > 128`` on a
    ``vpmaddubsw`` target (never on VNNI)."""
    if options.get("u8_dot") not in targets.INT8_DOT_SATURATES:
        return False
    w = np.abs(wq.astype(np.int32))
    return bool((w[..., 0::2] + w[..., 1::2] > 128).any())


def record(report, rewritten: list, form: list, rule: str, rule_u8: str) -> None:
    """Count a packing pass's rewritten vars under ``rule`` (i16 pairs) or ``rule_u8`` (u8 x
    s8 fours) and name their nodes; ``form`` holds (var, by fours, can saturate) per
    rewrite.  Kernels that can saturate are counted under :data:`SATURATING`."""
    def quads(v):
        return any(f[0].same_as(v) and f[1] for f in form)

    record_calls(report, rule, [v for v in rewritten if not quads(v)])
    record_calls(report, rule_u8, [v for v in rewritten if quads(v)])
    saturating = sum(1 for f in form if f[2])
    if saturating:
        report.rewrites[SATURATING] = saturating


def rewrite(mod, report, op_name: str, packed, options: dict, rule: str, rule_u8: str):
    """Both packing passes' rewrite: each ``op_name`` call ``packed(mutator, dataflow, call,
    options)`` accepts ((expression, by fours, can saturate) or None) is replaced, and the
    rewrites are recorded by :func:`record`."""
    df = Dataflow(mod)
    form = []  # (replaced var, u8 x s8 layout, can saturate)

    def replace(m, call):
        got = packed(m, df, call, options)
        if got is None:
            return None
        form.append((m.binding.var, *got[1:]))
        return got[0]

    out, rewritten = rewrite_calls(mod, op_name, replace)
    record(report, rewritten, form, rule, rule_u8)
    return out
