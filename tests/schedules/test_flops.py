"""schedules/flops.py: TVM's FLOP estimate, for kernels that bind values with a Let."""

from __future__ import annotations

import numpy as np
from onnx import helper
from tvm import te, tirx

import compiler
from passes.stable_sigmoid import stable_sigmoid_te
from schedules import flops
from tests.schedules.util import onnx_model


def test_let_is_counted_as_if_substituted():
    x = te.placeholder((4, 16), name="x")

    def with_let(*i):
        v = tirx.Var("v", "float32")
        return tirx.Let(v, x(*i) * x(*i), v + v)

    plain = te.compute((4, 16), lambda *i: x(*i) * x(*i) + x(*i) * x(*i))
    bound = te.compute((4, 16), with_let)
    assert flops.estimate(te.create_prim_func([x, bound])) == \
        flops.estimate(te.create_prim_func([x, plain])) == 3 * 64
    assert flops.estimate(te.create_prim_func([x, stable_sigmoid_te(x)])) > 10 * 64


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
