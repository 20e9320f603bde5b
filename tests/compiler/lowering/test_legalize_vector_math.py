"""compiler/lowering/legalize_vector_math.py: float32 GELU and softmax with vectorisable erf / exp.

Accuracy against float64 erf / exp on wide ranges, structure (no libm call left in the
kernel, other dtypes and axes keep TVM's), and numerics of compiled Erf-GELU and softmax
models against onnxruntime.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te

from compiler.lowering.legalize_vector_math import (LEGALIZE_MAP, erf_f32, exp_f32,
                                                    exp_nonpositive_f32, exp_normal_f32,
                                                    tanh_f32)
from tests.conftest import assert_close, ort_run
from tests.passes.helpers import compile_run, model, node

TARGET = {"kind": "llvm"}


def _run_elementwise(fn, xs):
    """Evaluate ``fn(x)`` over a float32 vector with a vectorised loop (as the kernels do)."""
    n = xs.size
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: fn(x[i]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    _, v = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 16])
    sch.vectorize(v)
    lib = tvm.compile(sch.mod, target=TARGET).jit()
    out = tvm.runtime.tensor(np.zeros(n, "float32"))
    lib["main"](tvm.runtime.tensor(xs), out)
    return out.numpy(), lib


def _grid():
    rng = np.random.default_rng(0)
    return np.concatenate([np.linspace(-12, 12, 1 << 18), rng.standard_normal(1 << 16) * 3,
                           [0.0, -0.0, 0.921875, -0.921875, 3.92, -3.92]]).astype("float32")


def test_erf_accuracy_against_float64():
    xs = _grid()
    got, lib = _run_elementwise(erf_f32, xs)
    ref = np.array([math.erf(v) for v in xs.astype(np.float64)])
    assert np.abs(got - ref).max() < 2e-7          # about 3 ulp of values near 1
    assert "erff" not in lib.inspect_source("asm")  # vectorised: no libm call per lane


def test_gelu_accuracy_against_float64():
    xs = _grid()
    c = tvm.tirx.const
    got, _ = _run_elementwise(
        lambda x: x * (c(0.5, "float32") + erf_f32(x * c(0.5 ** 0.5, "float32"))
                       * c(0.5, "float32")), xs)
    x64 = xs.astype(np.float64)
    ref = x64 * 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x64]))
    # the float32 rounding of x * (...) alone is up to 4.5e-7 at |x| ~ 5
    assert np.abs(got - ref).max() < 6e-7
    assert np.all(np.abs(got - ref) <= 1e-6 + 1e-6 * np.abs(ref))


def test_tanh_accuracy_against_float64():
    """The rational tanh (Eigen's / MLAS's) against float64, compiled for this host: within
    4e-7 everywhere, NaN kept, +-inf to +-1, -0.0 kept."""
    x = np.concatenate([np.linspace(-12, 12, 200001, dtype=np.float32),
                        np.float32([np.nan, np.inf, -np.inf, -0.0, 1e-30, -3e-4])])
    got, _ = _run_elementwise(tanh_f32, x)
    want = np.tanh(x.astype(np.float64))
    fin = np.isfinite(x)
    assert np.abs(got[fin] - want[fin]).max() < 4e-7
    # +-inf: the value at the clamp, 2 ulp below 1 (as MLAS's)
    assert np.isnan(got[-6]) and abs(got[-5] - 1) < 4e-7 and abs(got[-4] + 1) < 4e-7
    assert np.signbit(got[-3]) and got[-2] == np.float32(1e-30)


def test_gelu_tanh_model_against_onnxruntime():
    """GPT-2's tanh GELU (fuse_gelu makes it gelu_tanh): onnxruntime's values, no libm tanh."""
    c = {"c": np.array(0.044715, np.float32), "s": np.array(math.sqrt(2 / math.pi), np.float32),
         "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [node("Mul", ["x", "x"], "x2"), node("Mul", ["x2", "x"], "x3"),
             node("Mul", ["x3", "c"], "t0"), node("Add", ["x", "t0"], "t1"),
             node("Mul", ["t1", "s"], "t2"), node("Tanh", ["t2"], "t3"),
             node("Add", ["t3", "one"], "t4"), node("Mul", ["x", "t4"], "t5"),
             node("Mul", ["t5", "half"], "y")]
    m = model(nodes, {"x": [4, 1024]}, {"y": [4, 1024]}, c)
    x = np.linspace(-9, 9, 4096, dtype=np.float32).reshape(4, 1024)
    got, cm = compile_run(m, {"x": x})
    assert any(p["name"] == "fuse_gelu" and p["changed"] for p in cm.report["passes"])
    assert_close(got, ort_run(m, {"x": x}))


def test_exp_accuracy_against_float64():
    rng = np.random.default_rng(1)
    xs = np.concatenate([-np.geomspace(1e-8, 87.3, 1 << 17), -rng.random(1 << 16) * 20,
                         -np.linspace(87.3, 103.9, 4096),
                         [0.0, -0.0, -87.33, -87.34, -100.0, -104.0, -1e30]]).astype("float32")
    got, lib = _run_elementwise(exp_nonpositive_f32, xs)
    ref = np.exp(xs.astype(np.float64))
    normal = ref >= np.finfo(np.float32).tiny
    assert np.all(np.abs(got - ref)[normal] <= 2.5e-7 * ref[normal])  # about 2 ulp
    # subnormal results (x < -87.3): within one subnormal step (2^-149 = 1.4e-45) + 2 ulp
    sub = ~normal & (xs > -103.9)
    assert np.all(np.abs(got - ref)[sub] <= 1.5e-45 + 2.5e-7 * ref[sub])
    assert np.all(got[sub] > 0)
    assert np.all(got[xs <= -104.0] == 0.0) and got[xs == 0].tolist() == [1.0, 1.0]
    assert "expf" not in lib.inspect_source("asm")
    special, _ = _run_elementwise(exp_nonpositive_f32,
                                  np.array([-np.inf, np.nan] * 8, dtype="float32"))
    assert np.all(special[0::2] == 0.0) and np.all(np.isnan(special[1::2]))


def test_exp_normal_accuracy_against_float64():
    """Softmax's exp above its flush cut (results normal, no 2^-24 scaling): about 2 ulp on
    [ln(FLT_MIN), 0], NaN kept; and two vector ops fewer than exp_nonpositive_f32."""
    rng = np.random.default_rng(2)
    xs = np.concatenate([-np.geomspace(1e-8, 87.33, 1 << 17), -rng.random(1 << 16) * 20,
                         [0.0, -0.0, np.log(np.finfo(np.float32).tiny)]]).astype("float32")
    got, lib = _run_elementwise(exp_normal_f32, xs)
    ref = np.exp(xs.astype(np.float64))
    assert np.all(np.abs(got - ref) <= 2.5e-7 * ref)
    assert got[xs == 0].tolist() == [1.0, 1.0]
    special, _ = _run_elementwise(exp_normal_f32, np.array([np.nan] * 16, dtype="float32"))
    assert np.all(np.isnan(special))
    # a whole number of vectors (a guarded tail is scalarised by TVM): the vector loop's code
    _, lib = _run_elementwise(exp_normal_f32, xs[:64])
    _, full = _run_elementwise(exp_nonpositive_f32, xs[:64])

    def vector_ops(asm):  # packed float arithmetic, SSE or AVX (the clamp, the scaling)
        return len(re.findall(r"^\s+v?(?:fn?m(?:add|sub)\w*|mul|add|sub|max|min)ps\s", asm,
                              re.M))

    assert vector_ops(lib.inspect_source("asm")) < vector_ops(full.inspect_source("asm"))


def _legalized(dtype, op=relax.op.nn.gelu):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE_MAP)(bb.get())
    return "\n".join(f.script() for gv, f in mod.functions.items()
                     if isinstance(f, tvm.tirx.PrimFunc))


def test_structure_float32_has_no_erf_call_float16_keeps_tvms():
    f32 = _legalized("float32")
    assert "T.erf" not in f32 and "T.reinterpret" in f32 and "T.Select" in f32
    assert "T.erf" in _legalized("float16")


def test_structure_softmax_last_axis_only():
    last = _legalized("float32", lambda x: relax.op.nn.softmax(x, axis=-1))
    assert "T.exp" not in last and "T.reinterpret" in last and "T_softmax_maxelem" in last
    assert "T.exp" in _legalized("float32", lambda x: relax.op.nn.softmax(x, axis=0))
    assert "T.exp" in _legalized("float16", lambda x: relax.op.nn.softmax(x, axis=-1))


def test_erf_gelu_model_against_onnxruntime():
    half, one = np.array(0.5, np.float32), np.array(1.0, np.float32)
    sqrt2 = np.array(math.sqrt(2), np.float32)
    nodes = [node("Div", ["x", "sqrt2"], "d"), node("Erf", ["d"], "e"),
             node("Add", ["e", "one"], "a"), node("Mul", ["x", "a"], "m"),
             node("Mul", ["m", "half"], "y")]
    m = model(nodes, {"x": [4, 1024]}, {"y": [4, 1024]},
              {"half": half, "one": one, "sqrt2": sqrt2})
    x = np.linspace(-9, 9, 4096, dtype=np.float32).reshape(4, 1024)
    got, cm = compile_run(m, {"x": x})
    assert any(p["name"] == "fuse_gelu" and p["changed"] for p in cm.report["passes"])
    assert_close(got, ort_run(m, {"x": x}))


def test_softmax_model_against_onnxruntime():
    m = model([node("Softmax", ["x"], "y", axis=-1)], {"x": [3, 8, 200]}, {"y": [3, 8, 200]})
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 8, 200)) * 30).astype(np.float32)
    x[0, 0, :] = -1e4       # masked row of an attention softmax
    x[0, 1, :5] = 1e4       # huge logits
    x[1, 0, 3:] = -np.inf   # -inf mask
    got, cm = compile_run(m, {"x": x})
    assert_close(got, ort_run(m, {"x": x}))


def test_exp_full_range_accuracy_against_float64():
    """The bare Exp's exp_f32: 2 ulp over normal results on both sides of 0, subnormals
    below -87.3 as exp_nonpositive_f32, 0 at and below -104, inf above ln(FLT_MAX)."""
    rng = np.random.default_rng(2)
    xs = np.concatenate([np.geomspace(1e-8, 88.72, 1 << 16), -np.geomspace(1e-8, 87.3, 1 << 16),
                         (rng.random(1 << 16) - 0.5) * 100, -np.linspace(87.3, 103.9, 4096),
                         [0.0, -0.0, 1.0, 88.7, 88.72, -104.0, -1e30]]).astype("float32")
    got, lib = _run_elementwise(exp_f32, xs)
    ref = np.exp(xs.astype(np.float64))
    big = np.finfo(np.float32).max
    normal = (ref >= np.finfo(np.float32).tiny) & (ref <= big * (1 - 1e-6))
    assert np.all(np.abs(got - ref)[normal] <= 2.5e-7 * ref[normal])  # about 2 ulp
    sub = (ref < np.finfo(np.float32).tiny) & (xs > -103.9)
    assert np.all(np.abs(got - ref)[sub] <= 1.5e-45 + 2.5e-7 * ref[sub])
    assert np.all(got[xs <= -104.0] == 0.0) and got[xs == 0].tolist() == [1.0, 1.0]
    assert "expf" not in lib.inspect_source("asm")
    special, _ = _run_elementwise(exp_f32, np.array(
        [-np.inf, np.inf, np.nan, 88.73, 89.0, 1e30, 200.0, -200.0] * 2, dtype="float32"))
    assert special[0] == 0.0 and np.isnan(special[2]) and special[7] == 0.0
    assert np.all(np.isposinf(special[[1, 3, 4, 5, 6]]))


def test_structure_bare_exp_and_erf_float32_have_no_libm_call():
    for op, libm in ((relax.op.exp, "T.exp"), (relax.op.erf, "T.erf")):
        f32 = _legalized("float32", op)
        assert libm not in f32 and "T.reinterpret" in f32
        assert libm in _legalized("float16", op)


def test_bare_exp_and_erf_models_against_onnxruntime():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 300, 37)) * 30).astype(np.float32)
    x.flat[:8] = [np.nan, np.inf, -np.inf, -0.0, 88.7, 88.8, -103.0, -110.0]
    for op in ("Exp", "Erf"):
        m = model([node(op, ["x"], "y")], {"x": x.shape}, {"y": x.shape})
        got, cm = compile_run(m, {"x": x})
        assert_close(got, ort_run(m, {"x": x}))


def _layer_norm_kernel(n: int, dtype="float32") -> str:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, n), dtype))
    g = relax.Var("g", relax.TensorType((n,), dtype))
    b = relax.Var("b", relax.TensorType((n,), dtype))
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, g, b, axes=[-1]))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE_MAP)(bb.get())
    return "\n".join(f.script() for gv, f in mod.functions.items()
                     if isinstance(f, tvm.tirx.PrimFunc))


def test_structure_layer_norm_odd_rows_sum_whole_chunks_then_a_tail():
    """A layer norm over 211 (no whole 16-chunks): both sums split into whole chunks and a
    tail (the row rule vectorises the first); whole rows and float16 keep TVM's kernel."""
    odd = _layer_norm_kernel(211)
    assert "T_layer_norm_sum_tail" in odd and "T_layer_norm_var_tail" in odd
    assert "T.int64(208)" in odd
    assert "_tail" not in _layer_norm_kernel(256)
    assert "_tail" not in _layer_norm_kernel(211, "float16")


