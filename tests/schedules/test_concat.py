"""cpu.concat: structure under a Target, numerics against onnxruntime, negatives."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import te, tirx, topi

from schedules.cpu.concat import Concat
from tests.schedules.util import TARGET, onnx_model

ONE_CORE = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 1})


def _i64(*xs):
    return [tirx.IntImm("int64", x) if isinstance(x, int) else x for x in xs]


def _concat(shapes, axis):
    """topi's concatenate of float32 placeholders of ``shapes`` on ``axis``."""
    ins = [te.placeholder(_i64(*s), name=f"x{n}") for n, s in enumerate(shapes)]
    return te.create_prim_func([*ins, topi.concatenate(ins, axis=axis)])


def test_structure_cache_concat_partitioned_per_input():
    """The key cache + one new row over a symbolic past: heads parallel, the cache axis
    left whole with the loop partition hint (one copy loop per input after lowering),
    the head_dim row vectorised; no division by past + 1 per row."""
    past = tirx.Var("past", "int64")
    f = _concat([(1, 12, past, 64), (1, 12, 1, 64)], axis=2)
    text = Concat().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(12))" in text and "pragma_loop_partition_hint" in text
    assert "T.vectorized(T.int64(16))" in text and "//" not in text and "%" not in text
    # TVM's loop partition splits the axis: the new row's loop is a plain copy (the past's
    # keeps a select TVM cannot drop, not knowing past >= 0: one branch per row, no div)
    st, tx = tvm.s_tir.transform, tvm.tirx.transform
    lowered = tvm.ir.transform.Sequential([
        st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(),
        st.ConvertBlocksToOpaque(), st.CompactBufferAllocation(), st.LowerMatchBuffer(),
        st.StmtSimplify(), st.LowerOpaqueBlock(), tx.FlattenBuffer(), st.LoopPartition(),
        tx.VectorizeLoop(True), tx.StmtSimplify()])(Concat().apply(f, TARGET).mod)
    body = lowered["main"].script()
    assert body.count("for ax2") == 2 and body.count("if_then_else") == 1


def test_structure_three_inputs():
    f = _concat([(2, 4, 64), (2, 3, 64), (2, 1, 64)], axis=1)
    text = Concat().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(2))" in text and "pragma_loop_partition_hint" in text


def test_channel_concat_with_its_epilogue_over_a_symbolic_image():
    """DenseNet's channel concat fused with BatchNorm + ReLU, NCHW16c over a symbolic
    image: one outer row (the image), so the image rows go outside the partitioned
    channel-block axis, parallel; the columns stay a loop and the lanes are vectorised.
    As the elementwise rule scheduled it, a select chain over every input ran per vector
    (5 s of LLVM per kernel for DenseNet's 31 inputs).  Built and checked against numpy."""
    h, w = tirx.Var("h", "int64"), tirx.Var("w", "int64")
    ins = [te.placeholder(_i64(1, c, h, w, 16), name=f"x{c}") for c in (2, 3, 1)]
    cat = topi.concatenate(ins, axis=1)
    scale = te.placeholder(_i64(1, 6, 1, 1, 16), name="scale")
    y = topi.nn.relu(topi.multiply(cat, scale))
    f = te.create_prim_func([*ins, scale, y])
    sch = Concat().apply(f, TARGET)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "pragma_loop_partition_hint" in text and "T.vectorized(T.int64(16))" in text
    assert "T.parallel(h)" in text, text
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol",
                                                                      "main")}), TARGET)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, c, 5, 7, 16)).astype("float32") for c in (2, 3, 1)]
    sc = rng.standard_normal((1, 6, 1, 1, 16)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((1, 6, 5, 7, 16), "float32"))
    lib["main"](*[tvm.runtime.tensor(x) for x in xs], tvm.runtime.tensor(sc), out)
    want = np.maximum(np.concatenate(xs, axis=1) * sc, 0)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)


def test_rejects_other_kernels():
    """Not this rule: a concat on the innermost axis, one over the leading axis when there
    are cores to share (no outer rows to split), and a plain elementwise select."""
    assert Concat().apply(_concat([(4, 8), (4, 8)], axis=1), TARGET) is None
    assert Concat().apply(_concat([(3, 64), (1, 64)], axis=0), TARGET) is None
    assert Concat().apply(_concat([(3, 64), (1, 64)], axis=0), ONE_CORE) is not None
    a = te.placeholder(_i64(4, 8), name="a")
    relu = te.compute(a.shape, lambda i, j: tvm.tirx.if_then_else(a[i, j] > 0, a[i, j], 0.0))
    assert Concat().apply(te.create_prim_func([a, relu]), TARGET) is None


@pytest.mark.parametrize("axis", [1, 2])
def test_numerics_symbolic_cache_concat_vs_ort(axis):
    """Concat(past, new) on a symbolic past (0 included) against onnxruntime."""
    from tests.conftest import assert_close, ort_run

    import compiler

    shape = lambda n: [1, 4, n, 16] if axis == 2 else [1, n, 4, 16]  # noqa: E731
    model = onnx_model([helper.make_node("Concat", ["past", "new"], ["y"], axis=axis,
                                         name="cache_concat")],
                       [("past", shape("past")), ("new", shape(1))], [("y", shape("past_seq"))])
    # this rule's kernel, not the sequence-major cache (passes/seq_major_cache.py would
    # store past [P, B, H, D] and append along the leading axis)
    cm = compiler.compile(model, dims={"past": (0, 40)}, disabled_passes=["seq_major_cache"])
    assert isinstance(cm, compiler.CompiledModel)
    # axis 1 has one outer row: the rows after it (the heads) go outside it
    assert cm.report["schedules"].get("cpu.concat") == 1, cm.report["schedules"]
    sess = cm.session()
    rng = np.random.default_rng(0)
    for past in (0, 1, 17, 40):
        feeds = {"past": rng.standard_normal(shape(past)).astype("float32"),
                 "new": rng.standard_normal(shape(1)).astype("float32")}
        assert_close(sess.run(None, feeds), ort_run(model, feeds))


def test_structure_channel_concat_of_one_image_splits_the_planes():
    """37 + 27 channels of one [56, 56] image: each core a contiguous half of every
    channel's plane (3136 = 2 x 98 x 16), copied as whole vectors; the channel axis
    partitioned per input inside.  Image rows outside the channels copied 56-wide rows
    strided by the plane, a plain loop LLVM turned into gathers: 2.7x onnxruntime."""
    f = _concat([(1, 37, 56, 56), (1, 27, 56, 56)], axis=1)
    text = Concat().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(2))" in text and "pragma_loop_partition_hint" in text
    assert "T.vectorized(T.int64(16))" in text


def test_numerics_channel_concat_of_one_image_vs_ort():
    from tests.conftest import assert_close, ort_run

    import compiler

    model = onnx_model([helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1)],
                       [("a", [1, 37, 56, 56]), ("b", [1, 27, 56, 56]), ("c", [1, 3, 56, 56])],
                       [("y", [1, 67, 56, 56])])
    cm = compiler.compile(model)
    assert cm.report["schedules"].get("cpu.concat") == 1, cm.report["schedules"]
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s).astype("float32")
             for n, s in (("a", (1, 37, 56, 56)), ("b", (1, 27, 56, 56)), ("c", (1, 3, 56, 56)))}
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds))
