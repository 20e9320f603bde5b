"""widen_half: a float16 model computes in float32 on CPU targets, its signature kept."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from passes import WidenHalf
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "op_fp16(x) => op_fp32(x)"


def _conv_block(dtype=np.float16):
    """Conv + Clip (fp16 bounds) + global pool + Gemm + Softmax, all of ``dtype``."""
    rng = np.random.default_rng(0)
    return model([node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]),
                  node("Clip", ["c", "lo", "hi"], "r"),
                  node("GlobalAveragePool", ["r"], "g"),
                  node("Flatten", ["g"], "f"),
                  node("Gemm", ["f", "fc", "fb"], "logits", transB=1),
                  node("Softmax", ["logits"], "p", axis=-1)],
                 {"x": [1, 16, 20, 20]}, {"p": [1, 10]},
                 {"w": (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(dtype),
                  "b": rng.standard_normal(32).astype(dtype),
                  "lo": np.array(0, dtype), "hi": np.array(6, dtype),
                  "fc": (rng.standard_normal((10, 32)) * 0.3).astype(dtype),
                  "fb": rng.standard_normal(10).astype(dtype)}, dtype=dtype)


def _kept_io():
    """onnxruntime's fp16 converter with keep_io_types: fp32 in and out, fp16 between,
    a LayerNorm and a MatMul in fp16; its nodes out of order (the input cast last)."""
    rng = np.random.default_rng(1)
    h = TensorProto.FLOAT16
    nodes = [helper.make_node("MatMul", ["x16", "w"], ["m"], name="mm"),
             helper.make_node("LayerNormalization", ["m", "g", "bt"], ["ln"], name="ln",
                              axis=-1),
             helper.make_node("Cast", ["ln"], ["y"], name="out_cast", to=TensorProto.FLOAT),
             helper.make_node("Cast", ["x"], ["x16"], name="in_cast", to=h)]
    g = helper.make_graph(
        nodes, "kept_io", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 48])],
        [numpy_helper.from_array((rng.standard_normal((64, 48)) * 0.2).astype(np.float16),
                                 "w"),
         numpy_helper.from_array(rng.standard_normal(48).astype(np.float16), "g"),
         numpy_helper.from_array(rng.standard_normal(48).astype(np.float16), "bt")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _half_ops(counts_model) -> list:
    """The ops of the compiled kernels' Relax graph that still compute float16."""
    import tvm

    found = []

    def visit(e):
        if isinstance(e, tvm.relax.Call) and "float16" in str(e.ty) and isinstance(
                e.op, tvm.ir.Op):
            found.append(e.op.name)
    tvm.relax.analysis.post_order_visit(counts_model["main"], visit)
    return found


def test_structure_only_the_boundary_stays_half():
    from compiler.frontend.importer import import_onnx
    from compiler.frontend.loader import load_model
    from passes import PassContext

    m = _conv_block()
    before, after, r = run_pass(WidenHalf(), m)
    assert r.rewrites[RULE] >= 6 and "c" in r.nodes and "p" in r.nodes
    mod = PassContext(required=["widen_half"]).run([WidenHalf()], import_onnx(load_model(m)))
    # the fp16 input widened where read and the output narrowed where written: nothing
    # else computes in float16
    assert sorted(_half_ops(mod)) == ["relax.astype"]
    assert str(mod["main"].params[0].ty.dtype) == "float16"
    assert str(mod["main"].ret_ty.dtype) == "float16"


def test_fp16_model_matches_onnxruntime_with_its_signature():
    m = _conv_block()
    x = np.random.default_rng(2).standard_normal((1, 16, 20, 20)).astype(np.float16)
    outs, cm = compile_run(m, {"x": x})
    assert outs[0].dtype == np.float16
    assert_close(outs, ort_run(m, {"x": x}), rtol=1e-2, atol=1e-3)
    assert report(cm, "widen_half")["rewrites"][RULE] >= 6
    # the conv takes the fp32 rule (blocked), not a float16 kernel
    rules = {r["rule"] for r in cm.report["kernel_table"]}
    assert any(r.startswith("cpu.conv2d_nchwc") for r in rules), rules


def test_converter_output_kept_io_out_of_order():
    m = _kept_io()
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    outs, cm = compile_run(m, {"x": x})
    assert_close(outs, ort_run(m, {"x": x}), rtol=1e-2, atol=1e-2)
    assert any("topological order" in w for w in cm.report["warnings"])
    rules = [r["rule"] for r in cm.report["kernel_table"]]
    assert "cpu.matmul_packed" in rules, rules  # the fp32 packed-weight rule


def test_float32_model_and_disabled_pass_are_left_alone():
    _, _, r = run_pass(WidenHalf(), _conv_block(np.float32))
    assert not r.rewrites
    m = _conv_block()
    x = np.random.default_rng(4).standard_normal((1, 16, 20, 20)).astype(np.float16)
    outs, cm = compile_run(m, {"x": x}, disabled_passes=["widen_half"])
    assert report(cm, "widen_half")["skipped"] == "disabled"
    assert_close(outs, ort_run(m, {"x": x}), rtol=1e-2, atol=1e-3)


def test_float16_scalar_operands_are_widened():
    """An op with float16 scalar operands (clip's bounds as PrimValues) gets float32 ones:
    the widened op must not mix dtypes (and a PrimValue has no truth value to test)."""
    import tvm
    from tvm import relax, tirx

    from passes import PassContext

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            lo = relax.prim_value(tirx.FloatImm("float16", -1.0))
            hi = relax.prim_value(tirx.FloatImm("float16", 2.0))
            y = bb.emit(relax.op.clip(x, lo, hi), name_hint="n0")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = PassContext(required=["widen_half"]).run([WidenHalf()], bb.get())
    text = mod["main"].script()
    assert 'R.clip(x_f32, T.float32(-1.0), T.float32(2.0))' in text
    assert str(mod["main"].ret_ty.dtype) == "float16"
    ex = tvm.compile(relax.transform.LegalizeOps()(mod), "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    a = np.linspace(-3, 3, 32, dtype=np.float16).reshape(4, 8)
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), np.clip(a, -1, 2))