def test_layer_norm_odd_rows_against_onnxruntime():
    rng = np.random.default_rng(5)
    inits = {"g": rng.uniform(0.5, 1.5, 211).astype(np.float32),
             "b": rng.normal(0, 0.1, 211).astype(np.float32)}
    m = model([node("LayerNormalization", ["x", "g", "b"], "y", axis=-1, epsilon=1e-5)],
              {"x": [3, 5, 211]}, {"y": [3, 5, 211]}, inits)
    x = (100 + rng.standard_normal((3, 5, 211))).astype(np.float32)  # |mean| >> std
    got, cm = compile_run(m, {"x": x})
    assert cm.report["schedules"].get("cpu.row_reduction") == 1
    assert_close(got, ort_run(m, {"x": x}))
    # against float64: the row shifted by its first element keeps the mean's bits
    # (unshifted float32 sums: 1.6e-5 here; onnxruntime 5.7e-6)
    xd = x.astype(np.float64)
    d = xd - xd.mean(-1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * inits["g"] + inits["b"]
    assert np.abs(got[0] - ref).max() < 2e-6


def test_softmax_flushes_what_would_be_subnormal():
    """Logits spread over more than ~80: exps whose normalised result would be subnormal
    are 0 and never computed (a subnormal result is a microcode assist per vector on Intel:
    8x the time at std 30 over [8, 1500, 1500]); the rest as onnxruntime's."""
    n = 300
    m = model([node("Softmax", ["x"], "y", axis=-1)], {"x": [4, 6, n]}, {"y": [4, 6, n]})
    x = (np.random.default_rng(6).standard_normal((4, 6, n)) * 40).astype(np.float32)
    got, _ = compile_run(m, {"x": x})
    y = got[0]
    tiny = np.finfo(np.float32).tiny
    assert not np.any((y > 0) & (y < tiny))
    ref = ort_run(m, {"x": x})[0]  # subnormal here on emeraldrapids (depends on its kernel)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=tiny * n)
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(-1, keepdims=True))
    assert np.any((e > 0) & (e / e.sum(-1, keepdims=True) < tiny))  # the case arises
    # what was flushed is below FLT_MIN x n before normalising; nothing above it is lost
    assert np.all(y[e >= tiny * n * 2] > 0)


