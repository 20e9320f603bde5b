"""Narrow ONNX element types as raw codes: formats, and bit-exact decode / encode in TIR.

Inside a compiled graph a narrow tensor is a tensor of its *storage* dtype holding each
element's bit code, exactly as ``ml_dtypes`` stores it: bfloat16 in ``uint16``, every 8-,
4- and 2-bit type in ``uint8`` (one element per byte, the code in the low bits; an int4
-1 is the byte 15).  Converters turn codes into float32 / int32 values and back with the
compute functions below, so the conversions run in the model's own kernels.

Encoding float32 -> a narrow float rounds to nearest, ties to even, through subnormals,
as ``ml_dtypes`` and the ONNX spec's conversion tables do; ``saturate`` (ONNX ``Cast``'s
attribute, float8 only) clamps what would overflow to the largest finite value instead of
inf / NaN.  float8e8m0 follows ``onnx.numpy_helper.to_float8e8m0`` (its ``round_mode``
and ``saturate``; the sign is dropped).  Encoding to int4/uint4/int2/uint2 truncates
toward zero and wraps, as ``ml_dtypes``'s ``astype`` does (NaN, inf and values past
int32 give 0); quantization (rounding and clamping) is the converter's business.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import TensorProto


@dataclass(frozen=True)
class Format:
    """One narrow element type.

    ``kind`` is ``"float"`` (sign, ``ebits`` exponent, ``mbits`` mantissa, ``bias``),
    ``"bf16"``, ``"e8m0"`` (unsigned power of two) or ``"int"`` (``bits`` wide,
    ``signed``).  ``overflow`` says what a finite value past the largest one becomes when
    not saturating: ``"inf"``, ``"nan"`` or ``"saturate"`` (no inf / NaN codes at all).
    ``nan`` is the NaN code of a positive NaN (``-1``: the sign is kept, see ``encode``;
    ``None``: none), ``fnuz`` marks the formats whose only NaN is the negative-zero code.
    """

    name: str            # ONNX-style name, as in tensor(<name>)
    elem_type: int       # onnx.TensorProto data type
    ml_dtype: str        # attribute of ml_dtypes holding the numpy dtype
    storage: str         # dtype of the codes inside the graph
    kind: str
    bits: int
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    overflow: str = "saturate"
    nan: int | None = None
    fnuz: bool = False
    signed: bool = True
    max_code: int = 0    # magnitude code of the largest finite value

    @property
    def is_float(self) -> bool:
        return self.kind != "int"


FORMATS = {f.elem_type: f for f in (
    Format("bfloat16", TensorProto.BFLOAT16, "bfloat16", "uint16", "bf16", 16, 8, 7, 127,
           "inf"),
    Format("float8e4m3fn", TensorProto.FLOAT8E4M3FN, "float8_e4m3fn", "uint8", "float", 8,
           4, 3, 7, "nan", nan=0x7F, max_code=0x7E),
    Format("float8e4m3fnuz", TensorProto.FLOAT8E4M3FNUZ, "float8_e4m3fnuz", "uint8",
           "float", 8, 4, 3, 8, "nan", nan=0x80, fnuz=True, max_code=0x7F),
    Format("float8e5m2", TensorProto.FLOAT8E5M2, "float8_e5m2", "uint8", "float", 8, 5, 2,
           15, "inf", nan=0x7E, max_code=0x7B),
    Format("float8e5m2fnuz", TensorProto.FLOAT8E5M2FNUZ, "float8_e5m2fnuz", "uint8",
           "float", 8, 5, 2, 16, "nan", nan=0x80, fnuz=True, max_code=0x7F),
    Format("float8e8m0", TensorProto.FLOAT8E8M0, "float8_e8m0fnu", "uint8", "e8m0", 8, 8, 0,
           127, "nan", nan=0xFF, signed=False, max_code=0xFE),
    Format("float4e2m1", TensorProto.FLOAT4E2M1, "float4_e2m1fn", "uint8", "float", 4, 2, 1,
           1, "saturate", max_code=0x7),
    Format("int4", TensorProto.INT4, "int4", "uint8", "int", 4),
    Format("uint4", TensorProto.UINT4, "uint4", "uint8", "int", 4, signed=False),
    Format("int2", TensorProto.INT2, "int2", "uint8", "int", 2),
    Format("uint2", TensorProto.UINT2, "uint2", "uint8", "int", 2, signed=False),
)}

ROUND_MODES = ("up", "down", "nearest")   # float8e8m0's round_mode attribute


def fmt_of(elem_type) -> Format | None:
    """The narrow format of an ONNX element type, or None for the others."""
    return FORMATS.get(elem_type)


# -- scalar TIR expressions ----------------------------------------------------------------

def _u(v):
    from tvm import tirx

    return tirx.const(v, "uint32")


def _sel(c, a, b):
    from tvm import tirx

    return tirx.Select(c, a, b)


def _rne_shift(v, sh):
    """round(v / 2**sh), ties to even, for uint32 ``v`` and 1 <= ``sh`` <= 31 (v < 2**31)."""
    half_minus_1 = (_u(1) << (sh - _u(1))) - _u(1)
    return (v + half_minus_1 + ((v >> sh) & _u(1))) >> sh


def decode_value(fmt: Format, code):
    """The value of a code (storage dtype): float32 for float formats, int32 for ints."""
    from tvm import tirx

    c = tirx.Cast("uint32", code)
    f32 = lambda bits: tirx.reinterpret("float32", bits)  # noqa: E731
    if fmt.kind == "int":
        low = tirx.Cast("int32", c & _u((1 << fmt.bits) - 1))
        if not fmt.signed:
            return low
        top = 1 << (fmt.bits - 1)
        return (low ^ tirx.const(top, "int32")) - tirx.const(top, "int32")
    if fmt.kind == "bf16":
        return f32(c << _u(16))
    if fmt.kind == "e8m0":  # 2**(code - 127); code 0 is 2**-127 (a float32 subnormal)
        return f32(_sel(c == _u(0xFF), _u(0x7FC00000),
                        _sel(c == _u(0), _u(0x00400000), c << _u(23))))
    m, n = fmt.mbits, fmt.bits
    sign = ((c >> _u(n - 1)) & _u(1)) << _u(31)
    mag = c & _u((1 << (n - 1)) - 1)
    e, mant = mag >> _u(m), mag & _u((1 << m) - 1)
    normal = ((e + _u(127 - fmt.bias)) << _u(23)) | (mant << _u(23 - m))
    sub = tirx.reinterpret("uint32", tirx.Cast("float32", mant)
                           * tirx.const(2.0 ** (1 - fmt.bias - m), "float32"))
    bits = _sel(e == _u(0), sub, normal) | sign
    if fmt.overflow == "inf":  # IEEE-like: all-ones exponent is inf / NaN
        top = _u((1 << fmt.ebits) - 1)
        bits = _sel(e == top, _sel(mant == _u(0), _u(0x7F800000), _u(0x7FC00000)) | sign,
                    bits)
    elif fmt.fnuz:
        bits = _sel(c == _u(0x80), _u(0x7FC00000), bits)
    elif fmt.nan is not None:
        bits = _sel(mag == _u(fmt.nan), _u(0x7FC00000) | sign, bits)
    return f32(bits)


def encode_float(fmt: Format, x, saturate: bool = True, round_mode: str = "up"):
    """The code (storage dtype) of float32 ``x`` in float format ``fmt``."""
    from tvm import tirx

    u = tirx.reinterpret("uint32", x)
    out = lambda v: tirx.Cast(fmt.storage, v)  # noqa: E731
    if fmt.kind == "bf16":
        nan = ((u >> _u(16)) & _u(0x8000)) | _u(0x7FC0)  # ml_dtypes drops the payload
        return out(_sel((u & _u(0x7FFFFFFF)) > _u(0x7F800000), nan,
                        (u + _u(0x7FFF) + ((u >> _u(16)) & _u(1))) >> _u(16)))
    if fmt.kind == "e8m0":
        return out(_encode_e8m0(u, saturate, round_mode))
    n, m, bias = fmt.bits, fmt.mbits, fmt.bias
    sign = u >> _u(31)
    a = u & _u(0x7FFFFFFF)
    e = a >> _u(23)
    # normal in the target: re-bias the exponent, round the mantissa to m bits
    normal = _rne_shift(a - _u((127 - bias) << 23), _u(23 - m))
    # subnormal in the target: the 24-bit significand over the target's smallest step
    frac = a & _u(0x7FFFFF)
    sig = _sel(e == _u(0), frac, frac | _u(0x800000))
    e1 = tirx.max(tirx.Cast("int32", e), tirx.const(1, "int32"))
    sh = tirx.min(tirx.const(151 - bias - m, "int32") - e1, tirx.const(31, "int32"))
    sub = _rne_shift(sig, tirx.Cast("uint32", sh))
    mag = _sel(e > _u(127 - bias), normal, sub)
    over = mag > _u(fmt.max_code)
    sat_or = saturate or fmt.overflow == "saturate"
    if fmt.overflow == "inf":
        big = _u(fmt.max_code) if sat_or else _u(fmt.max_code + 1)  # the inf code
    elif fmt.overflow == "nan":
        big = _u(fmt.max_code) if sat_or else _u(fmt.nan)
    else:
        big = _u(fmt.max_code)
    is_inf = a == _u(0x7F800000)
    is_nan = a > _u(0x7F800000)
    inf_code = big if (sat_or or fmt.overflow == "inf") else _u(fmt.nan)
    mag = _sel(is_inf, inf_code, _sel(over, big, mag))
    signed = mag | (sign << _u(n - 1))
    if fmt.fnuz:  # no negative zero; the NaN code 0x80 carries no sign
        code = _sel(mag == _u(0), _u(0), _sel(mag == _u(0x80), _u(0x80), signed))
        return out(_sel(is_nan, _u(0x80), code))
    if fmt.nan is None:  # float4e2m1: ml_dtypes writes NaN as a zero of the other sign
        return out(_sel(is_nan, (sign ^ _u(1)) << _u(n - 1), signed))
    return out(_sel(is_nan, _u(fmt.nan) | (sign << _u(n - 1)), signed))


def _encode_e8m0(u, saturate: bool, round_mode: str):
    """onnx.numpy_helper.to_float8e8m0 on float32 bits ``u``, bit for bit."""
    from tvm import tirx

    if round_mode not in ROUND_MODES:
        raise ValueError(f"round_mode {round_mode!r} is not one of {', '.join(ROUND_MODES)}")
    e = (u >> _u(23)) & _u(0xFF)
    if round_mode == "nearest":
        g = (u & _u(0x400000)) != _u(0)
        rest = tirx.any((u & _u(0x200000)) != _u(0), (u & _u(0x1FFFFF)) != _u(0),
                        e > _u(0))
        up = tirx.all(g, rest)
    elif round_mode == "up":
        up = (u & _u(0x7FFFFF)) != _u(0)
    else:
        up = tirx.const(False, "bool")
    if saturate:
        up = tirx.all(up, e != _u(0xFE))
    rounded = e + tirx.Cast("uint32", up)
    return _sel(e == _u(0xFF), _u(0xFF), rounded)


def encode_int(fmt: Format, x, dtype: str):
    """The code of ``x`` (of ``dtype``: any int or float) in int format ``fmt``: truncate
    toward zero, wrap to ``fmt.bits`` bits (NaN, inf and |x| >= 2**31 give 0, as ml_dtypes)."""
    from tvm import tirx

    if dtype.startswith("float"):
        if dtype == "float16":
            x = tirx.Cast("float32", x)
            dtype = "float32"
        ok = tirx.abs(x) < tirx.const(2.0 ** 31, dtype)  # False for NaN
        i = tirx.Cast("int32", _sel(ok, x, tirx.const(0.0, dtype)))
    else:
        i = tirx.Cast("int32", x)
    return tirx.Cast(fmt.storage, tirx.Cast("uint32", i) & _u((1 << fmt.bits) - 1))


# -- TE computes (for BlockBuilder.emit_te) --------------------------------------------------

def decode_te(x, fmt: Format, out_dtype: str | None = None):
    """Codes -> values (float32 / int32, or ``out_dtype`` by a plain cast of those)."""
    from tvm import te, tirx

    def f(*i):
        v = decode_value(fmt, x(*i))
        return v if out_dtype is None else tirx.Cast(out_dtype, v)

    return te.compute(x.shape, f, name=f"decode_{fmt.name}")


def encode_te(x, fmt: Format, saturate: bool = True, round_mode: str = "up"):
    """Values -> codes: float32 for float formats; any int / float dtype for int formats."""
    from tvm import te

    if fmt.is_float:
        if str(x.dtype) != "float32":
            raise ValueError(f"encode to {fmt.name} takes float32, got {x.dtype}")
        return te.compute(x.shape, lambda *i: encode_float(fmt, x(*i), saturate, round_mode),
                          name=f"encode_{fmt.name}")
    return te.compute(x.shape, lambda *i: encode_int(fmt, x(*i), str(x.dtype)), name=f"encode_{fmt.name}")


def decode(bb, x, fmt: Format, out_dtype: str | None = None):
    """Emit the decoding of Relax tensor ``x`` (codes of ``fmt``)."""
    return bb.emit_te(lambda t: decode_te(t, fmt, out_dtype), x,
                      primfunc_name_hint=f"decode_{fmt.name}")


def encode(bb, x, fmt: Format, saturate: bool = True, round_mode: str = "up"):
    """Emit the encoding of Relax tensor ``x`` into codes of ``fmt``."""
    return bb.emit_te(lambda t: encode_te(t, fmt, saturate, round_mode), x,
                      primfunc_name_hint=f"encode_{fmt.name}")
