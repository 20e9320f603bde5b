"""cpu.upsample_nearest: structure under AVX-512 / AVX2 Targets, numerics against
onnxruntime (Resize nearest by integer factors; a non-integer factor left to the gather),
negatives."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax

from schedules.cpu.upsample import UpsampleNearest
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

ZNVER3 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


def _up2(bb, x):
    return bb.emit(relax.op.repeat(relax.op.repeat(x, 2, axis=2), 2, axis=3))


@pytest.mark.parametrize("target", [TARGET, ZNVER3])
def test_structure_rows_parallel_repeated_lanes_unrolled(target):
    f = fused_primfunc(_up2, [(1, 16, 8, 12)], "repeat")
    text = UpsampleNearest().apply(f, target).mod["main"].script()
    assert "T.parallel(T.int64(256))" in text     # (n, c, output row) fused: 16 x 16
    assert "T.unroll(T.int64(2))" in text         # the two copies of one input element
    assert 'T.sblock("T_repeat")' not in text     # the row repeat inlined
    # the loop over input elements stays plain: its stride-2 stores are an interleaved
    # group for LLVM (TIR-vectorised, x // 2 would load lane by lane)
    assert "T.vectorized" not in text


def test_rejects_contiguous_gather_and_reductions():
    rows_only = fused_primfunc(lambda bb, x: bb.emit(relax.op.repeat(x, 2, axis=2)),
                               [(1, 4, 8, 16)], "repeat")
    assert UpsampleNearest().apply(rows_only, TARGET) is None   # contiguous: fallback's
    take = fused_primfunc(
        lambda bb, x: bb.emit(relax.op.take(x, relax.const(np.array([0, 0, 2, 1]), "int64"),
                                            axis=1)), [(4, 3)], "take")
    assert UpsampleNearest().apply(take, TARGET) is None        # index table
    red = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(4, 32)], "sum")
    assert UpsampleNearest().apply(red, TARGET) is None


@pytest.mark.parametrize("scales,shape,rule", [
    ([1, 1, 2, 2], (1, 8, 16, 16), "cpu.upsample_nearest"),   # FPN / U-Net x2
    ([1, 1, 3, 3], (1, 3, 7, 5), "cpu.upsample_nearest"),     # odd sizes, x3
    ([1, 1, 1, 2], (2, 4, 5, 9), "cpu.upsample_nearest"),     # width only
    ([1, 1, 1.5, 1.5], (1, 4, 8, 8), None),                   # not an integer: a gather
])
def test_numerics_resize_nearest_against_onnxruntime(scales, shape, rule):
    import compiler

    out = [int(d * s) for d, s in zip(shape, scales)]
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest",
                            coordinate_transformation_mode="asymmetric",
                            nearest_mode="floor", name="up")
    model = onnx_model([node], [("x", shape)], [("y", out)],
                       {"scales": np.array(scales, "float32")})
    x = np.random.default_rng(3).standard_normal(shape).astype("float32")
    if rule is not None:
        check_against_ort(model, {"x": x}, rule)
    else:
        import onnxruntime as ort

        cm = compiler.compile(model, target="host")
        assert "cpu.upsample_nearest" not in cm.report["schedules"]
        ref = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_array_equal(cm.session().run(None, {"x": x})[0], ref[0])


def test_llvm_vectorises_the_repeated_stores():
    """The rule relies on LLVM's loop vectoriser for the interleaved stores: packed
    shuffles on ymm registers (AVX2)."""
    import re

    from tests.schedules.test_pool_strided import _asm

    f = fused_primfunc(_up2, [(1, 4, 8, 32)], "repeat")
    src = _asm(UpsampleNearest().apply(f, ZNVER3), ZNVER3)
    assert re.search(r"(vperm|vunpck|vshuf)\w*\s+[^\n]*ymm", src)