def test_log_accuracy_and_special_values():
    """log_f32 (the bare Log): within 1 ulp of float64 log over normal and subnormal
    inputs, no libm call; 0 / -0 give -inf, +inf itself, negatives and NaN NaN."""
    from passes.math_f32 import log_f32

    rng = np.random.default_rng(4)
    xs = np.concatenate([np.geomspace(1e-45, 3.4e38, 1 << 16), rng.random(1 << 16) * 4,
                         1 + (rng.random(4096) - 0.5) * 1e-3,
                         [0.70710677, 0.7071068, 1.0, 2.0, 1 - 2 ** -24]]).astype("float32")
    got, lib = _run_elementwise(log_f32, xs)
    ref = np.log(xs.astype(np.float64))
    ulp = np.abs(got - ref) / np.spacing(np.abs(ref).astype(np.float32))
    assert ulp.max() <= 1.0 and got[xs == 1.0].tolist() == [0.0]
    assert not re.search(r"\blogf?\b", lib.inspect_source("asm"))
    special, _ = _run_elementwise(log_f32, np.array(
        [0.0, -0.0, np.inf, -np.inf, -1.0, np.nan, -1e-40, 1e-45], dtype="float32"))
    assert special[:2].tolist() == [-np.inf, -np.inf] and special[2] == np.inf
    assert np.isnan(special[3:7]).all()
    assert abs(special[7] - np.log(np.float64(np.float32(1e-45)))) < 1e-4  # 2^-149


