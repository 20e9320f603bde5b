"""onnxc's math converters (compiler/frontend/converters/math.py: Celu, Elu, Swish,
SwiGLU, Det, Pow with mixed types, Mod's float edge cases, CumSum/CumProd) against
onnx.reference on small random models."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import UnsupportedError
from tests.compiler.onnx_check import check, run_onnxc
from tests.compiler.frontend.converters.reference import F, randn
from tests.compiler.frontend.converters.reference import I64
from tests.compiler.frontend.converters.reference import check_against_reference
import compiler
from onnx import helper
from tests.compiler.frontend.converters.reference import onnx_model
from tests.compiler.frontend.converters.reference import untyped_output
from tests.compiler.frontend.converters.reference import value_info

@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_celu(alpha):
    check("Celu", {"x": randn(3, 4)}, opset=12, alpha=alpha)


def test_celu_and_elu_float16():
    check("Celu", {"x": randn(8, dtype=np.float16)}, opset=28, rtol=2e-3, atol=1e-3, alpha=2.0)
    check("Elu", {"x": randn(8, dtype=np.float16)}, opset=28, rtol=2e-3, atol=1e-3, alpha=0.7)


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_swish_and_swiglu(alpha):
    check("Swish", {"x": randn(2, 5)}, opset=24, alpha=alpha)
    check("SwiGLU", {"a": randn(2, 5), "b": randn(2, 5)}, opset=28, alpha=alpha)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_det(n):
    check("Det", {"x": randn(3, n, n)}, opset=22, rtol=1e-4, atol=1e-4)


def test_det_refuses_large_matrices():
    with pytest.raises(UnsupportedError, match="size 7"):
        run_onnxc("Det", {"x": randn(7, 7)}, opset=22)


@pytest.mark.parametrize("base,exp", [(np.float32, np.int64), (np.int32, np.float32),
                                      (np.int64, np.int32)])
def test_pow_mixed_types_has_the_base_type(base, exp):
    a = np.array([1.5, 2, 3, -2], base) if base == np.float32 else np.array([1, 2, 3, -2], base)
    b = np.array([2, 3, 0, 3], exp) if exp != np.float32 else np.array([2, 0.5, 3, 3], exp)
    node = helper.make_node("Pow", ["a", "b"], ["y"])
    at = helper.np_dtype_to_tensor_dtype(a.dtype)
    model = onnx_model(node, [value_info("a", at, [4]), value_info("b", helper.np_dtype_to_tensor_dtype(b.dtype), [4])],
                   [untyped_output("y")], 15)
    check_against_reference(model, {"a": a, "b": b})


def test_mod_float_edge_cases_as_numpy():
    x = np.array([0, -0.0, 0, -0.0, -3, 3, -1, 1, np.inf, -np.inf, 1, 1, np.nan, 1, 5.5, -5.5],
                 np.float32)
    y = np.array([-2, 2, 2, -2, np.inf, np.inf, -np.inf, -np.inf, 2, 2, 0, -0.0, 2, np.nan,
                  -2, 2], np.float32)
    node = helper.make_node("Mod", ["x", "y"], ["z"], fmod=0)
    model = onnx_model(node, [value_info("x", F, [16]), value_info("y", F, [16])], [value_info("z", F, [16])], 13)
    got = compiler.compile(model).session().run(None, {"x": x, "y": y})[0]
    want = np.mod(x, y)
    np.testing.assert_array_equal(got, want)  # NaN where NaN, same infinities
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("op,opset,exclusive,reverse", [
    ("CumSum", 14, 0, 0), ("CumSum", 14, 1, 1), ("CumProd", 26, 1, 0), ("CumProd", 26, 0, 1)])
def test_cumulative(op, opset, exclusive, reverse):
    x = np.random.default_rng(4).random((3, 5)).astype(np.float32) + 0.5
    axis = helper.make_tensor("axis", I64, [], [1])
    node = helper.make_node(op, ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    check_against_reference(onnx_model(node, [value_info("x", F, [3, 5])], [value_info("y", F, [3, 5])], opset, [axis]),
           {"x": x})


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_pow_is_computed_by_a_kernel(dtype):
    # TVM's power takes floats only: an integer Pow failed to build (it passed the
    # conformance suite only because its small inputs were bound and folded)
    from tests.conftest import ort_run

    x = np.array([[2, -3, 5, 0], [7, 1, -2, 10]], dtype)
    y = np.array([[3, 2, 0, 4], [2, 9, 3, 5]], dtype)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph([helper.make_node("Pow", ["x", "y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", t, [2, 4]),
                           helper.make_tensor_value_info("y", t, [2, 4])],
                          [helper.make_tensor_value_info("z", t, [2, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    cm = compiler.compile(m)
    (z,) = cm.session().run(None, {"x": x, "y": y})
    assert cm.report["constant_outputs"] == []
    np.testing.assert_array_equal(z, ort_run(m, {"x": x, "y": y})[0])
    np.testing.assert_array_equal(z, np.power(x, y))


# Einsum: two float operands as one batched matmul (converters/math.py einsum)
EINSUMS = [
    ("ibnd,hnd->ibh", (6, 1, 3, 4), (5, 3, 4), True),     # XLNet's output projection
    ("ibh,hnd->ibnd", (6, 2, 5), (5, 3, 4), True),        # its q/k/v projections
    ("ibnd,jbnd->bnij", (6, 2, 3, 4), (7, 2, 3, 4), False),   # its scores
    ("hnd,ibnd->ibh", (5, 3, 4), (6, 1, 3, 4), False),    # a constant on the left
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5), False),
    ("...ij,...jk->...ik", (2, 3, 3, 4), (2, 3, 4, 5), False),   # ellipsis
    ("ij,jk", (3, 4), (4, 5), False),                     # implicit output
    ("ij,kj->ik", (3, 4), (5, 4), True),                  # transposed B
    ("ijk,jl->il", (3, 4, 2), (4, 5), False),             # k only in A: summed first
    ("i,j->ij", (3,), (4,), False),                       # outer product
    ("bhqd,bhkd->bhqk", (1, 2, 5, 8), (1, 2, 7, 8), False),
]


@pytest.mark.parametrize("eq,sa,sb,const", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_two_operands(eq, sa, sb, const):
    check("Einsum", {"a": randn(*sa), "b": randn(*sb)}, consts=("b",) if const else (),
          opset=12, equation=eq)


def test_einsum_against_a_constant_takes_the_packed_matmul():
    """XLNet's ``ibnd,hnd->ibh`` against a constant ran as one reduction under dlight's
    rule at 42x onnxruntime's time: now a matmul against packed weights."""
    from onnx import numpy_helper

    w = numpy_helper.from_array(randn(16, 3, 8), "w")
    node = helper.make_node("Einsum", ["x", "w"], ["y"], equation="ibnd,hnd->ibh")
    m = onnx_model(node, [value_info("x", F, [32, 1, 3, 8])], [value_info("y", F, [32, 1, 16])],
                   12, [w])
    cm = compiler.compile(m)
    assert "cpu.matmul_packed" in [k["rule"] for k in cm.report["kernel_table"]]
    x = randn(32, 1, 3, 8)
    want = np.einsum("ibnd,hnd->ibh", x, numpy_helper.to_array(w))
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("eq,shapes", [("ii->i", [(4, 4)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
                                       ("ij,ij->i", [(3, 4), (1, 4)])])
def test_einsum_others_keep_tvms_converter(eq, shapes):
    """A diagonal, three operands and a broadcast label are left to TVM's einsum."""
    names = "abc"[:len(shapes)]
    check("Einsum", {n: randn(*s) for n, s in zip(names, shapes)}, opset=12, equation=eq)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 1)])
