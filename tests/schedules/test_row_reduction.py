"""cpu.row_reduction: structure under a Target, numerics against onnxruntime, negatives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from schedules.cpu.row_reduction import RowReduction
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model


def _layer_norm(bb, x, g, b):
    return bb.emit(relax.op.nn.layer_norm(x, g, b, axes=[-1]))


def test_structure_layer_norm_rows_parallel_reductions_vectorised():
    f = fused_primfunc(_layer_norm, [(2, 64, 768), (768,), (768,)], "layer_norm")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(128))" in text  # the two leading axes fused: 128 rows
    # each reduction keeps 2 vectors of partial sums, the epilogue runs 4 vectors a step
    assert text.count("T.vectorized(T.int64(32))") >= 2 and "_rf" in text
    assert "T.vectorized(T.int64(64))" in text


def test_structure_softmax_max_and_sum_rfactored():
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)),
                       [(12, 128, 128)], "softmax")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "T_softmax_maxelem_rf" in text and "T_softmax_expsum_rf" in text
    assert "T.parallel(T.int64(1536))" in text


def _softmax_kernel(shape):
    import compiler.lowering as lowering

    return fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)), [shape],
                          "softmax", legalize_map=lowering.install())


@pytest.mark.parametrize("n, head, tail, width", [(197, 192, 5, 32), (1500, 1488, 12, 16),
                                                  (49, 48, 1, 16)])
def test_structure_odd_rows_vector_partial_sums_and_scalar_tail(n, head, tail, width):
    # onnxc's softmax reduces a row of 197 over 192 elements (vector partial sums, rfactored)
    # and over the last 5 (a scalar loop), joined per row
    text = RowReduction().apply(_softmax_kernel((12, n)), TARGET).mod["main"].script()
    for red in ("T_softmax_maxelem", "T_softmax_expsum"):
        assert f'T.sblock("{red}_rf")' in text and f'T.sblock("{red}_tail")' in text
        assert f"{red}_tail[v_i0] = " in text
    # partial sums: two AVX-512 vectors when they divide the head (192), else one
    assert text.count(f"T.vectorized(T.int64({width}))") >= 2
    assert f"T.grid(T.int64(1), T.int64({tail}))" in text  # the scalar tails
    assert f"+ T.int64({head})]" in text
    # exp and the normalisation: whole vectors over the head, then the tail as one short
    # vector each (a scalar loop for a tail of one)
    loop = "range" if tail == 1 else "T.vectorized"
    assert text.count(f"{loop}(T.int64({head}), T.int64({n}))") == 2
    assert text.count(f"T.vectorized(T.int64({64 if head % 64 == 0 else 16}))") >= 2
    assert "T.parallel(T.int64(12))" in text


def _symbolic_softmax():
    from tvm import tirx

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    return fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)),
                          [(b, 12, s, s)], "softmax")


@pytest.mark.parametrize("make", [lambda: _softmax_kernel((8, 1500)), _symbolic_softmax],
                         ids=["onnxc_1500", "tvm_symbolic"])
def test_structure_softmax_exps_stored_in_the_output_and_normalised_in_place(make):
    # the first write of an output row happens in the exp pass (MLAS' order), not in the
    # bare normalise pass: no scratch row, the sum reads the output's exps
    text = RowReduction().apply(make(), TARGET).mod["main"].script()
    assert "T_softmax_exp = T.sblock_alloc_buffer" not in text and "T_softmax_exp[" not in text
    stores = [ln.split(" = ", 1)[1] for ln in text.splitlines()
              if ln.strip().startswith("T_softmax_norm[") and " = " in ln]
    assert any("exp" in rhs or "T.Select(" in rhs for rhs in stores)  # the exp pass
    assert any(rhs.startswith("T_softmax_norm[") for rhs in stores)  # normalised in place
    assert "+ T_softmax_norm[v_i0, " in text  # the row's sum reads the stored exps


def test_alias_buffer_refuses_other_shapes_and_missing_names():
    from schedules.cpu.common import alias_buffer

    ln = fused_primfunc(_layer_norm, [(2, 64, 768), (768,), (768,)], "layer_norm")
    assert alias_buffer(ln, "T_softmax_exp", "T_layer_norm") is None  # no such buffers
    sm = _softmax_kernel((8, 1500))
    assert alias_buffer(sm, "T_softmax_maxelem", "T_softmax_norm") is None  # [8] vs [8, 1500]
    assert alias_buffer(sm, "T_softmax_exp", "T_softmax_norm") is not None


def test_short_rows_stay_scalar_but_scheduled():
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)), [(6, 10)],
                       "softmax")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "_rf" not in text and "T.parallel" in text


def test_rejects_matmul_and_non_last_axis_reductions():
    mm = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                        [(8, 16), (16, 32)], "matmul")
    assert RowReduction().apply(mm, TARGET) is None
    sm0 = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=0)),
                         [(64, 32)], "softmax")
    assert RowReduction().apply(sm0, TARGET) is None
    red = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(8, 64)], "sum")
    assert RowReduction().apply(red, TARGET) is None  # ends in a reduction: no row epilogue


def test_short_odd_rows_are_not_split():
    # a row of 9 (< one chunk of 16) is one reduction: no empty head, no tail block
    text = RowReduction().apply(_softmax_kernel((6, 9)), TARGET).mod["main"].script()
    assert "_tail" not in text and "_rf" not in text


def test_rejects_a_tail_read_at_a_variable_offset():
    from schedules.cpu.row_reduction import _is_k_plus_const
    from tvm import tirx

    k, j = tirx.Var("k", "int64"), tirx.Var("j", "int64")
    assert _is_k_plus_const(k + tirx.const(192, "int64"), k)
    assert not _is_k_plus_const(k + j, k, [j]) and not _is_k_plus_const(k * 2, k)
    # a symbolic row's tail: an offset of the dims, not of the block's iteration vars
    n = tirx.Var("n", "int64")
    assert _is_k_plus_const(n - tirx.floormod(n, 32) + k, k, [j])


@pytest.mark.parametrize("shape", [(2, 12, 16, 128), (3, 10), (4, 96), (3, 197), (2, 41),
                                   (5, 49), (4, 77), (3, 1500), (4, 4096), (2, 3, 197)])
def test_numerics_softmax(shape):
    rng = np.random.default_rng(0)
    model = onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="sm")],
                       [("x", shape)], [("y", shape)])
    x = (rng.standard_normal(shape) * 8).astype("float32")
    x.reshape(-1, shape[-1])[0, :] = -np.inf  # fully masked row: NaN as onnxruntime
    x.reshape(-1, shape[-1])[1, 1:] = -np.inf  # one live logit: exactly 1 and 0s
    if x.size // shape[-1] > 2:
        x.reshape(-1, shape[-1])[2, -1] = np.nan  # a NaN in the tail: a NaN row
    if x.size // shape[-1] > 3:
        x.reshape(-1, shape[-1])[3, -1] = 1e4  # the maximum in the tail, logits of 1e4
    check_against_ort(model, {"x": x}, "cpu.row_reduction")


@pytest.mark.parametrize("shape", [(1, 128, 768), (5, 48), (7, 20), (3, 197)])
def test_numerics_layer_norm(shape):
    rng = np.random.default_rng(1)
    n = shape[-1]
    model = onnx_model(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                          epsilon=1e-5, name="ln")],
        [("x", shape)], [("y", shape)],
        {"g": rng.standard_normal(n).astype("float32"),
         "b": rng.standard_normal(n).astype("float32")})
    x = (rng.standard_normal(shape) * 3 + 5).astype("float32")  # |mean| > std
    check_against_ort(model, {"x": x}, "cpu.row_reduction")


@pytest.mark.parametrize("shape", [(1, 128, 768), (3, 197)])
def test_layer_norm_requantised_rows(shape):
    """LayerNormalization -> QuantizeLinear -> DequantizeLinear (a QDQ transformer's
    layer norms: the row is written as uint8): cpu.row_reduction, not dlight's one row at
    a time; within one output step of onnxruntime."""
    import compiler
    import onnxruntime as ort

    rng = np.random.default_rng(2)
    n, m = shape[-1], 32
    # the QDQ matmul after it makes qdq_matmul_integer write the Q / DQ as arithmetic,
    # which fuses into the layer norm's kernel: its rows are then stored as uint8
    model = onnx_model(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                          epsilon=1e-5, name="ln"),
         helper.make_node("QuantizeLinear", ["y", "s", "z"], ["q"], name="q"),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
         helper.make_node("DequantizeLinear", ["wq", "sw"], ["w"], name="dqw"),
         helper.make_node("MatMul", ["d", "w"], ["out"], name="mm")],
        [("x", shape)], [("out", shape[:-1] + (m,))],
        {"g": rng.standard_normal(n).astype("float32"),
         "b": rng.standard_normal(n).astype("float32"),
         "s": np.array(0.03, "float32"), "z": np.array(128, "uint8"),
         "wq": rng.integers(-64, 64, (n, m)).astype("int8"), "sw": np.array(0.01, "float32")})
    cm = compiler.compile(model, target="host")
    ln = [r for r in cm.report["kernel_table"] if "ln" in r["nodes"]]
    assert len(ln) == 1 and "q" in ln[0]["nodes"], ln          # the requantisation fused
    assert ln[0]["rule"] == "cpu.row_reduction", ln[0]["rule"]
    x = rng.standard_normal(shape).astype("float32")
    (got,) = cm.session().run(None, {"x": x})
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    # a row element one step apart moves its output by one weight column's step
    np.testing.assert_allclose(got, want, atol=0.03 * 0.01 * 64 * 4, rtol=0)


def test_symbolic_softmax_rows_parallel_over_batch_times_heads():
    """Attention's softmax over a symbolic seq: the (batch, heads) loops fused and parallel,
    seq rows serial inside (not one parallel region per head: 5.8x slower at seq 16)."""
    from tvm import tirx

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)),
                       [(b, 12, s, s)], "softmax")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "in T.parallel(batch * T.int64(12))" in text
    assert "T.parallel(seq)" not in text


def test_symbolic_layer_norm_rows_parallel_over_seq():
    """(batch, seq) rows with no constant row loop to share: the innermost (seq) in parallel."""
    from tvm import tirx

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    f = fused_primfunc(_layer_norm, [(b, s, 768), (768,), (768,)], "layer_norm")
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    assert "in T.parallel(seq)" in text and "T.parallel(batch" not in text
    assert "T.vectorized" in text  # the constant 768-wide row stays vectorised


def _symbolic(shape_fn):
    from tvm import tirx

    return shape_fn(tirx.Var("batch", "int64"), tirx.Var("seq", "int64"))


def test_structure_symbolic_rows_split_into_vectors_and_a_tail():
    """onnxc's softmax over a symbolic seq: each row reduced over ``seq - seq % 32`` in two
    vectors of partial sums, then a scalar tail; every init ahead of its loop (a tail or a
    vector part of no elements never runs its loop: its init must still run)."""
    import compiler.lowering as lowering

    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)),
                       [_symbolic(lambda b, s: (b, 12, s, s))], "softmax",
                       legalize_map=lowering.install())
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    for red in ("T_softmax_maxelem", "T_softmax_expsum"):
        for part in ("_rf_init", "_rf_update", "_tail_init", "_tail_update"):
            assert f'T.sblock("{red}{part}")' in text, (red, part)
    assert "T.grid(T.int64(1), T.int64(1), T.int64(1), seq % T.int64(32))" in text  # tails
    assert text.count("T.vectorized(T.int64(32))") >= 2
    assert "in T.parallel(batch * T.int64(12))" in text
    # the exps are recomputed where read (no stored row: its bounds came out guarded)
    assert 'T.sblock("T_softmax_exp")' not in text and "T.where" not in text
    assert "for i3 in range(seq):" in text  # the normalisation: one plain loop per row


def test_structure_symbolic_layer_norm_row_recomputes_its_arithmetic():
    """A layer norm over a symbolic row (fuse_layer_norm's, unscaled): x - x0, d and d * d
    are recomputed where read (no per-row buffers, whose extents TVM cannot bound)."""
    import compiler.lowering as lowering

    def ln(bb, x):
        from tvm import relax as r

        n = x.ty.shape.values[-1]
        return bb.emit(r.op.nn.layer_norm(x, r.op.ones(r.ShapeExpr([n]), "float32"),
                                          r.op.zeros(r.ShapeExpr([n]), "float32"),
                                          axes=[-1], center=False, scale=False))
    f = fused_primfunc(ln, [_symbolic(lambda b, s: (b, 32, s * 10))], "layer_norm",
                       legalize_map=lowering.install())
    # x, the dim and the output: the ones / zeros are not read
    assert [p.name for p in f.params] == ["p0", "seq", "T_layer_norm"]
    text = RowReduction().apply(f, TARGET).mod["main"].script()
    for inlined in ("shifted", "diff", "sq"):
        assert f'T.sblock("T_layer_norm_{inlined}")' not in text
    assert 'T.sblock("T_layer_norm_sum_rf_update")' in text
    assert 'T.sblock("T_layer_norm_var_tail_init")' in text
    assert "T.where" not in text  # no guarded row loops (of min / max bounds)


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_numerics_symbolic_rows_at_every_tail(op):
    """Symbolic rows of 1-200 elements (no vector part, no tail, both), each shape run
    twice on one session (a skipped init shows on the first call), against onnxruntime."""
    import compiler
    import onnxruntime as ort

    rng = np.random.default_rng(3)
    if op == "softmax":
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="sm")]
        inits = {}
    else:  # GroupNorm as torch exports it: InstanceNorm over [b, groups, rows * seq]
        nodes = [helper.make_node("InstanceNormalization", ["x", "g", "b"], ["y"],
                                  epsilon=1e-5, name="in")]
        inits = {"g": rng.standard_normal(4).astype("float32"),
                 "b": rng.standard_normal(4).astype("float32")}
    model = onnx_model(nodes, [("x", ("batch", 4, "seq"))], [("y", ("batch", 4, "seq"))],
                       inits)
    cm = compiler.compile(model, target="host", dims={"batch": (1, 3, 1), "seq": (1, 256, 64)})
    assert cm.report["schedules"].get("cpu.row_reduction", 0) >= 1, cm.report["schedules"]
    sess = cm.session()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, n in [(1, 64), (2, 1), (1, 31), (3, 32), (1, 33), (2, 77), (1, 200), (1, 64)]:
        x = (rng.standard_normal((b, 4, n)) * 3 + 2).astype("float32")
        want = ref.run(None, {"x": x})[0]
        for _ in range(2):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4,
                                       atol=2e-5)
