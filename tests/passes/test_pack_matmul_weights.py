"""pack_matmul_weights: structure (counts, names, packed layout, fused kernels), numerics
against onnxruntime, and matmuls it must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from passes import PackMatmulWeights
from passes.pack_matmul_weights import RULE, pack_kn, pad_rows
from passes.relax_util import bindings
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

RNG = np.random.default_rng(0)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def dense_block(m=16, k=64, n=96):
    """x @ W + b -> Relu -> + x @ W2 (residual-style): two constant-weight matmuls."""
    nodes = [node("MatMul", ["x", "w"], "fc.matmul"), node("Add", ["fc.matmul", "b"], "fc.add"),
             node("Relu", ["fc.add"], "fc.relu"), node("MatMul", ["fc.relu", "w2"], "out.matmul"),
             node("Add", ["out.matmul", "x"], "out.residual")]
    return model(nodes, {"x": [1, m, k]}, {"out.residual": [1, m, k]},
                 {"w": _w(k, n), "b": _w(n), "w2": _w(n, k)})


def _feeds(shape=(1, 16, 64)):
    return {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}


def test_pack_kn_layout():
    w = np.arange(5 * 64, dtype=np.float32).reshape(5, 64)
    p = pack_kn(w, 32)
    assert p.shape == (2, 5, 32) and p.flags.c_contiguous
    assert p[1, 3, 7] == w[3, 32 + 7]


@pytest.mark.parametrize("n", [64, 70, 20])
def test_weight_packed_in_place_equals_the_copied_pack(n):
    """The packed constant written into its own buffer equals relax.const of the padded,
    transposed copy (the former pack), for whole panels, a padded last panel, and fewer
    columns than one panel."""
    import tvm
    from tvm import relax

    from passes.pack_matmul_weights import pack_kn_into
    from passes.relax_util import filled_const

    w = np.random.default_rng(2).standard_normal((5, n)).astype(np.float32)
    np_ = -(-n // 32) * 32
    padded = np.concatenate([w, np.zeros((5, np_ - n), np.float32)], axis=1)
    want = relax.const(np.ascontiguousarray(padded.reshape(5, np_ // 32, 32).transpose(1, 0, 2)))
    got = filled_const((np_ // 32, 5, 32), "float32", lambda out: pack_kn_into(out, w, 32))
    tvm.ir.assert_structural_equal(got, want)
    np.testing.assert_array_equal(pack_kn(w, 32), padded.reshape(5, np_ // 32, 32)
                                  .transpose(1, 0, 2))


def test_constant_read_in_place_and_int64_copied():
    """const_view reads a float32 constant's buffer in place, read-only; an int64 one (a
    dtype it does not view) comes back as a copy; filled_const refuses int64 (relax.const
    would narrow it to int32)."""
    from tvm import relax

    from passes.relax_util import const_view, filled_const

    c = relax.const(np.arange(6, dtype=np.float32).reshape(2, 3))
    v = const_view(c)
    assert not v.flags.writeable and np.shares_memory(v, const_view(c))
    np.testing.assert_array_equal(v, np.arange(6).reshape(2, 3))
    i = relax.const(np.arange(4, dtype=np.int64), "int64")
    iv = const_view(i)
    assert iv.dtype == np.int64 and iv.flags.writeable and not np.shares_memory(iv,
                                                                               const_view(i))
    with pytest.raises(ValueError, match="int64"):
        filled_const((4,), "int64", lambda out: None)



def test_pad_rows_only_when_the_divisor_tile_costs_more():
    # 128 and 12 have whole 8-row / 6-row tiles, 77 a 7-row one (1.03: 9 loads per 14 FMAs
    # against 10 per 16) that beats 80/77 padded; 5 rows of 5; prime M and 26 (2-row tiles
    # wait on the FMA latency) padded to 8 / 7 rows
    assert [pad_rows(m, 8) for m in (128, 77, 12, 5, 1, 37, 197, 26)] == [1, 1, 1, 1, 1, 8, 8, 7]


def test_pad_rows_follows_the_targets_register_tile():
    # AVX2: 2-vector panels in a 12-accumulator budget make 6-row tiles; Swin's 49-token
    # windows padded to 50 in 5-row tiles, LLaMA's 77 and 197 to 6-row tiles; 128 and 196
    # 4-row tiles (1.125x the loads per FMA) against 3% and 1% padded rows; 2, 4 and 8
    # rows would pad by half or more
    assert [pad_rows(m, 6) for m in (49, 77, 128, 196, 197, 1, 2, 4, 8, 1500)] == \
        [5, 6, 6, 6, 6, 1, 1, 1, 1, 1]
    # AVX-512: 12-row tiles; 49 to 50 in 10-row tiles (was 60 in 12: 0.865x the time
    # unpadded already, emeraldrapids), 77's 11-row divisor kept, 128 padded to 132, 197 to
    # 198 in 11-row tiles, 37 to 40 in 10
    assert [pad_rows(m, 12) for m in (49, 77, 128, 197, 37, 2, 12, 96)] == \
        [10, 1, 12, 11, 10, 1, 1, 1]


def test_rows_option_set_from_the_target():
    import targets
    from compiler.driver import _matmul_tiles

    tiles = {name: _matmul_tiles(targets.resolve(name), None)["pack_matmul_weights"]
             for name in ("x86-avx2", "x86-avx512")}
    # panels two vectors wide, rows what the accumulator budget leaves
    assert tiles == {"x86-avx2": {"panel": 16, "rows": 6},
                     "x86-avx512": {"panel": 32, "rows": 12}}
    mine = {"pack_matmul_weights": {"rows": 5}}
    assert _matmul_tiles(targets.resolve("x86-avx2"), mine)["pack_matmul_weights"]["rows"] == 5
    assert mine == {"pack_matmul_weights": {"rows": 5}}  # the caller's dict is not changed
    # a panel the user set keeps its rows in the budget: 4 AVX2 vectors, 3 rows
    wide = _matmul_tiles(targets.resolve("x86-avx2"), {"pack_matmul_weights": {"panel": 32}})
    assert wide["pack_matmul_weights"] == {"panel": 32, "rows": 3}


def test_prime_rows_padded_plain_and_shared_outputs_match_ort():
    # M = 37: rows padded to 40 inside the kernel; the matmul output is a graph output
    # (no epilogue) and, in the second model, feeds two consumers
    plain = model([node("MatMul", ["x", "w"], "y")], {"x": [37, 16]}, {"y": [37, 64]},
                  {"w": _w(16, 64)})
    shared = model([node("MatMul", ["x", "w"], "m"), node("Relu", ["m"], "r"),
                    node("Sigmoid", ["m"], "s"), node("Add", ["r", "s"], "y")],
                   {"x": [37, 16]}, {"y": [37, 64]}, {"w": _w(16, 64)})
    feeds = {"x": np.random.default_rng(4).standard_normal((37, 16)).astype(np.float32)}
    for m in (plain, shared):
        outs, cm = compile_run(m, feeds, target="host")
        assert cm.report["schedules"].get("cpu.matmul_packed") == 1, cm.report["schedules"]
        assert_close(outs, ort_run(m, feeds), rtol=1e-4, atol=1e-5)


def test_batched_window_rows_padded_per_batch_match_ort():
    # Swin's window projection [windows, 49, C] @ W: with rows=3 (AVX2's tile) each
    # window's 49 rows are computed as 51, the extra rows dropped per window
    m = model([node("MatMul", ["x", "w"], "y"), node("Relu", ["y"], "z")],
              {"x": [4, 49, 24]}, {"z": [4, 49, 40]}, {"w": _w(24, 40)})
    feeds = {"x": np.random.default_rng(5).standard_normal((4, 49, 24)).astype(np.float32)}
    outs, cm = compile_run(m, feeds, target="host",
                           pass_config={"pack_matmul_weights": {"rows": 3}})
    assert cm.report["schedules"].get("cpu.matmul_packed") == 1, cm.report["schedules"]
    assert_close(outs, ort_run(m, feeds), rtol=1e-4, atol=1e-5)


def test_structure_names_and_packed_constant():
    before, after, r = run_pass(PackMatmulWeights(), dense_block())
    assert before["relax.matmul"] == 2 and "relax.matmul" not in after
    assert after["relax.call_tir"] == 2 and after["relax.add"] == 2
    assert r.rewrites == {RULE: 2}
    assert r.nodes == ["fc.matmul", "out.matmul"]


def test_keeps_binding_names_and_packs_weight():
    names = [n.name for n in dense_block().graph.node]
    from compiler.frontend.importer import import_onnx
    from compiler.frontend.loader import load_model
    from passes import FoldConstants, PassContext

    mod = PassContext(node_names=names).run([FoldConstants()],
                                            import_onnx(load_model(dense_block())))
    old = {b.var.name for b in bindings(mod) if isinstance(b.value, relax.Call)
           and getattr(b.value.op, "name", "") == "relax.matmul"}
    after = PassContext(node_names=names).run([PackMatmulWeights()], mod)
    calls = [b for b in bindings(after) if isinstance(b.value, relax.Call)
             and getattr(b.value.op, "name", "") == "relax.call_tir"]
    assert {b.var.name for b in calls} == old
    shapes = sorted(tuple(int(d) for d in b.value.args[1][1].ty.shape) for b in calls)
    assert shapes == [(2, 96, 32), (3, 64, 32)]


def test_epilogues_fuse_and_match_ort():
    m = dense_block()
    outs, cm = compile_run(m, _feeds(), target="host")
    assert_close(outs, ort_run(m, _feeds()), rtol=1e-4, atol=1e-5)
    assert report(cm, "pack_matmul_weights")["nodes"] == ["fc.matmul", "out.matmul"]
    assert cm.report["schedules"].get("cpu.matmul_packed") == 2
    # bias + Relu and the residual add stay in the matmul kernels, which name their nodes
    nodes = [c["nodes"] for c in cm.meta["graph"]["calls"]]
    assert ["fc.matmul", "fc.add", "fc.relu"] in nodes
    assert ["out.matmul", "out.residual"] in nodes
    ref = compile_run(m, _feeds(), target="host", disabled_passes=["pack_matmul_weights"])[1]
    assert cm.report["kernels"] == ref.report["kernels"]


def test_gemm_trans_b_and_2d_input():
    # Gemm(transB=1): the folded constant W^T is [K, N] and packs like any other weight
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="gemm")]
    m = model(nodes, {"x": [5, 24]}, {"y": [5, 64]}, {"w": _w(64, 24), "b": _w(64)})
    feeds = {"x": np.random.default_rng(2).standard_normal((5, 24)).astype(np.float32)}
    outs, cm = compile_run(m, feeds, target="host")
    assert report(cm, "pack_matmul_weights")["nodes"] == ["gemm"]
    assert_close(outs, ort_run(m, feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m_,k,n", [(4, 8, 48), (1, 64, 1001), (37, 24, 10)])
def test_columns_padded_to_whole_panels(m_, k, n):
    """N not a multiple of the panel (a 1001-class classifier): W gets zero columns up to
    whole panels, and the write-back drops them."""
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "y")]
    m = model(nodes, {"x": [m_, k]}, {"y": [m_, n]}, {"w": _w(k, n), "b": _w(n)})
    feeds = {"x": np.random.default_rng(3).standard_normal((m_, k)).astype(np.float32)}
    outs, cm = compile_run(m, feeds, target="host")
    assert report(cm, "pack_matmul_weights")["nodes"] == ["mm"]
    assert cm.report["schedules"].get("cpu.matmul_packed") == 1
    assert_close(outs, ort_run(m, feeds), rtol=1e-4, atol=1e-5)


def test_leaves_alone_nonconstant_batched_and_const_lhs():
    cases = [
        # W an input, not a constant
        model([node("MatMul", ["x", "w"], "y")], {"x": [4, 8], "w": [8, 32]}, {"y": [4, 32]}),
        # batched constant B
        model([node("MatMul", ["x", "w"], "y")], {"x": [2, 4, 8]}, {"y": [2, 4, 32]},
              {"w": _w(2, 8, 32)}),
        # constant on the left: W @ x
        model([node("MatMul", ["w", "x"], "y")], {"x": [8, 32]}, {"y": [4, 32]}, {"w": _w(4, 8)}),
    ]
    for m in cases:
        _, after, r = run_pass(PackMatmulWeights(), m)
        assert not r.rewrites and after.get("relax.matmul") == 1, (r, after)


def test_leaves_int_matmul_alone():
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="y")], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 32])],
        [numpy_helper.from_array(np.ones((8, 32), np.int32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    _, after, r = run_pass(PackMatmulWeights(), m)
    assert not r.rewrites and after.get("relax.matmul") == 1


def test_panel_option_and_disable():
    m = model([node("MatMul", ["x", "w"], "y")], {"x": [4, 8]}, {"y": [4, 48]}, {"w": _w(8, 48)})
    feeds = {"x": np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)}
    outs, cm = compile_run(m, feeds, target="host",
                           pass_config={"pack_matmul_weights": {"panel": 16}})
    assert report(cm, "pack_matmul_weights")["rewrites"] == {RULE: 1}
    assert cm.report["schedules"].get("cpu.matmul_packed") == 1
    assert_close(outs, ort_run(m, feeds), rtol=1e-4, atol=1e-5)
    _, cm = compile_run(dense_block(), _feeds(), target="host",
                        disabled_passes=["pack_matmul_weights"])
    assert report(cm, "pack_matmul_weights")["skipped"] == "disabled"
    assert "cpu.matmul_packed" not in cm.report["schedules"]


def test_flatten_rows_decision():
    from passes.pack_matmul_weights import flatten_rows
    # ConvNeXt stage 4 / 3 ([1, 7, 7, C], [1, 14, 14, C]) on AVX2's 6-row tiles: flattened
    assert flatten_rows(7, 49, 6) and flatten_rows(14, 196, 6)
    # a single batch row (BERT's [1, 128, 768]) or M of four tiles and more (Swin's 49-token
    # windows, ConvNeXt's 56-wide stage 1): the batched kernel keeps its fused epilogue
    assert not flatten_rows(128, 128, 6) and not flatten_rows(7, 7, 6)
    assert not flatten_rows(49, 3136, 6) and not flatten_rows(56, 3136, 6)


@pytest.mark.parametrize("shape,n", [((1, 7, 7, 48), 80), ((2, 3, 5, 16), 24)])
def test_few_rows_per_batch_flattened_and_match_ort(shape, n):
    """[.., M, K] @ W with a few rows per batch row runs as one [B*M, K] matmul (reshapes are
    views): one packed matmul kernel over all rows, the bias + ReLU in its write-back
    (sink_reshape moves the reshape back below them)."""
    k = shape[-1]
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "add"),
             node("Relu", ["add"], "y")]
    m = model(nodes, {"x": list(shape)}, {"y": [*shape[:-1], n]}, {"w": _w(k, n), "b": _w(n)})
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    outs, cm = compile_run(m, feeds, target="host")
    assert report(cm, "pack_matmul_weights")["nodes"] == ["mm"]
    kernels = {e["kernel"]: e for e in cm.report["kernel_table"]}
    mm = [e for e in kernels.values() if e["rule"] == "cpu.matmul_packed"]
    # the kernel still names its nodes
    assert len(mm) == 1 and sorted(mm[0]["nodes"]) == ["add", "mm", "y"]
    assert_close(outs, ort_run(m, feeds), rtol=1e-4, atol=1e-5)


def test_many_rows_per_batch_keep_the_fused_epilogue():
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "add"),
             node("Relu", ["add"], "y")]
    m = model(nodes, {"x": [2, 64, 16]}, {"y": [2, 64, 24]}, {"w": _w(16, 24), "b": _w(24)})
    feeds = {"x": RNG.standard_normal((2, 64, 16)).astype(np.float32)}
    outs, cm = compile_run(m, feeds, target="host")
    (mm,) = [e for e in cm.report["kernel_table"] if e["rule"] == "cpu.matmul_packed"]
    assert set(mm["nodes"]) == {"mm", "add", "y"}  # bias and ReLU in the write-back
    assert_close(outs, ort_run(m, feeds), rtol=1e-4, atol=1e-5)