def test_cumsum_over_a_symbolic_axis(exclusive, reverse):
    """BLOOM's position ids, CumSum(attention_mask, axis=1) over a symbolic seq, were
    refused ("input shape is not known at compile time"): the reduction's extent is now the
    placeholder's own (symbolic) dim."""
    import onnxruntime as ort
    from onnx import TensorProto

    node = helper.make_node("CumSum", ["m", "axis"], ["y"], exclusive=exclusive,
                            reverse=reverse)
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("m", TensorProto.INT64,
                                                         ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64,
                                                         ["batch", "seq"])],
                          [helper.make_tensor("axis", TensorProto.INT64, [], [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m, dims={"batch": (1, 4, 1), "seq": (1, 64, 16)})
    assert type(cm).__name__ == "CompiledModel"
    sess, ref = cm.session(), ort.InferenceSession(m.SerializeToString())
    for shape in ((1, 1), (2, 9), (4, 64)):
        x = np.random.default_rng(shape[1]).integers(0, 2, shape)
        np.testing.assert_array_equal(sess.run(None, {"m": x})[0], ref.run(None, {"m": x})[0])


@pytest.mark.parametrize("op,shape,axis,exclusive,reverse,dtype", [
    ("CumSum", (64, 1024), 1, 0, 0, np.float32),      # long rows: one pass, not a prefix each
    ("CumSum", (8, 77), -1, 1, 0, np.int64),          # position ids
    ("CumSum", (300, 5), 0, 0, 1, np.float32),        # the first axis: inner blocks of 64
    ("CumSum", (2, 9, 3, 70), 1, 1, 1, np.int32),     # the middle, a partial inner block
    ("CumProd", (4, 33), 1, 0, 1, np.float64),
])
def test_cumulative_scan_kernel(op, shape, axis, exclusive, reverse, dtype):
    """CPU targets compute CumSum / CumProd with one scan kernel (``cpu.scan``), in the
    axis order, against onnxruntime (float sums in the same order: close to rounding)."""
    from onnx import TensorProto
    from tests.conftest import ort_run

    rng = np.random.default_rng(len(shape) + axis)
    x = (rng.random(shape) + 0.5 if op == "CumProd" else rng.standard_normal(shape) * 4) \
        .astype(dtype) if dtype in (np.float32, np.float64) else \
        rng.integers(-5, 6, shape).astype(dtype)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", t, list(shape))],
                          [helper.make_tensor_value_info("y", t, list(shape))],
                          [helper.make_tensor("axis", TensorProto.INT64, [], [axis])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 26 if op == "CumProd"
                                                                 else 17)])
    cm = compiler.compile(m)
    assert {r["rule"] for r in cm.report["kernel_table"] if r["ops"] == op} == {"cpu.scan"}
    got = cm.session().run(None, {"x": x})[0]
    if op == "CumProd":  # onnxruntime has no CumProd kernel
        a = np.flip(x, axis) if reverse else x
        want = np.cumprod(a, axis)
        if exclusive:
            want = np.concatenate([np.ones_like(np.take(want, [0], axis)),
                                   np.delete(want, -1, axis)], axis)
        want = np.flip(want, axis) if reverse else want
    else:
        want = ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c", [2.0, 3.0, 2.5, -1.0])
