"""cpu.matmul_packed: structure under a Target, numerics against onnxruntime, negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from passes.pack_matmul_weights import matmul_packed
from schedules.cpu.matmul import Matmul
from schedules.cpu.matmul_packed import MatmulPacked
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def _packed(bb, a, wp):
    return bb.call_te(matmul_packed, a, wp, primfunc_name_hint="matmul")


def test_structure_gelu_epilogue_fuses_and_no_panel_copy():
    def build(bb, a, wp, c):
        return bb.emit(relax.op.nn.gelu(relax.op.add(_packed(bb, a, wp), c)))
    # the TE compute is a reduction FuseOps fuses its epilogue into: one kernel
    f = fused_primfunc(build, [(1, 64, 48), (3, 48, 32), (96,)], "fused_matmul_add_gelu")
    text = MatmulPacked().apply(f, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(16))" in text
    assert "_local" in text and "T.erf" in text  # epilogue in the tile's write-back
    assert "_global" not in text                  # the weight panel is read in place
    assert Matmul().apply(f, TARGET) is None    # [N/nr, K, nr] is not a [K, N] B


def test_structure_padded_rows_guard_only_the_write_back():
    def build(bb, a, wp, c):
        return bb.emit(relax.op.add(
            bb.call_te(matmul_packed, a, wp, 8, primfunc_name_hint="matmul"), c))
    f = fused_primfunc(build, [(1, 37, 48), (2, 48, 32), (64,)], "fused_matmul_add")
    text = MatmulPacked().apply(f, TARGET).mod["main"].script()
    # rows 37..39 read row 36 of A; only the epilogue's write-back checks the row
    assert "T.min(" in text and text.count("T.where(") == 1
    assert "T.int64(40)" in text and "_local" in text


def test_rejects_unpacked_matmul():
    f = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                       [(8, 16), (16, 32)], "matmul")
    assert MatmulPacked().apply(f, TARGET) is None
    assert Matmul().apply(f, TARGET) is not None


@pytest.mark.parametrize("a_shape,n,residual", [
    ((3, 20), 64, False),           # M below one register tile
    ((1, 37, 24), 96, False),       # odd M
    ((2, 16, 40), 32, True),        # batch dims, residual add epilogue
    ((1, 197, 16), 64, True),       # prime M: rows padded to 200 (pack_matmul_weights)
])
def test_numerics_matmul_add(a_shape, n, residual):
    rng = np.random.default_rng(0)
    k = a_shape[-1]
    w = rng.standard_normal((k, n)).astype("float32")
    bias = rng.standard_normal((n,)).astype("float32")
    out = a_shape[:-1] + (n,)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "bias"], ["y"], name="add")]
    inits = {"w": w, "bias": bias}
    if residual:
        nodes[-1].output[0] = "t"
        nodes.append(helper.make_node("Add", ["t", "r"], ["y"], name="res"))
        inits["r"] = rng.standard_normal(out).astype("float32")
    model = onnx_model(nodes, [("a", a_shape)], [("y", out)], inits)
    check_against_ort(model, {"a": rng.standard_normal(a_shape).astype("float32")},
                      "cpu.matmul_packed")
