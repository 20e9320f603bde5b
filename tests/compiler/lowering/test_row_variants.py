"""compiler/lowering/row_variants.py: padded-tile variants of one-row kernels (a decoder's
prompt), smaller-tile variants of padded ones (few rows), and the runtime's choice between
them (runtime/dims.py pick_variant)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import compiler
import runtime
from compiler import driver
from compiler.lowering.row_variants import (SUFFIX, VARIANT_COUNT, general_variant, padded_tile,
                                           repadded, variant_tiles)
from passes.pack_matmul_weights import tile_cost
from runtime.dims import pick_variant
from tests.schedules.util import onnx_model

ONE_ROW = {"batch": (1, 2, 1), "seq": (1, 64, 1)}  # a decoder's dims: opt 1


def _flat(k=24, n=40, dims=("batch", "seq")):
    """x[batch, seq, k] reshaped to [batch * seq, k] (GPT-2's Conv1D) @ W + b."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((k, n)).astype("float32"),
             "b": rng.standard_normal(n).astype("float32"),
             "s": np.array([-1, k], np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["y"])]
    return onnx_model(nodes, [("x", [*dims, k])], [("y", ["rows", n])], inits)


def _head(k=24, n=50):
    """x[batch, seq, k] @ W, N = 50: W's last panel padded (a column cut), no epilogue."""
    w = np.random.default_rng(1).standard_normal((k, n)).astype("float32")
    return onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                      [("x", ["batch", "seq", k])], [("y", ["batch", "seq", n])], {"w": w})


def test_structure_variant_pads_rows_and_keeps_the_epilogue():
    graph, funcs = driver.lower_to_kernels(_flat(), dims=ONE_ROW)
    (name, func), = funcs.items()
    before = func.script()
    assert "T.min(" not in before  # one row at a time: A read at its own row
    variant, rows = general_variant(func, 6)
    text = variant.script()
    assert str(rows) == "batch * seq"
    assert "T.min(v_i0, batch * seq - T.int64(1))" in text  # clamped reads
    assert "(batch * seq + T.int64(5)) // T.int64(6) * T.int64(6)" in text  # padded rows
    assert "T_add" in text  # the fused bias add unchanged
    assert [p.name for p in variant.params] == [p.name for p in func.params]


def test_structure_column_cut_is_replaced_by_one_cut():
    graph, funcs = driver.lower_to_kernels(_head(), dims=ONE_ROW)
    (name, func), = funcs.items()
    variant, _ = general_variant(func, 6)
    text = variant.script()
    assert text.count('T.sblock("matmul_rows")') == 1 and "T.min(" in text


def test_negative_static_rows_get_no_variant():
    _, funcs = driver.lower_to_kernels(_flat(dims=(1, 5)))
    assert all(general_variant(f, 6) is None for f in funcs.values())
    cm = compiler.compile(_flat(dims=(1, 5)))
    assert cm.report.get("row_variants", []) == []


def test_structure_padded_rows_get_smaller_tile_variants():
    """seq at opt 64: the pass pads the rows to the full tile itself; the kernel gets
    variants padded to smaller tiles, for calls of few rows."""
    _, funcs = driver.lower_to_kernels(_flat(), dims={"batch": (1, 2, 1), "seq": (1, 64, 64)})
    (func,) = funcs.values()
    assert general_variant(func, 8) is None  # not a one-row kernel
    tile, rows = padded_tile(func)
    assert tile == 12 or tile == 6  # the target's full tile
    assert str(rows) == "batch * seq"
    text = repadded(func, tile, 8).script()
    assert "(batch * seq + T.int64(7)) // T.int64(8) * T.int64(8)" in text
    assert text.count('T.sblock("matmul_rows")') == 1