def test_pow_by_a_constant_square_and_cube_are_products(c):
    """Pow(x, 2) / Pow(x, 3) are x * x / x * x * x, as onnxruntime special-cases them (a
    libm powf per element ran 20x its time); other exponents stay powf.  Against
    onnxruntime, inf / NaN / signed zeros included."""
    from onnx import numpy_helper

    from tests.conftest import ort_run

    x = np.array([[1.5, -2.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 3e12, -7.25, 1e-20]],
                 np.float32)
    g = helper.make_graph([helper.make_node("Pow", ["x", "c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", F, [1, 10])],
                          [helper.make_tensor_value_info("y", F, [1, 10])],
                          [numpy_helper.from_array(np.array(c, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    cm = compiler.compile(m)
    (y,) = cm.session().run(None, {"x": x})
    np.testing.assert_allclose(y, ort_run(m, {"x": x})[0], rtol=1e-6, equal_nan=True)
    from compiler import driver

    _, _, graph = driver._front_only(m, "host")
    text = "\n".join(f.script() for f in graph.prim_funcs.values())
    assert ("T.pow(" in text) == (c not in (2.0, 3.0))


def test_sum_mean_pairwise_and_hardmax_by_onnxc_argmax():
    """Sum / Mean of broadcast inputs as pairwise adds (no stacked copy and reduction
    kernel), Hardmax as the one-hot of onnxc's argmax (cpu.arg_rows), against
    onnxruntime."""
    from onnx import TensorProto
    from tests.conftest import ort_run

    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Sum", ["a", "b", "c"], ["s"]),
             helper.make_node("Mean", ["a", "b", "c"], ["m"]),
             helper.make_node("Hardmax", ["a"], ["h"], axis=-1)]
    g = helper.make_graph(nodes, "g", [vi("a", TensorProto.FLOAT, [4, 6, 50]),
                                       vi("b", TensorProto.FLOAT, [6, 1]),
                                       vi("c", TensorProto.FLOAT, [1, 1, 50])],
                          [vi(n, TensorProto.FLOAT, [4, 6, 50]) for n in "smh"])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(7)
    feeds = {"a": rng.integers(-3, 4, (4, 6, 50)).astype(np.float32),
             "b": rng.standard_normal((6, 1)).astype(np.float32),
             "c": rng.standard_normal((1, 1, 50)).astype(np.float32)}
    cm = compiler.compile(m)
    rules = {r["rule"] for r in cm.report["kernel_table"]}
    assert "cpu.arg_rows" in rules and not any("reduction" in r for r in rules), rules
    for got, want in zip(cm.session().run(None, feeds), ort_run(m, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sa,sb,const_b", [
    ([768], [768, 300], True),        # a vector times a weight: the packed matmul rule
    ([5, 64], [64], False),
    ([64], [64], False),              # a scalar
    ([3, 5, 64], [64], True),
    ([64], [2, 64, 7], False),
])
def test_matmul_with_a_vector_operand(sa, sb, const_b):
    from onnx import TensorProto, numpy_helper
    from tests.conftest import ort_run

    rng = np.random.default_rng(len(sa) + len(sb))
    b = rng.standard_normal(sb).astype(np.float32)
    out = list(np.matmul(np.zeros(sa, np.float32), b).shape)
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g",
                          [vi("a", TensorProto.FLOAT, sa)] +
                          ([] if const_b else [vi("b", TensorProto.FLOAT, sb)]),
                          [vi("y", TensorProto.FLOAT, out)],
                          [numpy_helper.from_array(b, "b")] if const_b else [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"a": rng.standard_normal(sa).astype(np.float32)}
    if not const_b:
        feeds["b"] = b
    cm = compiler.compile(m)
    if const_b and len(sa) == 1:
        assert "cpu.matmul_packed" in {r["rule"] for r in cm.report["kernel_table"]}
    got = cm.session().run(None, feeds)[0]
    want = ort_run(m, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
