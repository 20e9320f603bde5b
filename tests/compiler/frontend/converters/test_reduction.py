"""Reductions (compiler/frontend/converters/reduction.py and the float max/min identity of
compiler/lowering/legalize_reductions.py) against onnx.reference: empty inputs give
ONNX's identity, bools, all-infinite rows."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import compiler
from tests.compiler.frontend.converters.reference import (B, F, check_against_reference,
                                                          initializer, onnx_model, typed,
                                                          untyped_output, value_info)


@pytest.mark.parametrize("op,opset", [("ReduceSum", 13), ("ReduceMax", 20), ("ReduceMin", 20),
                                      ("ReduceProd", 18), ("ReduceLogSumExp", 18),
                                      ("ReduceMean", 18), ("ReduceL2", 18)])
def test_reduce_empty_gives_the_identity(op, opset):
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    model = onnx_model(node, [value_info("x", F, [2, 0, 4])], [untyped_output("y")], opset,
                   [initializer("axes", np.array([1], np.int64))])
    x = np.zeros((2, 0, 4), np.float32)
    model, (want,) = typed(model, {"x": x})
    got = compiler.compile(model).session().run(None, {"x": x})[0]
    assert got.shape == want.shape == (2, 1, 4)
    np.testing.assert_array_equal(got, want)


def test_reduce_empty_over_a_non_empty_axis_and_on_bools():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    model = onnx_model(node, [value_info("x", F, [2, 0, 4])], [untyped_output("y")], 13,
                   [initializer("axes", np.array([2], np.int64))])
    check_against_reference(model, {"x": np.zeros((2, 0, 4), np.float32)})
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)
    model = onnx_model(node, [value_info("x", B, [2, 0, 4])], [untyped_output("y")], 20,
                   [initializer("axes", np.array([1], np.int64))])
    check_against_reference(model, {"x": np.zeros((2, 0, 4), bool)})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_of_bools(op):
    x = np.array([[True, True], [True, False], [False, True], [False, False]])
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    model = onnx_model(node, [value_info("x", B, [4, 2])], [untyped_output("y")], 20,
                   [initializer("axes", np.array([1], np.int64))])
    check_against_reference(model, {"x": x})


def test_reduce_max_min_of_all_infinite_rows():
    """TVM's max/min reductions started from the lowest/highest finite value."""
    x = np.full((2, 4), -np.inf, np.float32)
    x[1, 2] = 3
    for op, data, want in (("ReduceMax", x, [[-np.inf], [3]]), ("ReduceMin", -x, [[np.inf], [-3]])):
        node = helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=1)
        model = onnx_model(node, [value_info("x", F, [2, 4])], [value_info("y", F, [2, 1])], 13)
        got = compiler.compile(model).session().run(None, {"x": data})[0]
        np.testing.assert_array_equal(got, np.array(want, np.float32))


@pytest.mark.parametrize("op", ["ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                                "ReduceLogSumExp"])
@pytest.mark.parametrize("axes", [None, np.zeros((0,), np.int64)])
def test_reduce_nothing_keeps_the_elementwise_part(op, axes):
    """noop_with_empty_axes=1 without axes: ONNX's function bodies (ReduceSumSquare =
    ReduceSum(x * x), ...) still square / abs / log; TVM's converters returned x."""
    from tests.conftest import assert_close, ort_run

    inits = [] if axes is None else [initializer("axes", axes)]
    node = helper.make_node(op, ["x"] + (["axes"] if inits else []), ["y"],
                            keepdims=1, noop_with_empty_axes=1)
    model = onnx_model(node, [value_info("x", F, [4, 3])], [value_info("y", F, [4, 3])], 18,
                       inits)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    x[0, 0] = 2.0 if op == "ReduceLogSum" else x[0, 0]  # log of a negative is NaN in both
    got = compiler.compile(model).session().run(None, {"x": x})
    assert_close(got, ort_run(model, {"x": x}))
