"""compiler/lowering/legalize_hyperbolic.py: Sinh and Cosh build (TVM's tirx.sinh /
tirx.cosh do not), and match onnxruntime at large |x| (inf, never NaN), -0.0, NaN and tiny
x; float64 (which onnxruntime has no kernel for) against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import compiler
from compiler import lowering
from tests.conftest import ort_run

# around float32's overflow points: exp(88.72) and sinh/cosh(89.42) overflow
EDGES = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-8, -1e-8, 1e-3, -0.999, 0.999,
                  1.0, -1.0, 1.0001, 5.5, -5.5, 20.0, 88.5, -88.5, 88.9, -88.9, 89.3, -89.3,
                  89.5, -89.5, 100.0, -100.0, 1e30, -1e30], dtype=np.float32)


def _model(op, dtype, n):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], name=op.lower())], "g",
                          [helper.make_tensor_value_info("x", dtype, [n])],
                          [helper.make_tensor_value_info("y", dtype, [n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["Sinh", "Cosh"])
def test_float32_matches_onnxruntime(op):
    x = np.concatenate([EDGES, np.linspace(-30, 30, 100, dtype=np.float32)])
    m = _model(op, TensorProto.FLOAT, x.size)
    got = compiler.compile(m).session().run(None, {"x": x})[0]
    (want,) = ort_run(m, {"x": x})
    assert np.array_equal(np.isnan(got), np.isnan(want))           # NaN only from NaN
    assert np.array_equal(np.isinf(got), np.isinf(want))           # overflow where ORT's does
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)        # tiny x: relative too
    zero = x == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero]))  # sinh(-0.0) = -0.0


@pytest.mark.parametrize("op", ["Sinh", "Cosh"])
def test_float16_matches_onnxruntime(op):
    x = np.array([np.nan, -np.inf, -0.0, 1e-3, -0.5, 1.0, 3.0, -7.0, 11.0, -12.0],
                 dtype=np.float16)
    m = _model(op, TensorProto.FLOAT16, x.size)
    got = compiler.compile(m).session().run(None, {"x": x})[0]
    (want,) = ort_run(m, {"x": x})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3)


@pytest.mark.parametrize("op, ref", [("Sinh", np.sinh), ("Cosh", np.cosh)])
def test_float64_against_numpy(op, ref):
    # onnxruntime 1.32 has no double Sinh/Cosh kernel: numpy (libm) is the reference
    x = np.array([np.nan, -0.0, 1e-300, -1e-12, 0.3, -0.99, 1.0, 2.5, -40.0, 700.0, 711.0,
                  -711.0, 720.0, np.inf], dtype=np.float64)
    got = compiler.compile(_model(op, TensorProto.DOUBLE, x.size)).session().run(
        None, {"x": x})[0]
    with np.errstate(over="ignore"):
        want = ref(x)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
    assert np.signbit(got[1]) == np.signbit(want[1])


def _legalized_text(op_name, dtype="float32"):
    lowering.install()
    x = relax.Var("x", relax.TensorType([8], dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        y = bb.emit(relax.Call(tvm.ir.Op.get(op_name), [x]))
        bb.emit_func_output(y)
    return relax.transform.LegalizeOps()(bb.get()).script()


@pytest.mark.parametrize("op_name", ["relax.sinh", "relax.cosh"])
def test_legalized_with_exp_not_the_intrinsic(op_name):
    text = _legalized_text(op_name)
    assert "T.exp(" in text
    assert "T.sinh" not in text and "T.cosh" not in text


def test_other_unary_ops_keep_tvms_legalization():
    # the override is for sinh/cosh only; float32 tanh is legalize_nan's vectorisable
    # arithmetic (passes/math_f32.tanh_f32), float64 keeps TVM's intrinsic
    assert "T.tanh" not in _legalized_text("relax.tanh")
    assert "T.tanh" in _legalized_text("relax.tanh", "float64")
