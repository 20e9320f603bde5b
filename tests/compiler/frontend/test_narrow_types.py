"""Narrow element types (bfloat16, float8, float4e2m1, int4/uint4/int2/uint2) as codes:
the TIR codecs bit for bit against ml_dtypes / onnx, and compiled models against
onnx.reference on ml_dtypes arrays (compiler/frontend/narrow_types.py, narrow_import.py,
converters_narrow.py, runtime/session.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tvm import te

import compiler
import runtime
from compiler.frontend import narrow_types as nt
from compiler.errors import UnsupportedError

OPSET = 25


def _kernel(fn, in_dtype: str, n: int):
    x = te.placeholder((n,), in_dtype, name="x")
    mod = tvm.compile(tvm.IRModule({"main": te.create_prim_func([x, fn(x)])}), target="llvm")

    def run(arr, out_dtype):
        out = tvm.runtime.empty(arr.shape, out_dtype)
        mod["main"](tvm.runtime.tensor(arr), out)
        return out.numpy()
    return run


def _floats() -> np.ndarray:
    """Random bit patterns, specials, and every narrow value with its midpoints and
    neighbours (ties, subnormals, overflow thresholds)."""
    rng = np.random.default_rng(0)
    bits = [rng.integers(0, 2 ** 32, 50000, dtype=np.uint64).astype(np.uint32),
            np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                      0x7F800001, 0x7FFFFFFF, 1, 0x00400000, 0x007FFFFF, 0x7F7FFFFF],
                     np.uint32)]
    bf = np.arange(0, 65536, 7, dtype=np.uint32) << 16
    bits += [bf + d for d in (0, 0x7FFF, 0x8000, 0x8001)]
    vals = [np.concatenate(bits).view(np.float32)]
    for fmt in nt.FORMATS.values():
        if fmt.kind != "float":
            continue
        v = np.arange(1 << fmt.bits, dtype=np.uint8).view(getattr(ml_dtypes, fmt.ml_dtype))
        v = np.unique(v.astype(np.float32)[np.isfinite(v.astype(np.float32))])
        mid = (v[1:] + v[:-1]) / 2
        vals += [v, mid, np.nextafter(mid, np.float32(np.inf)),
                 np.nextafter(mid, np.float32(-np.inf)), v * np.float32(1.5)]
    return np.concatenate(vals).astype(np.float32)


X = _floats()


@pytest.mark.parametrize("fmt", list(nt.FORMATS.values()), ids=lambda f: f.name)
def test_decode_every_code(fmt):
    ml = getattr(ml_dtypes, fmt.ml_dtype)
    codes = np.arange(1 << (16 if fmt.kind == "bf16" else fmt.bits)).astype(fmt.storage)
    got = _kernel(lambda x: nt.decode_te(x, fmt), fmt.storage, codes.size)(
        codes, "int32" if fmt.kind == "int" else "float32")
    want = codes.view(ml).astype(np.int32 if fmt.kind == "int" else np.float32)
    if fmt.kind == "int":
        np.testing.assert_array_equal(got, want)
        return
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("fmt", [f for f in nt.FORMATS.values() if f.is_float],
                         ids=lambda f: f.name)
def test_encode_matches_reference(fmt, saturate):
    ml = getattr(ml_dtypes, fmt.ml_dtype)
    modes = nt.ROUND_MODES if fmt.kind == "e8m0" else ("up",)
    for mode in modes:
        got = _kernel(lambda x: nt.encode_te(x, fmt, saturate, mode), "float32", X.size)(
            X, fmt.storage)
        with np.errstate(all="ignore"):
            if fmt.kind == "e8m0":
                want = numpy_helper.to_float8e8m0(X, saturate, mode).view(np.uint8)
            elif saturate and fmt.kind == "float" and fmt.bits == 8:
                want = numpy_helper.saturate_cast(X, ml).view(fmt.storage)
            else:
                want = X.astype(ml).view(fmt.storage)
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, (mode, X[bad[:5]], got[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("src", ["float32", "float64", "float16", "int64", "int8"])
@pytest.mark.parametrize("fmt", [f for f in nt.FORMATS.values() if not f.is_float],
                         ids=lambda f: f.name)
def test_encode_int_matches_ml_dtypes(fmt, src):
    rng = np.random.default_rng(1)
    if np.dtype(src).kind == "f":
        with np.errstate(all="ignore"):
            xs = np.concatenate([X, rng.uniform(-40, 40, 2000)]).astype(src)
    else:
        info = np.iinfo(src)
        xs = rng.integers(info.min, info.max, 5000, dtype=src, endpoint=True)
    got = _kernel(lambda x: nt.encode_te(x, fmt), src, xs.size)(xs, "uint8")
    with np.errstate(all="ignore"):
        want = xs.astype(getattr(ml_dtypes, fmt.ml_dtype)).view(np.uint8)
    np.testing.assert_array_equal(got, want)


# -- compiled models ---------------------------------------------------------------------

def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "narrow", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _check(model, feeds):
    want = ReferenceEvaluator(model).run(None, feeds)
    got = compiler.compile(model).session().run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
    return got


def test_cast_round_trip_through_float8_in_one_graph():
    """Cast(float -> e4m3fn, saturate 0) -> Cast(-> float): both in compiled kernels."""
    m = _model([helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E4M3FN,
                                 saturate=0),
                helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT),
                helper.make_node("Cast", ["q"], ["h"], to=TensorProto.BFLOAT16)],
               [_vi("x", TensorProto.FLOAT, [64])],
               [_vi("y", TensorProto.FLOAT, [64]), _vi("h", TensorProto.BFLOAT16, [64])])
    x = np.random.default_rng(2).standard_normal(64).astype(np.float32) * 100
    x[:4] = [np.inf, -np.inf, 1e6, 0.001953125 * 1.5]
    got = compiler.compile(m).session().run(None, {"x": x})
    want = x.astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(got[0], want.astype(np.float32))
    assert got[1].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got[1].astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("to", [TensorProto.INT4, TensorProto.UINT2, TensorProto.FLOAT4E2M1,
                                TensorProto.FLOAT8E5M2FNUZ])
def test_cast_from_float16_matches_reference(to):
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=to)],
               [_vi("x", TensorProto.FLOAT16, [3, 5])], [_vi("y", to, [3, 5])])
    x = np.array([0.5, -7.6, 8.4, 1e4, -0.0, 2.5, 3.5, 15, -3, np.nan, np.inf, -np.inf, 6.5,
                  0.25, 1.75], np.float16).reshape(3, 5)
    _check(m, {"x": x})


def test_castlike_between_narrow_types():
    m = _model([helper.make_node("CastLike", ["x", "like"], ["y"])],
               [_vi("x", TensorProto.BFLOAT16, [8]), _vi("like", TensorProto.INT4, [1])],
               [_vi("y", TensorProto.INT4, [8])])
    x = np.array([-9, -8.5, -1, 0, 1.5, 7, 7.9, 300], ml_dtypes.bfloat16)
    _check(m, {"x": x, "like": np.zeros(1, ml_dtypes.int4)})


def test_quantize_dequantize_int4_per_axis():
    zp = helper.make_tensor("zp", TensorProto.INT4, [3], [1, -2, 0])
    m = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=0),
                helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=0)],
               [_vi("x", TensorProto.FLOAT, [3, 4]), _vi("s", TensorProto.FLOAT, [3])],
               [_vi("q", TensorProto.INT4, [3, 4]), _vi("y", TensorProto.FLOAT, [3, 4])],
               [zp])
    x = np.array([[0, 5, -5, 3], [-30, 20, 2.5, -2.5], [7, 1, -1, 100]], np.float32)
    _check(m, {"x": x, "s": np.array([2, 1, 0.5], np.float32)})


def test_quantize_float8_no_saturate_and_dequantize_float16():
    m = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], saturate=0),
                helper.make_node("DequantizeLinear", ["q", "s16"], ["y"])],
               [_vi("x", TensorProto.FLOAT, [6]), _vi("s", TensorProto.FLOAT, []),
                _vi("zp", TensorProto.FLOAT8E5M2, []), _vi("s16", TensorProto.FLOAT16, [])],
               [_vi("q", TensorProto.FLOAT8E5M2, [6]), _vi("y", TensorProto.FLOAT16, [6])])
    feeds = {"x": np.array([0, 1, 3, 1e6, -200, np.inf], np.float32),
             "s": np.array(2, np.float32), "zp": np.array(0, ml_dtypes.float8_e5m2),
             "s16": np.array(0.1, np.float16)}
    _check(m, feeds)


def test_bfloat16_matmul_on_float32_values():
    m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
               [_vi("a", TensorProto.BFLOAT16, [4, 8]), _vi("b", TensorProto.BFLOAT16, [8, 3])],
               [_vi("y", TensorProto.BFLOAT16, [4, 3])])
    rng = np.random.default_rng(3)
    _check(m, {"a": rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal((8, 3)).astype(ml_dtypes.bfloat16)})


def test_ops_that_cannot_be_exact_are_refused():
    """Softmax's reference rounds intermediates to bfloat16; Pad of int4 codes is not
    among the ops that run on codes: both refused, naming the node."""
    soft = _model([helper.make_node("Softmax", ["x"], ["y"], name="sm")],
                  [_vi("x", TensorProto.BFLOAT16, [4])], [_vi("y", TensorProto.BFLOAT16, [4])])
    pads = helper.make_tensor("p", TensorProto.INT64, [2], [1, 1])
    pad = _model([helper.make_node("Pad", ["x", "p"], ["y"], name="pd")],
                 [_vi("x", TensorProto.INT4, [4])], [_vi("y", TensorProto.INT4, [6])], [pads])
    for m, name in ((soft, "sm"), (pad, "pd")):
        with pytest.raises(UnsupportedError, match=f"'{name}'.*not supported"):
            compiler.compile(m)


def test_session_types_and_feed_checks(tmp_path):
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT4),
                helper.make_node("Identity", ["x"], ["z"])],
               [_vi("x", TensorProto.BFLOAT16, [2, 3])],
               [_vi("y", TensorProto.UINT4, [2, 3]), _vi("z", TensorProto.BFLOAT16, [2, 3])])
    cm = compiler.compile(m)
    x = np.array([[1, 2.5, 15], [16, -1, 0.5]], ml_dtypes.bfloat16)
    for sess in (cm.session(), runtime.load(cm.export(str(tmp_path / "narrow.so")))):
        assert [a.type for a in sess.get_inputs()] == ["tensor(bfloat16)"]
        assert [a.type for a in sess.get_outputs()] == ["tensor(uint4)", "tensor(bfloat16)"]
        y, z = sess.run(None, {"x": x})
        assert y.dtype == ml_dtypes.uint4 and z.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(y.astype(np.int32), x.astype(ml_dtypes.uint4).astype(
            np.int32))
        np.testing.assert_array_equal(z.view(np.uint16), x.view(np.uint16))
        with pytest.raises(ValueError, match=r"tensor\(bfloat16\)"):
            sess.run(None, {"x": x.astype(np.float32)})


def test_dynamic_model_with_a_narrow_input_reports_and_runs_it():
    """A symbolic-dimension model specialises per shape; its session names the narrow type
    as ONNX does and takes / converts ml_dtypes arrays like a compiled session."""
    import ml_dtypes
    from onnx import TensorProto, helper

    import compiler

    g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    sess = compiler.compile(m).session()
    assert [a.type for a in sess.get_inputs()] == ["tensor(float8e4m3fn)"]
    x = np.array([[0.5, -3, 448], [1e-3, 17, -0.0]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, x.astype(np.float32))
