"""schedules/vector_ops.py: TVM's loop vectoriser takes ``nearbyint`` (every requantisation
to 8 bits rounds with it) instead of scalarising the loop around it."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.script import tirx as T

import schedules  # noqa: F401  (marks the ops)
from schedules.vector_ops import VECTORIZABLE


@T.prim_func
def requantize(x: T.Buffer((2, 16), "float32"), y: T.Buffer((2, 16), "uint8")):
    for i in range(2):
        for j in T.vectorized(16):
            y[i, j] = T.Cast("uint8", T.min(T.max(T.Cast("int32", T.nearbyint(
                x[i, j] * T.float32(98.1))), 0), 255))


@T.prim_func
def nan_to_zero(x: T.Buffer((64,), "float32"), y: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "nan_to_zero", "tirx.noalias": True})
    for i in T.vectorized(64):
        y[i] = T.Select(T.isnan(x[i]), T.float32(0.0), x[i])


def _vectorized(func) -> str:
    passes = [s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
              tirx.transform.VectorizeLoop(True)]
    return tvm.ir.transform.Sequential(passes)(tvm.IRModule({"main": func}))["main"].script()


def test_requantisation_vectorises_whole():
    text = _vectorized(requantize)
    assert "T.nearbyint(x_1[T.Ramp(" in text and "uint8x16" in text, text
    assert "j_s" not in text, text   # no scalarised lane loop


def test_ops_marked():
    for name in VECTORIZABLE:
        assert tvm.ir.Op.get(name).get_attr("TVectorizable")


def test_isnan_vectorises_whole_and_computes_right():
    import numpy as np

    text = _vectorized(nan_to_zero)
    assert "T.isnan(x_1[T.Ramp(" in text and "i_s" not in text, text
    lib = tvm.compile(tvm.IRModule({"nan_to_zero": nan_to_zero}), target="llvm")
    x = np.arange(64, dtype=np.float32)
    x[[3, 40]] = np.nan
    y = tvm.runtime.tensor(np.ones(64, np.float32))
    lib["nan_to_zero"](tvm.runtime.tensor(x), y)
    np.testing.assert_array_equal(y.numpy(), np.where(np.isnan(x), 0, x))
