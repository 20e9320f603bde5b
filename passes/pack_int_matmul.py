"""matmul(int32(a) - int32(za), W) => matmul_int_packed(int16(a) - int16(za), pack(W)).

MatMulInteger (TVM's converter: ``matmul(astype(a, i32) - astype(za, i32), astype(b, i32) -
zb, out_dtype=i32)``) with a constant B: ``W = b - zb`` is evaluated here (fold_constants
leaves the scalar zero point's cast) and packed once into ``[N/nr, K/2, nr, 2]`` panels of
int8 (int16 when ``b - zb`` leaves the int8 range: u8 weights with a zero point), the
layout of the CPU rule ``cpu.matmul_int8``'s inner step (``vpmaddwd``: two k of one column
per i32 lane, operands i16).  Since that step takes i16 operands anyway, the activation's
zero point is subtracted while widening it (``a16 = int16(a) - int16(za)``, M x K
subtractions, a stage of the same kernel) rather than corrected afterwards with row /
column sums (``sum a W - za sum W``, M x N work in the epilogue and one more constant): the
products are exact either way (|a - za| <= 255, |W| <= 255, a pair sums to < 2^17).  B's
zero point is already in W, so its ``zb sum_k a`` term never arises.  An odd K gets a zero
row in W and a zero column in ``a16``; N not a multiple of ``panel`` zero columns, and an
M with no register-tile divisor (197) zero rows in ``a16``, both dropped by a second stage.  FuseOps then fuses the dequantisation (cast, scale multiply, bias add)
after the matmul: one f32 kernel per MatMulInteger.  Runs after fold_constants.

On targets with an 8-bit dot (option ``u8_dot``, set by the driver from the target: see
passes/int8_quads.py) an 8-bit activation by a weight that fits s8 is not widened: W is
packed ``[N/nr, K/4, nr, 4]`` (int8, four k per column), the activation stays 8-bit (a copy
stage pads K to fours and M to the tile, and flips its sign bit where the dot takes the
other 8-bit type), and the zero point is corrected after the sum, ``acc - (za - shift) *
colsum(W)`` (``colsum`` a constant per column), fused into the write-back.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from . import int8_quads
from .context import GraphPass, PassReport
from .pack_matmul_weights import padded_rows

RULE = "matmul(int32(a) - int32(za), W) => matmul_int_packed(int16(a) - int16(za), [N/nr, K/2, nr, 2](W))"
RULE_U8 = ("matmul(int32(a) - int32(za), W) => matmul_u8s8_packed(8-bit a - shift, "
           "[N/nr, K/4, nr, 4](W)) - (za - shift) * colsum(W)")
_BYTE = ("uint8", "int8")


class PackIntMatmul(GraphPass):
    """int32 matmul of a widened 8-bit activation by a constant weight => packed integer
    kernel (the activation widened to i16 minus its zero point inside it)."""

    name = "pack_int_matmul"
    opt_level = 2
    options = {"panel": 16, **int8_quads.OPTIONS}

    def rewrite(self, mod, report: PassReport, options: dict):
        return int8_quads.rewrite(mod, report, "relax.matmul", _packed, options, RULE, RULE_U8)


def matmul_int_packed(a, za, wp, n: int, rows: int = 1):
    """TE compute.  ``a16[.., i, k] = int16(a[.., i, k]) - int16(za)`` (0 for k >= K, K odd,
    and for i >= M when ``rows`` > 1 pads M up to a multiple of it), then ``out[.., i, j] =
    sum_{ko, ki} int32(a16[.., i, 2 ko + ki]) * int32(wp[j // nr, ko, j % nr, ki])``; a
    second stage drops the padded rows and the last panel's zero columns (j >= ``n``).
    ``za`` is a scalar tensor or None."""
    *bat, m, kk = a.shape
    no, k2, nr, _ = (int(d) for d in wp.shape)
    kk = int(kk)
    m, mp, padded = padded_rows(m, rows)

    def widen(*idx):
        i, k = idx[-2:]
        v = a[(*idx[:-2], te.min(i, m - 1) if padded else i, k)].astype("int16")
        if za is not None:
            v = v - za().astype("int16")
        inside = [c for c, pad in ((k < kk, kk != 2 * k2), (i < m, padded)) if pad]
        if not inside:
            return v
        cond = inside[0] if len(inside) == 1 else tvm.tirx.all(*inside)
        return te.if_then_else(cond, v, tvm.tirx.const(0, "int16"))

    a16 = te.compute((*bat, mp, 2 * k2), widen, name="matmul_int_a16")
    ko = te.reduce_axis((0, k2), "ko")
    ki = te.reduce_axis((0, 2), "ki")
    acc = te.compute(
        (*bat, mp, no * nr),
        lambda *idx: te.sum(
            a16[(*idx[:-1], ko * 2 + ki)].astype("int32")
            * wp[te.indexdiv(idx[-1], nr), ko, te.indexmod(idx[-1], nr), ki].astype("int32"),
            axis=[ko, ki]),
        name="matmul_int")
    if n == no * nr and not padded:
        return acc
    return te.compute((*bat, m, n), lambda *idx: acc[idx], name="matmul_int_cut")


# A symbolic M's row padding: a multiple of cpu.matmul_int8's register tiles (6 rows on
# AVX-512's 6 x 4-vector tile, 6 or 3 on AVX2), which the rule proves divides the rows
SYMBOLIC_ROWS = 6


def matmul_u8s8_packed(a, za, wq, colsum, n: int, rows: int = 1, shift: int = 0):
    """TE compute.  ``a8[.., i, k] = a[.., i, k] - shift`` (``a`` u8 or s8; ``shift`` +-128
    turns it into the other 8-bit type, int8_quads.shift; 0 for k >= K up to whole fours,
    row ``M - 1`` again for i >= M when ``rows`` pads M), then ``acc[.., i, j] = sum_{ko,
    ki} int32(a8[.., i, 4 ko + ki]) * int32(wq[j // nr, ko, j % nr, ki])`` and ``out = acc
    - (int32(za) - shift) * colsum[j]`` for i < M, j < ``n`` (``za`` a scalar tensor or
    None: a zero point of 0)."""
    *bat, m, kk = a.shape
    no, k4, nr, _ = (int(d) for d in wq.shape)
    kk = int(kk)
    m, mp, padded = padded_rows(m, rows)
    dtype = int8_quads.shifted_type(str(a.dtype), shift)

    def copy(*idx):
        i, k = idx[-2:]
        v = int8_quads.shifted(a[(*idx[:-2], te.min(i, m - 1) if padded else i, k)], shift)
        if kk == 4 * k4:
            return v
        return te.if_then_else(k < kk, v, tvm.tirx.const(0, dtype))

    a8 = te.compute((*bat, mp, 4 * k4), copy, name="matmul_int_a8")
    ko = te.reduce_axis((0, k4), "ko")
    ki = te.reduce_axis((0, 4), "ki")
    acc = te.compute(
        (*bat, mp, no * nr),
        lambda *idx: te.sum(
            a8[(*idx[:-1], ko * 4 + ki)].astype("int32")
            * wq[te.indexdiv(idx[-1], nr), ko, te.indexmod(idx[-1], nr), ki].astype("int32"),
            axis=[ko, ki]),
        name="matmul_int")
    if za is None and not shift:
        if n == no * nr and not padded:
            return acc
        return te.compute((*bat, m, n), lambda *idx: acc[idx], name="matmul_int_cut")

    def zero_point():
        z = tvm.tirx.const(0, "int32") if za is None else za().astype("int32")
        return z - shift if shift else z

    return te.compute((*bat, m, n),
                      lambda *idx: acc[idx] - zero_point() * colsum[idx[-1]],
                      name="matmul_int_zp")


def pack_quads(w: np.ndarray, nr: int) -> np.ndarray:
    """W [K, N] (values in int8) -> wq [ceil(N/nr), ceil(K/4), nr, 4] int8: ``wq[jo, ko, ji,
    ki] = W[4 ko + ki, jo nr + ji]``; zero columns up to whole panels, zero rows up to whole
    fours of k."""
    k, n = w.shape
    np_, kp = -(-n // nr) * nr, -(-k // 4) * 4
    w = np.pad(w, ((0, kp - k), (0, np_ - n)))
    wq = w.reshape(kp // 4, 4, np_ // nr, nr).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(wq.astype(np.int8))


def pad_rows(m: int) -> int:
    """4 when M > 12 has no divisor in 4..6 (37, 197: the rule's register tile takes a
    divisor of M within its 12 accumulators and would fall to 1-row tiles), else 1."""
    if m <= 12 or any(m % d == 0 for d in range(4, 7)):
        return 1
    return 4


def pack_int(w: np.ndarray, nr: int) -> np.ndarray:
    """W [K, N] -> wp [ceil(N/nr), ceil(K/2), nr, 2]: ``wp[jo, ko, ji, ki] = W[2 ko + ki, jo
    nr + ji]``, int8 when every value fits, else int16; zero columns up to whole panels, a
    zero row for odd K."""
    k, n = w.shape
    np_, kp = -(-n // nr) * nr, -(-k // 2) * 2
    w = np.pad(w, ((0, kp - k), (0, np_ - n)))
    dtype = np.int8 if w.min() >= -128 and w.max() <= 127 else np.int16
    wp = w.reshape(kp // 2, 2, np_ // nr, nr).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(wp.astype(dtype))


def _activation(df, x):
    """(a, za or None) when ``x`` is ``astype(a, i32) - za`` or ``astype(a, i32)`` with ``a``
    8-bit and ``za`` a one-element tensor: ``astype(z, i32)`` of an 8-bit ``z`` (a ``[1]``
    one reshaped, as ("reshape", z)), or an integer constant (as a numpy scalar of ``a``'s
    type); else None."""
    za = None
    sub = df.call(x, "subtract")
    if sub is not None:
        x, z = sub.args
        zc = df.call(z, "astype")
        z = zc.args[0] if zc is not None else z
        inner = df.call(z, "reshape")
        if inner is not None and _size(inner.args[0]) == 1:
            z = inner.args[0]
        shape = _static(z)
        if shape is None or int(np.prod(shape)) != 1:
            return None
        if str(z.ty.dtype) in _BYTE:
            za = z if not shape else ("reshape", z)
        else:
            za = _int_const(df, z)
            if za is None:
                return None
            za = int(za.reshape(-1)[0])
    cast = df.call(x, "astype")
    if cast is None or str(cast.args[0].ty.dtype) not in _BYTE:
        return None
    a = cast.args[0]
    if isinstance(za, int):
        info = np.iinfo(str(a.ty.dtype))
        if not info.min <= za <= info.max:
            return None
        za = np.array(za, str(a.ty.dtype))
    return a, za


def _size(x):
    shape = _static(x)
    return None if shape is None else int(np.prod(shape))


def _int_const(df, x, depth: int = 0):
    """The integer value of ``x`` when it is a constant, or int casts, subtractions,
    reshapes and expand_dims of constants (``astype(b, i32) - astype(zb, i32)``: the
    scalar cast may be left unfolded), as int64; else None."""
    c = df.const(x)
    if c is not None:
        return c.astype(np.int64) if np.issubdtype(c.dtype, np.integer) else None
    if depth > 4:
        return None
    v = df.call(x, "astype", "subtract", "expand_dims", "reshape")
    if v is None:
        return None
    args = [_int_const(df, a, depth + 1) for a in v.args[:2 if v.op.name == "relax.subtract"
                                                         else 1]]
    if any(a is None for a in args):
        return None
    shape = _static(v)
    if v.op.name == "relax.subtract":
        out = args[0] - args[1]
    elif v.op.name == "relax.astype" and str(v.ty.dtype) in ("int32", "int16"):
        out = args[0]
    elif v.op.name in ("relax.expand_dims", "relax.reshape") and shape is not None:
        out = args[0].reshape(shape)
    else:
        return None
    return out if shape is not None and list(out.shape) == shape else None


def _static(x):
    shape = getattr(x.ty, "shape", None)
    if shape is None or any(not isinstance(d, tvm.tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def _packed(m, df, call, options: dict):
    """(``call`` (an int32 relax.matmul) as matmul_u8s8_packed or matmul_int_packed, emitted
    through ``m`` (rewrite_calls' mutator), whether it took the u8 x s8 form, whether that
    can saturate); None when it does not qualify."""
    panel = int(options["panel"])
    if str(call.ty.dtype) != "int32" or len(call.args) != 2:
        return None
    x, weight = call.args
    w = _int_const(df, weight)
    if w is None or w.ndim != 2:
        return None
    act = _activation(df, x)
    if act is None:
        return None
    a, za = act
    shape = getattr(a.ty, "shape", None)
    shape = list(shape.values) if shape is not None and hasattr(shape, "values") else None
    # K static; M and batch dims may be symbolic (a dynamic export's batch x seq tokens)
    if (shape is None or len(shape) < 2 or not isinstance(shape[-1], tvm.tirx.IntImm)
            or int(shape[-1]) != w.shape[0] or w.shape[0] < 2):
        return None
    rows = pad_rows(int(shape[-2])) if isinstance(shape[-2], tvm.tirx.IntImm) \
        else SYMBOLIC_ROWS
    if np.abs(w).max(initial=0) > 32767:  # not an 8-bit weight minus its zero point
        return None
    quads = int8_quads.use_quads(options, str(a.ty.dtype), w)
    a = m.visit_expr(a)
    if isinstance(za, tuple):
        za = m.builder_.emit(relax.op.reshape(m.visit_expr(za[1]), []))
    elif isinstance(za, np.ndarray):
        za = relax.const(za)
    elif za is not None:
        za = m.visit_expr(za)
    if quads:
        wq = pack_quads(w, panel)
        colsum = relax.const(w.sum(axis=0).astype(np.int32))
        by, _ = int8_quads.shift(options, str(a.ty.dtype))
        out = m.builder_.call_te(matmul_u8s8_packed, a, za, relax.const(wq), colsum,
                                 int(w.shape[1]), rows, by, primfunc_name_hint="matmul_integer")
        return out, True, int8_quads.can_saturate(options, wq)
    wp = pack_int(w, panel)
    out = m.builder_.call_te(matmul_int_packed, a, za, relax.const(wp), int(w.shape[1]),
                             rows, primfunc_name_hint="matmul_integer")
    return out, False, False