def test_bare_log_model_against_onnxruntime():
    rng = np.random.default_rng(5)
    x = np.abs(rng.standard_normal((4, 300, 37)) * 30).astype(np.float32)
    x.flat[:6] = [np.nan, np.inf, 0.0, -0.0, -3.0, 1e-42]
    m = model([node("Log", ["x"], "y")], {"x": x.shape}, {"y": x.shape})
    got, cm = compile_run(m, {"x": x})
    assert_close(got, ort_run(m, {"x": x}))


def test_atan_accuracy_and_special_values():
    """atan_f32 (the bare Atan): within 3 ulp of float64 atan over the whole float range,
    no libm call (a scalar atanf per lane ran 7x onnxruntime's time); signed zeros, +-inf
    to +-pi/2, NaN."""
    from passes.math_f32 import atan_f32

    rng = np.random.default_rng(6)
    xs = np.concatenate([np.geomspace(1e-40, 3e38, 1 << 15), -np.geomspace(1e-40, 3e38, 1 << 15),
                         (rng.random(1 << 15) - 0.5) * 10,
                         [0.41421357, 2.4142137, -0.41421357, 1.0]]).astype("float32")
    got, lib = _run_elementwise(atan_f32, xs)
    ref = np.arctan(xs.astype(np.float64))
    ulp = np.abs(got - ref) / np.spacing(np.maximum(np.abs(ref), 1e-38).astype(np.float32))
    assert ulp.max() <= 3.0
    assert "atan" not in lib.inspect_source("asm")
    special, _ = _run_elementwise(atan_f32, np.array([0.0, -0.0, np.inf, -np.inf, np.nan],
                                                     dtype="float32"))
    assert special[0] == 0 and np.signbit(special[1]) and special[1] == 0
    assert special[2] == np.float32(np.pi / 2) and special[3] == -np.float32(np.pi / 2)
    assert np.isnan(special[4])


