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
