"""place_concat: concat on a leading axis => an unfused concat kernel marked for placement.

Whether the planner then places it (no kernel at all) is tested with the storage plan in
tests/compiler/lowering/test_graph.py; here: which concats the pass marks, which it leaves
to fusion, and that both compile to onnxruntime's numbers.
"""

from __future__ import annotations

import logging

import numpy as np
from onnx import helper

from passes import PlaceConcat
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "concat => placed concat (no kernel if the planner places it)"
RNG = np.random.default_rng(0)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def dense_block(layers: int = 3, c0: int = 16, growth: int = 8, hw: int = 6):
    """DenseNet's dense block: layer k concatenates the block input and every earlier
    layer's output, then BN (x*s+t) + Relu + conv; a stem conv makes the block input an
    intermediate.  Output: Relu of the last concat."""
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"], name="stem", pads=[1] * 4)]
    inits, feats, c = {"w0": _w(c0, 3, 3, 3)}, ["x0"], c0
    for k in range(layers):
        cat = f"cat{k}" if k else "x0"
        if k:
            nodes.append(node("Concat", feats, cat, axis=1))
        inits[f"s{k}"] = RNG.uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32)
        inits[f"t{k}"], inits[f"w{k + 1}"] = _w(1, c, 1, 1), _w(growth, c, 3, 3)
        nodes += [node("Mul", [cat, f"s{k}"], f"m{k}"), node("Add", [f"m{k}", f"t{k}"], f"a{k}"),
                  node("Relu", [f"a{k}"], f"r{k}"),
                  helper.make_node("Conv", [f"r{k}", f"w{k + 1}"], [f"f{k + 1}"],
                                   name=f"conv{k + 1}", pads=[1] * 4)]
        feats.append(f"f{k + 1}")
        c += growth
    nodes += [node("Concat", feats, "catL", axis=1), node("Relu", ["catL"], "y")]
    return model(nodes, {"x": [1, 3, hw, hw]}, {"y": [1, c, hw, hw]}, inits)


def _convs(n: int, batch: int = 1, c: int = 8, hw: int = 4):
    """``n`` convs of x (named f1..fn, ``hw`` x ``hw`` pixels), so concat inputs are kernel
    outputs."""
    nodes = [helper.make_node("Conv", ["x", f"w{k}"], [f"f{k}"], name=f"f{k}", pads=[1] * 4)
             for k in range(1, n + 1)]
    return nodes, {f"w{k}": _w(c, 4, 3, 3) for k in range(1, n + 1)}, [batch, 4, hw, hw]


def negatives() -> dict:
    """Concats the pass must leave to fusion, by (part of) the reason it logs."""
    nodes, w, xs = _convs(2, batch=2)
    inner = model(nodes + [node("Concat", ["f1", "f2"], "c", axis=1), node("Relu", ["c"], "y")],
                  {"x": xs}, {"y": [2, 16, 4, 4]}, w)
    nodes, w, xs = _convs(1)
    graph_input = model(nodes + [node("Concat", ["f1", "z"], "c", axis=1),
                                 node("Relu", ["c"], "y")],
                        {"x": xs, "z": [1, 8, 4, 4]}, {"y": [1, 16, 4, 4]}, w)
    constant = model(nodes + [node("Concat", ["f1", "k"], "c", axis=1),
                              node("Relu", ["c"], "y")],
                     {"x": xs}, {"y": [1, 16, 4, 4]}, {**w, "k": _w(1, 8, 4, 4)})
    nodes, w, xs = _convs(2)
    output = model(nodes + [node("Concat", ["f1", "f2"], "y", axis=1)],
                   {"x": xs}, {"y": [1, 16, 4, 4]}, w)
    input_is_output = model(nodes + [node("Concat", ["f1", "f2"], "c", axis=1),
                                     node("Relu", ["c"], "y")],
                            {"x": xs}, {"y": [1, 16, 4, 4], "f1": [1, 8, 4, 4]}, w)
    nodes, w, xs = _convs(1)
    twice = model(nodes + [node("Concat", ["f1", "f1"], "c", axis=1),
                           node("Relu", ["c"], "y")],
                  {"x": xs}, {"y": [1, 16, 4, 4]}, w)
    nodes, w, xs = _convs(2, hw=5)  # 8 channels x 5 x 5 x 4 bytes: f2 would start at 800
    unaligned = model(nodes + [node("Concat", ["f1", "f2"], "c", axis=1),
                               node("Relu", ["c"], "y")], {"x": xs}, {"y": [1, 16, 5, 5]}, w)
    return {"not the first non-unit axis": inner, "no multiple of 64": unaligned,
            "is a model input": graph_input, "is a constant": constant,
            "is a model output": output, "or an input is a model output": input_is_output,
            "concatenated twice": twice}


def test_structure_marks_dense_block_concats():
    before, after, r = run_pass(PlaceConcat(), dense_block())
    assert before["relax.concat"] == 3 and "relax.concat" not in after
    assert r.rewrites == {RULE: 3} and r.nodes == ["cat1", "cat2", "catL"]


def test_negative_cases_left_to_fusion(caplog):
    for why, m in negatives().items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="onnxc.passes"):
            before, after, r = run_pass(PlaceConcat(), m)
        assert before["relax.concat"] == 1, why
        assert after.get("relax.concat") == 1 and r.rewrites == {}, (why, after)
        assert any("left to fusion" in m and why in m for m in caplog.messages), \
            (why, caplog.messages)


def test_numerics_against_onnxruntime():
    m = dense_block()
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    got, cm = compile_run(m, {"x": x})
    assert report(cm, "place_concat")["rewrites"] == {RULE: 3}
    # all three placed: their 24, 32, 40 channels x 36 pixels x 4 bytes not copied per run
    assert cm.report["concats"] == {"placed": 3, "bytes_not_copied": (24 + 32 + 40) * 36 * 4,
                                    "kernels": []}
    assert_close(got, ort_run(m, {"x": x}))
    off, _ = compile_run(m, {"x": x}, disabled_passes=["place_concat"])
    assert_close(off, ort_run(m, {"x": x}))


def test_negative_cases_numerics_against_onnxruntime():
    for why, m in negatives().items():
        feeds = {i.name: RNG.standard_normal(
            [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in m.graph.input}
        got, cm = compile_run(m, feeds)
        assert_close(got, ort_run(m, feeds))
        # after convert_layout a layout transform writes the model output, so a concat next
        # to an output may be placed after all (its storage is no model output's)
        if "model output" in why:  # in NCHW the concat's storage is the output's: a kernel
            got, cm = compile_run(m, feeds, layout="NCHW")
        assert cm.report["concats"]["placed"] == 0, why
        assert_close(got, ort_run(m, feeds))
