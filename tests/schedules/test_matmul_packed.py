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


def _symbolic_packed(opt, rows=1, k=48, n=40, nr=16):
    """The packed matmul PrimFunc over x[1, seq, k] (seq symbolic, ``onnxc.dim_opt`` opt)."""
    import tvm
    from tvm import te

    from compiler.lowering.symbolic import DIM_OPT_ATTR

    seq = tvm.tirx.Var("seq", "int64")
    x = te.placeholder((1, seq, k), "float32", "x")
    wp = te.placeholder((-(-n // nr), k, nr), "float32", "wp")
    out = matmul_packed(x, wp, rows, n)
    return te.create_prim_func([x, wp, out]).with_attr(DIM_OPT_ATTR, {"seq": opt})


def test_structure_one_row_symbolic_m_streams_unpadded():
    # a decode step (seq opt 1, pack_matmul_weights' one_row_dims): one row per row, no
    # clamp, no padded tile; panels parallel, the panel's columns vectorised
    text = MatmulPacked().apply(_symbolic_packed(opt=1), TARGET).mod["main"].script()
    assert "T.min(" not in text and "// T.int64(" not in text.split("for k")[1]
    assert "T.parallel(seq * T.int64(3))" in text  # 3 panels of 16 columns for N = 40
    assert text.split("for k")[1].count("T.vectorized(16)") == 1


def test_structure_one_row_covers_several_panels():
    # 24 panels of 16 columns: a one-row tile takes as many panels as its accumulators
    # allow (independent FMA chains), the k loop loads each panel's vectors once
    from schedules.cpu import common
    from schedules.cpu.matmul_packed import _panels_per_row

    with TARGET:
        nv = -(-16 // common.lanes_fp32(TARGET))
        budget, cores = common.acc_budget(TARGET, "matmul"), common.cores(TARGET)
    g = _panels_per_row(24, nv, budget, cores)
    assert g > 1 and 24 % g == 0 and g * nv <= budget
    text = MatmulPacked().apply(_symbolic_packed(opt=1, n=16 * 24), TARGET).mod["main"].script()
    assert f"T.parallel(seq * T.int64({24 // g}))" in text
    assert "T.min(" not in text


def test_panels_per_row_keeps_tasks_and_registers():
    from schedules.cpu.matmul_packed import _panels_per_row

    assert _panels_per_row(144, 2, 12, 2) == 6  # GPT-2's 2304 columns on AVX2
    assert _panels_per_row(3142, 2, 12, 2) == 2  # 2 x 1571: the LM head
    assert _panels_per_row(4, 2, 12, 2) == 1  # 4 panels, 2 cores: a panel a task
    assert _panels_per_row(7, 2, 12, 1) == 1  # a prime count: one panel a row


def test_negative_unpadded_symbolic_m_needs_opt_one():
    # seq compiled for 128 rows with M unpadded: no register tile divides it, no schedule
    assert MatmulPacked().apply(_symbolic_packed(opt=128), TARGET) is None
    # padded rows (the pass's default for symbolic M) keep their register tile
    text = MatmulPacked().apply(_symbolic_packed(opt=128, rows=12), TARGET).mod["main"].script()
    assert "T.min(" in text


@pytest.mark.parametrize("seq,n", [(1, 50), (3, 50), (1, 192), (5, 192)])
def test_numerics_one_row_build_at_any_seq(seq, n):
    # N = 50: not a multiple of the panel; 192: 12 panels, several a row tile; the one-row
    # build also runs a prompt of several rows
    import compiler
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, n)).astype("float32")
    b = rng.standard_normal((n,)).astype("float32")
    model = onnx_model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                        helper.make_node("Add", ["h", "b"], ["y"])],
                       [("x", [1, "seq", 24])], [("y", [1, "seq", n])], {"w": w, "b": b})
    cm = compiler.compile(model, dims={"seq": (1, 8, 1)})
    packed = next(r for r in cm.report["passes"] if r["name"] == "pack_matmul_weights")
    assert sum(packed["rewrites"].values()) == 1, packed
    # the one-row kernel and its padded-tile variant for prompts (row_variants.py)
    assert cm.report["schedules"].get("cpu.matmul_packed", 0) == 2, cm.report["schedules"]
    assert len(cm.report["row_variants"]) == 1
    x = rng.standard_normal((1, seq, 24)).astype("float32")
    got = cm.session().run(None, {"x": x})[0]
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seq", [1, 3])
def test_one_row_build_of_flattened_rows(seq):
    """GPT-2's Conv1D: Reshape(x, [-1, K]) @ W + b over batch * seq rows, batch 1..1 and seq
    opt 1: the product is one row at the opts, so the matmul is not padded to the register
    tile and the rule runs it one row per row (it was padded to 6 rows on AVX2)."""
    import compiler
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    w = rng.standard_normal((24, 50)).astype("float32")
    b = rng.standard_normal((50,)).astype("float32")
    model = onnx_model([helper.make_node("Reshape", ["x", "flat"], ["x2"]),
                        helper.make_node("Gemm", ["x2", "w", "b"], ["y"])],
                       [("x", ["batch", "seq", 24])], [("y", ["rows", 50])],
                       {"w": w, "b": b, "flat": np.array([-1, 24], np.int64)})
    dims = {"batch": (1, 1), "seq": (1, 8, 1)}
    cm = compiler.compile(model, dims=dims)
    # the one-row kernel and its padded-tile variant for prompts (row_variants.py)
    assert cm.report["schedules"].get("cpu.matmul_packed", 0) == 2, cm.report["schedules"]
    assert len(cm.report["row_variants"]) == 1
    mod, rules, _ = compiler.driver.schedule_kernels(model, target="host", dims=dims)
    (name,) = [n for n, r in rules.items() if r == "cpu.matmul_packed"]
    assert "T.min(" not in mod[name].script()  # no clamped reads of padded rows
    x = rng.standard_normal((1, seq, 24)).astype("float32")
    got = cm.session().run(None, {"x": x})[0]
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def _flattened_packed(opts, k=48, n=40, nr=16):
    """The packed matmul PrimFunc over x[batch * seq, k] (dims' opts ``opts``)."""
    import tvm
    from tvm import te

    from compiler.lowering.symbolic import DIM_OPT_ATTR

    rows = tvm.tirx.Var("batch", "int64") * tvm.tirx.Var("seq", "int64")
    x = te.placeholder((rows, k), "float32", "x")
    wp = te.placeholder((-(-n // nr), k, nr), "float32", "wp")
    return te.create_prim_func([x, wp, matmul_packed(x, wp, 1, n)]).with_attr(DIM_OPT_ATTR,
                                                                               opts)


def test_flattened_rows_at_one_run_one_row():
    """batch * seq rows at opts batch 1, seq 1: one row per row, unpadded; at seq opt 4 the
    unpadded product has no tile that divides it: no schedule (the pass pads it then)."""
    text = MatmulPacked().apply(_flattened_packed({"batch": 1, "seq": 1}), TARGET)\
        .mod["main"].script()
    assert "T.min(" not in text and text.split("for k")[1].count("T.vectorized(16)") == 1
    assert MatmulPacked().apply(_flattened_packed({"batch": 1, "seq": 4}), TARGET) is None


def test_structure_write_back_rows_unrolled_for_flattened_symbolic_rows():
    # rows of batch * seq padded to the tile: the epilogue's row loop is unrolled like the
    # tile's, so the accumulators are indexed by constants (a kept loop left them in
    # memory, stored every k step: 1.6x slower at 64 rows)
    from compiler import driver

    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((24, 32)).astype("float32"),
             "b": rng.standard_normal(32).astype("float32"), "s": np.array([-1, 24], np.int64)}
    model = onnx_model([helper.make_node("Reshape", ["x", "s"], ["r"]),
                        helper.make_node("MatMul", ["r", "w"], ["h"]),
                        helper.make_node("Add", ["h", "b"], ["y"])],
                       [("x", ["batch", "seq", 24])], [("y", ["rows", 32])], inits)
    mod, rules, _ = driver.schedule_kernels(model, dims={"batch": (1, 2, 2), "seq": (1, 64, 64)})
    (gv, func), = mod.functions.items()
    assert rules[gv.name_hint] == "cpu.matmul_packed"
    text = func.script()
    write_back = text[:text.index('T.sblock("T_add")')].split("for k in")[-1]
    rows = next(ln for ln in write_back.splitlines() if ln.strip().startswith("for ax"))
    assert "T.unroll(" in rows, write_back


def _mlp_model(m=60, k=64, n=96, gelu=True):
    """x[1, m, k] @ W + b, then GELU in its erf form (as torch.onnx exports nn.GELU())."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((k, n)).astype("float32") / 8,
             "b": rng.standard_normal(n).astype("float32"),
             "s2": np.array(2 ** 0.5, np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="fc1"),
             helper.make_node("Add", ["mm", "b"], ["h" if gelu else "y"], name="bias")]
    if gelu:
        nodes += [helper.make_node("Div", ["h", "s2"], ["d"]),
                  helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["a"]),
                  helper.make_node("Mul", ["h", "a"], ["p"]),
                  helper.make_node("Mul", ["p", "half"], ["y"])]
    return onnx_model(nodes, [("x", (1, m, k))], [("y", (1, m, n))], inits)


def _after_update(tmp_path, model):
    import onnx
    from compiler.driver import schedule_kernels

    path = str(tmp_path / "mlp.onnx")
    onnx.save(model, path)
    mod, rules, _ = schedule_kernels(path)
    (name, rule), = rules.items()
    assert rule == "cpu.matmul_packed"
    text = mod[name].script()
    return text[text.index('T.sblock("matmul_packed_update")'):]


@pytest.mark.parametrize("m", [60, 37])
def test_long_epilogue_runs_over_the_stored_tile(tmp_path, m):
    """GELU's erf (expanded to polynomials and an exp) after the tile is stored, as a loop
    over its rows, one vector at a time; not inlined into the unrolled write-back of all
    the tile's outputs at once (LLVM spilled: Whisper's MLP GELU 5.5 -> 1.8 ms).  Rows
    padded to whole tiles too (37 -> 48; BERT's 128 -> 132): the epilogue, guarded by row,
    ran unrolled over the tile, and LLVM took 1.8-2.7 s on BERT-base's kernel (0.3 s)."""
    tail = _after_update(tmp_path, _mlp_model(m=m))
    blocks = [ln.strip() for ln in tail.splitlines() if "T.sblock(" in ln]
    assert len(blocks) == 3  # the update, the tile's store, the epilogue over it
    epilogue = tail[:tail.rindex("T.sblock(")]
    row_loop = [ln for ln in epilogue.splitlines() if " for " in ln][-3]
    assert "T.grid(" in row_loop and "T.unroll" not in row_loop, row_loop


def test_short_epilogue_stays_in_the_write_back(tmp_path):
    tail = _after_update(tmp_path, _mlp_model(gelu=False))
    assert sum("T.sblock(" in ln for ln in tail.splitlines()) == 2  # update, write-back


@pytest.mark.parametrize("m,n", [(60, 96), (37, 64), (1, 32)])
def test_numerics_long_epilogue(m, n):
    model = _mlp_model(m=m, n=n)
    x = np.random.default_rng(4).standard_normal((1, m, 64)).astype("float32")
    check_against_ort(model, {"x": x}, "cpu.matmul_packed")


def test_panel_group_fits_half_the_l2(monkeypatch):
    from schedules.cpu import common, matmul_packed as mp

    for l2, k, want in ((2 << 20, 768, 8), (1 << 20, 768, 4), (512 << 10, 768, 1),
                        (2 << 20, 3072, 1),   # 2 panels of K = 3072: below the minimum
                        (2 << 20, 512, 8)):   # 16 would fit: capped
        monkeypatch.setattr(common, "l2_bytes", lambda target, v=l2: v)
        assert mp._panel_group(96, k, 32, TARGET, 1500) == want, (l2, k)
    monkeypatch.setattr(common, "l2_bytes", lambda target: 2 << 20)
    assert mp._panel_group(7, 768, 32, TARGET, 577) == 7  # divisors of the panel count
    assert mp._panel_group(11, 768, 32, TARGET, 577) == 1
    # A in half the L2 (GPT-2's 128 x 768, 384 KB), or M symbolic: one panel a sweep
    assert mp._panel_group(96, 768, 32, TARGET, 128) == 1
    assert mp._panel_group(96, 768, 32, TARGET, None) == 1


def test_structure_a_row_tile_sweeps_a_group_of_panels():
    # A [577, 768] outgrows L2: each 12-row tile of A serves 4 weight panels (TARGET's
    # default 1 MB L2: 4 x 96 KB panels in half of it) before the next tile
    def build(bb, a, wp, c):
        return bb.emit(relax.op.add(
            bb.call_te(matmul_packed, a, wp, 12, primfunc_name_hint="matmul"), c))
    f = fused_primfunc(build, [(1, 577, 768), (8, 768, 32), (256,)], "fused_matmul_add")
    text = MatmulPacked().apply(f, TARGET).mod["main"].script()
    assert "T.parallel(T.int64(98))" in text  # 2 groups x 49 row tiles
    group = text.index("in range(T.int64(4)):")
    assert group < text.index("for k in range(T.int64(768)):")
    # one panel per sweep where the panels are large (K = 3072: 384 KB each)
    f = fused_primfunc(build, [(1, 60, 3072), (8, 3072, 32), (256,)], "fused_matmul_add")
    text = MatmulPacked().apply(f, TARGET).mod["main"].script()
    assert "in range(T.int64(4)):" not in text and "T.parallel(T.int64(40))" in text


def test_numerics_grouped_panels_with_padded_rows_and_gelu():
    # A [577, 768] (1.7 MB) outgrows half of any L2 here: grouped panels, rows padded
    rng = np.random.default_rng(3)
    k, n = 768, 256
    w = (rng.standard_normal((k, n)) * 0.05).astype("float32")
    bias = rng.standard_normal((n,)).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             # GELU as exported (erf): fuse_gelu makes it the matmul's long epilogue
             helper.make_node("Div", ["hb", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
             helper.make_node("Mul", ["hb", "e1"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "half"], ["y"], name="half")]
    model = onnx_model(nodes, [("x", (1, 577, k))], [("y", (1, 577, n))],
                       {"w": w, "b": bias, "sqrt2": np.array(np.sqrt(2), np.float32),
                        "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)})
    x = rng.standard_normal((1, 577, k)).astype("float32")
    check_against_ort(model, {"x": x}, "cpu.matmul_packed")