@pytest.mark.parametrize("op, opset, ref", [
    ("Tanh", 17, np.tanh),
    ("Softplus", 17, lambda x: np.logaddexp(0, x)),
    ("Mish", 18, lambda x: x * np.tanh(np.logaddexp(0, x)))])
def test_tanh_softplus_mish_models(op, opset, ref):
    """Bare Tanh, Softplus and Mish over float32: within float32 rounding of float64 over
    [-100, 100] and the special values, and onnxruntime's values; Softplus (in Mish too)
    with no libm call per lane (``stable_softplus``: exp and a log1p polynomial)."""
    from onnx import TensorProto, helper

    import compiler
    from compiler import driver

    xs = np.concatenate([np.linspace(-100, 100, 4093), [0.0, -0.0, 88.8, -88.8, -20.0,
                                                      np.inf, -np.inf, np.nan]]).astype(np.float32)
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [xs.size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [xs.size])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if op != "Tanh":
        mod, _, _ = driver.schedule_kernels(model, "host")
        text = "".join(f.script() for f in mod.functions.values())
        assert "T.log1p(" not in text and "T.exp(" not in text
    got = compiler.compile(model).session().run(None, {"x": xs})[0]
    with np.errstate(over="ignore", invalid="ignore"):
        want = ref(xs.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-37)
    np.testing.assert_allclose(got, ort_run(model, {"x": xs})[0], rtol=3e-6, atol=1e-6)