def test_use_variant_when_padding_adds_at_most_half():
    """A one-row kernel against its padded variant: what use_variant decided before
    the choices became a list (padding that adds at most half the rows)."""
    def use(rows, tile):
        return pick_variant(rows, [("one", 1, 1.5), ("pad", tile, 1.0)]) == 1
    assert not use(1, 6) and not use(2, 6) and not use(3, 6)
    assert use(4, 6) and use(12, 6) and use(64, 6)
    assert not use(7, 6)  # 12 padded rows for 7
    assert not use(7, 12) and use(8, 12)  # AVX-512's 12-row tiles


def test_pick_variant_takes_the_tile_that_fits_the_rows():
    choices = [("k", 12, 1.0)] + [(f"k{t}", t, tile_cost(t, 12)) for t in variant_tiles(12)]
    assert variant_tiles(12) == [8, 10, 11] and variant_tiles(6) == [2, 4, 5]
    picked = {m: choices[pick_variant(m, choices)][1] for m in (1, 7, 12, 16, 20, 22, 50, 128)}
    assert picked == {1: 8, 7: 8, 12: 12, 16: 8, 20: 10, 22: 11, 50: 10, 128: 12}


def _relu(k=24, n=32):
    """x @ W then Relu, N whole panels: the epilogue reads only the matmul's result (a
    one-input elementwise block, not the column cut the variant replaces)."""
    w = np.random.default_rng(3).standard_normal((k, n)).astype("float32")
    return onnx_model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                       helper.make_node("Relu", ["h"], ["y"])],
                      [("x", ["batch", "seq", k])], [("y", ["batch", "seq", n])], {"w": w})


@pytest.mark.parametrize("make", [_flat, _head, _relu])
def test_numerics_every_row_count_from_one_artifact(make, tmp_path):
    model = make()
    cm = compiler.compile(model, dims=ONE_ROW)
    assert len(cm.report["row_variants"]) == 1
    assert cm.report["schedules"] == {"cpu.matmul_packed": 2}
    path = cm.export(str(tmp_path / "m.so"))
    sess = runtime.load(path)  # the variant travels in the artifact
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for b, s in [(1, 1), (1, 2), (1, 3), (2, 1), (1, 7), (2, 31), (2, 64), (1, 1)]:
        x = rng.standard_normal((b, s, 24)).astype("float32")
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-5)


def test_runtime_runs_the_variant_only_for_several_rows(tmp_path):
    cm = compiler.compile(_flat(), dims=ONE_ROW)
    (base,) = cm.report["row_variants"]
    opts = runtime.SessionOptions(enable_profiling=True,
                                  profile_file_prefix=str(tmp_path / "prof"))
    sess = cm.session(opts)
    ran = []
    for s in (1, 3, 12):
        sess.run(None, {"x": np.ones((1, s, 24), np.float32)})
    with open(sess.end_profiling()) as f:
        ran = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    assert ran == [base, base, base + SUFFIX]


@pytest.mark.parametrize("make", [_flat, _head])
def test_numerics_padded_rows_every_tile_from_one_artifact(make, tmp_path):
    """Rows padded to the full tile (seq opt 64) with smaller-tile variants: every row
    count from one artifact against onnxruntime, and the runtime ran the tile that fits."""
    model = make()
    cm = compiler.compile(model, dims={"batch": (1, 2, 1), "seq": (1, 64, 64)})
    (base,) = cm.report["row_variants"]
    assert cm.report["schedules"] == {"cpu.matmul_packed": 1 + VARIANT_COUNT}
    path = cm.export(str(tmp_path / "m.so"))
    opts = runtime.SessionOptions(enable_profiling=True,
                                  profile_file_prefix=str(tmp_path / "prof"))
    sess = runtime.load(path, opts)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    shapes = [(1, 1), (1, 5), (2, 8), (1, 16), (1, 23), (2, 33), (2, 64), (2, 60)]
    for b, s in shapes:
        x = rng.standard_normal((b, s, 24)).astype("float32")
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-5)
    with open(sess.end_profiling()) as f:
        ran = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    assert len(ran) == len(shapes) and ran[-1] == base  # 60 or 120 rows: the full tile
    assert len(set(ran)) >= 2 and all(k == base or k.startswith(base + SUFFIX) for k in ran)
