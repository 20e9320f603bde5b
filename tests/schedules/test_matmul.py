"""cpu.matmul: structure under a Target, numerics against onnxruntime, negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax, te

from schedules.cpu.matmul import Matmul
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def test_structure_dense_gelu_epilogue():
    def build(bb, a, b, c):
        return bb.emit(relax.op.nn.gelu(relax.op.add(relax.op.matmul(a, b), c)))
    f = fused_primfunc(build, [(1, 64, 48), (48, 96), (96,)], "matmul")
    text = Matmul().apply(f, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(32))" in text
    assert "_local" in text and "T.erf" in text  # epilogue in the tile's write-back


def test_rejects_transposed_b_and_conv():
    a, b = te.placeholder((8, 16), name="a"), te.placeholder((32, 16), name="b")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((8, 32), lambda i, j: te.sum(a[i, k] * b[j, k], axis=k), name="nt")
    assert Matmul().apply(te.create_prim_func([a, b, c]), TARGET) is None
    conv = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w)),
                          [(1, 4, 8, 8), (8, 4, 3, 3)], "conv2d")
    assert Matmul().apply(conv, TARGET) is None
    red = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(8, 16)], "sum")
    assert Matmul().apply(red, TARGET) is None


@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 20), (20, 10)),            # MLP head: M, N below one register tile
    ((1, 37, 24), (24, 48)),        # odd M
    ((2, 3, 17, 8), (2, 3, 8, 32)), # batch matmul
    ((1, 16, 24), (24, 64)),        # a weight pack_matmul_weights would pack, kept [K, N]
])
def test_numerics_matmul_add(a_shape, b_shape):
    rng = np.random.default_rng(0)
    b = rng.standard_normal(b_shape).astype("float32")
    out = a_shape[:-1] + b_shape[-1:]
    bias = rng.standard_normal(b_shape[-1:]).astype("float32")
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "bias"], ["y"], name="add")]
    model = onnx_model(nodes, [("a", a_shape)], [("y", out)], {"b": b, "bias": bias})
    # this rule's [K, N] form: constant weights stay unpacked
    check_against_ort(model, {"a": rng.standard_normal(a_shape).astype("float32")},
                      "cpu.matmul", disabled_passes=["pack_matmul_weights"])
