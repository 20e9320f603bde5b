"""When the integer packing passes (pack_int_matmul, pack_int_conv) lay weights out by fours
for the u8 x s8 dot, and whether a kernel's products can saturate there.

The target's ``int8_dot`` (targets.int8_dot, set as the passes' ``u8_dot`` option by the
compile driver) multiplies u8 activations by s8 weights four at a time into each i32 lane:
``vpdpbusd`` on AVX512-VNNI / AVX-VNNI sums the four products in int32 (exact);
``vpmaddubsw`` on AVX2 / AVX-512BW first sums each pair ``a[2p] w[2p] + a[2p+1] w[2p+1]``
into int16 with saturation, as onnxruntime's AVX2 kernel does.  With ``a`` in [0, 255] a
pair cannot saturate when ``|w[2p]| + |w[2p+1]| <= 128`` (255 * 128 = 32640), which holds
for every weight quantized with ``reduce_range`` (7-bit) or in [-64, 64]; the passes check
this per kernel at compile time and report the kernels that can saturate.  Option
``exact`` keeps such targets on the exact i16 pair path (``vpmaddwd``: activations widened
to i16 minus their zero point, half the products per instruction).
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
    already subtracted) takes the u8 x s8 layout: the target has a u8 x s8 dot, the
    activation is u8, every weight fits s8, and ``exact`` does not ask to avoid a
    saturating dot."""
    kind = options.get("u8_dot") or ""
    if not kind or a_dtype != "uint8" or w.size == 0 or w.min() < -128 or w.max() > 127:
        return False
    return not (options.get("exact") and kind in targets.INT8_DOT_SATURATES)


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
