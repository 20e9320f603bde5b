"""compiler/lowering/checked.py: checked variants of fused kernels (intermediates exposed,
each step named after its ONNX node), their numerics, and kernels that get none."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import compiler
from compiler.driver import lower_to_kernels
from compiler.lowering.checked import SUFFIX, expose_intermediates
from runtime.instruments import run_checked

HOST = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 2}


def _model(ops=("Sub", "Log", "Relu")):
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    nodes, prev = [], "x"
    for k, op in enumerate(ops):
        ins = [prev, "one"] if op in ("Sub", "Add", "Mul") else [prev]
        out = "y" if k == len(ops) - 1 else f"t{k}"
        nodes.append(helper.make_node(op, ins, [out], name=f"{op.lower()}{k}"))
        prev = out
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                    [3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
                          [one])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_fused_kernel_gets_a_variant_with_each_intermediate_as_an_output():
    graph, prim_funcs = lower_to_kernels(_model(), HOST)
    (call,) = graph.calls
    symbol = call["kernel"]
    assert list(graph.checked) == [symbol + SUFFIX]
    variant = graph.checked[symbol + SUFFIX]
    # x, y, then the two intermediates (Sub's and Log's results)
    assert len(variant.params) == len(prim_funcs[symbol].params) + 2 == 4
    steps = call["checked"]["steps"]
    assert [(s["node"], s["op"], s["tensor"], s["place"], s["reads"]) for s in steps] == [
        ("sub0", "Sub", "t0", ["tmp", 0], [["in", 0]]),
        ("log1", "Log", "t1", ["tmp", 1], [["step", 0]]),
        ("relu2", "Relu", "y", ["out", 0], [["step", 1]])]
    assert call["checked"]["temps"] == [{"shape": [3, 5], "dtype": "float32"}] * 2
    assert call["checked"]["kernel"] == symbol + SUFFIX


def test_variant_recomputes_every_step():
    cm = compiler.compile(_model())
    assert cm.report["checked_kernels"] == 1 and "build_checked" in cm.report["stages"]
    sess = cm.session()
    (call,) = cm.meta["graph"]["calls"]
    x = np.linspace(-1, 4, 15, dtype=np.float32).reshape(3, 5)
    with np.errstate(invalid="ignore"):
        s = x - 1
        l_ = np.log(s)
    got = run_checked(call, [x], sess._np, sess._kernels)
    np.testing.assert_allclose(got[0], s, rtol=1e-6)
    np.testing.assert_allclose(got[1], l_, rtol=1e-5, equal_nan=True)
    np.testing.assert_allclose(got[2], np.where(np.isnan(l_), l_, np.maximum(l_, 0)),
                               rtol=1e-5, equal_nan=True)
    # the session's own memory is not written by the variant
    assert not np.shares_memory(got[2], sess._np[call["args"][-1]])


def test_single_node_kernels_get_no_variant():
    graph, _ = lower_to_kernels(_model(("Softmax",)), HOST)
    assert not graph.checked and all("checked" not in c for c in graph.calls)


def test_intermediates_that_do_not_match_the_steps_give_no_variant():
    graph, prim_funcs = lower_to_kernels(_model(), HOST)
    (symbol,) = prim_funcs
    nparams = len(prim_funcs[symbol].params) - 1
    wrong_name = (nparams, [("no_such_buffer", [("in", 0)]), ("x", [("step", 0)]),
                            ("y", [("step", 1)])], [2])
    assert expose_intermediates(prim_funcs[symbol], wrong_name) is None
    wrong_arity = (nparams + 1, [("a", []), ("b", [])], [1])
    assert expose_intermediates(prim_funcs[symbol], wrong_arity) is None
