"""schedules/flops.py: TVM's FLOP estimate of reductions (Lets substituted), one operation
per element of an elementwise op."""

from __future__ import annotations

import numpy as np
from onnx import helper
from tvm import te, tirx

import compiler
from passes.stable_sigmoid import stable_sigmoid_te
from schedules import flops
from tests.schedules.util import onnx_model


def test_let_in_a_reduction_is_counted_as_if_substituted():
    x = te.placeholder((4, 16), name="x")
    k = te.reduce_axis((0, 16), name="k")

    def with_let(i):
        v = tirx.Var("v", "float32")
        return te.sum(tirx.Let(v, x[i, k] * x[i, k], v + v), axis=k)

    plain = te.compute((4,), lambda i: te.sum(x[i, k] * x[i, k] + x[i, k] * x[i, k], axis=k))
    bound = te.compute((4,), with_let)
    # per iteration: two multiplies, their add, the accumulation
    assert flops.estimate(te.create_prim_func([x, bound])) == \
        flops.estimate(te.create_prim_func([x, plain])) == 4 * 64


def test_an_elementwise_op_is_one_per_element_whatever_its_approximation():
    """The stable sigmoid's exp is a polynomial of ~25 operations (math_f32), TVM's exp a
    call the estimator does not count: both are one operation per element, as FLOP
    counters count activations (CSPDarknet53 with Mish counted 56.9 GFLOP for 13.6 of
    convs, and the benchmark printed 220% of the machine's peak).  Moving data (a copy, a
    cast, a gather's index arithmetic, a padding select) counts nothing; a ReLU as a select
    of floats counts."""
    x = te.placeholder((4, 16), name="x")
    count = lambda y: flops.estimate(te.create_prim_func([x, y]))  # noqa: E731
    assert count(stable_sigmoid_te(x)) == 64
    assert count(te.compute(x.shape, lambda *i: tirx.exp(x(*i)))) == 64
    assert count(te.compute(x.shape, lambda i, j: x[i, j] * 2.0 + 1.0)) == 64
    assert count(te.compute(x.shape, lambda i, j: x[(i + 1) % 4, 15 - j])) == 0
    assert count(te.compute(x.shape, lambda *i: x(*i).astype("float16"))) == 0
    pad = lambda i, j: tirx.if_then_else(j > 0, x[i, tirx.max(j - 1, 0)], 0.0)  # noqa: E731
    assert count(te.compute(x.shape, pad)) == 0
    assert count(te.compute(x.shape, lambda *i: tirx.Select(x(*i) > 0.0, x(*i), 0.0))) == 64


def test_a_fused_kernel_counts_its_reduction_and_its_epilogue():
    a, b = te.placeholder((64, 32), name="a"), te.placeholder((32, 16), name="b")
    k = te.reduce_axis((0, 32), name="k")
    mm = te.compute((64, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    sig = stable_sigmoid_te(mm)
    swish = te.compute((64, 16), lambda i, j: mm[i, j] * sig[i, j], name="swish")
    assert flops.estimate(te.create_prim_func([a, b, swish])) == 2 * 64 * 16 * 32 + 2 * 64 * 16


def test_conv_with_a_swish_epilogue_reports_its_flops():
    w = np.random.default_rng(0).standard_normal((16, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    cm = compiler.compile(onnx_model(nodes, [("x", (1, 8, 8, 8))], [("y", (1, 16, 8, 8))],
                                     {"w": w}))
    conv = next(r for r in cm.report["kernel_table"] if "conv" in r["kernel"])
    assert "sigmoid" in conv["kernel"] and conv["flops"] >= 2 * 16 * 8 * 64


def test_symbolic_kernel_counted_at_the_dims_opt():
    # rows of batch * seq (GPT-2's Conv1D flattens them): the kernel table counts the
    # kernel at the opts (specialize refuses a shape that is not one Var)
    from compiler.lowering.graph import _flops
    from passes.pack_matmul_weights import matmul_packed

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    x = te.placeholder((b * s, 64), name="x")
    wp = te.placeholder((6, 64, 16), name="wp")
    f = te.create_prim_func([x, wp, matmul_packed(x, wp, 1, 96)])
    assert _flops(f, {"batch": 2, "seq": 3}) == 2 * 6 * 64 * 96
    assert _flops(f, {"batch": 1, "seq": 1}) == 2 * 64 * 96


def test_fused_kernel_with_dim_parameters_counted_at_the_opts():
    # a fused kernel over batch * seq rows that takes batch and seq as scalar parameters
    # (GPT-2's Conv1D after the reshape): the kernel table counts it at the opts
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((24, 40)).astype(np.float32),
             "b": rng.standard_normal(40).astype(np.float32),
             "s": np.array([-1, 24], np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["y"])]
    model = onnx_model(nodes, [("x", ["batch", "seq", 24])], [("y", ["rows", 40])], inits)
    # the row padding pinned to 6 rows: a symbolic M is always padded to the register
    # tile's rows (12 on AVX-512), a static 6 only where that pays (pad_rows), so with the
    # host's default the two builds compute different row counts on AVX-512 hosts
    rows = {"pack_matmul_weights": {"rows": 6}}
    cm = compiler.compile(model, dims={"batch": (1, 2, 2), "seq": (1, 16, 3)}, pass_config=rows)
    (row,) = cm.report["kernel_table"]
    (static,) = compiler.compile(model, input_shapes={"x": [2, 3, 24]},
                                 pass_config=rows).report["kernel_table"]
    # as the static build counts it (W's last panel padded to whole panels included)
    assert row["flops"] == static["flops"] >= 6 * (2 * 24 * 40 + 40)
