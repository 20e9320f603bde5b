"""sink_reshape: structure (the matmul takes its epilogue once the reshape is below it),
numerics against onnxruntime, and reshapes it must leave where they are."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

import compiler
from tests.schedules.util import onnx_model


def _report(cm):
    return next(p for p in cm.report["passes"] if p["name"] == "sink_reshape")


def _convnext_mlp(c=64, h=7):
    """ConvNeXt's block MLP in NHWC: Linear(C, 4C) + GELU (erf) + Linear(4C, C) * gamma +
    residual, on a [1, h, h, C] activation (pack_matmul_weights flattens it to one
    [h*h, C] matmul between reshapes)."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((c, 4 * c)).astype("float32") * 0.1
    b1 = rng.standard_normal(4 * c).astype("float32")
    w2 = rng.standard_normal((4 * c, c)).astype("float32") * 0.1
    b2 = rng.standard_normal(c).astype("float32")
    gamma = rng.standard_normal(c).astype("float32")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1.bias"),
        helper.make_node("Div", ["a1", "sqrt2"], ["d"], name="gelu.div"),
        helper.make_node("Erf", ["d"], ["e"], name="gelu.erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="gelu.add"),
        helper.make_node("Mul", ["a1", "e1"], ["g0"], name="gelu.mul"),
        helper.make_node("Mul", ["g0", "half"], ["g"], name="gelu.mul2"),
        helper.make_node("MatMul", ["g", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], name="fc2.bias"),
        helper.make_node("Mul", ["a2", "gamma"], ["s"], name="layer_scale"),
        helper.make_node("Add", ["s", "x"], ["y"], name="residual"),
    ]
    shape = (1, h, h, c)
    return onnx_model(nodes, [("x", shape)], [("y", shape)],
                      {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "gamma": gamma,
                       "sqrt2": np.float32(2 ** 0.5), "one": np.float32(1),
                       "half": np.float32(0.5)}), shape


def test_matmul_epilogues_fuse_and_match_onnxruntime():
    model, shape = _convnext_mlp()
    cm = compiler.compile(model, target="host")
    rep = _report(cm)
    assert any(k.startswith("op(reshape(x), c)") for k in rep["rewrites"]), rep
    # the two matmuls carry their epilogues: no elementwise kernel of their own (the one
    # left copies the model's output out of the flattened matmul's [49, 64]: a reshape)
    rules = cm.report["schedules"]
    assert rules.get("cpu.matmul_packed") == 2, rules
    for k in cm.report["kernel_table"]:
        assert k["rule"] == "cpu.matmul_packed" or k["ops"].startswith("reshape"), k
    table = {k["kernel"]: k["ops"] for k in cm.report["kernel_table"]}
    assert any("Erf" in ops and "MatMul" in ops for ops in table.values()), table
    assert any("MatMul" in ops and "Mul" in ops and "Add" in ops and "Erf" not in ops
               for ops in table.values()), table
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)


def test_disabled_leaves_the_elementwise_kernels():
    model, _ = _convnext_mlp()
    cm = compiler.compile(model, target="host", disabled_passes=["sink_reshape"])
    assert _report(cm)["skipped"] == "disabled"
    assert cm.report["schedules"].get("cpu.elementwise", 0) >= 1


def test_leaves_reshapes_that_change_the_last_axis_or_broadcast_elsewhere():
    """Reshape [1, 4, 16] -> [1, 64] changes the last axis: an add after it stays after it;
    a scale broadcast along a non-last axis ([4, 1]) after a last-axis-keeping reshape too."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Reshape", ["x", "s1"], ["r1"], name="flat"),
        helper.make_node("Add", ["r1", "b"], ["y1"], name="add"),
        helper.make_node("Reshape", ["x", "s2"], ["r2"], name="rows"),
        helper.make_node("Mul", ["r2", "c"], ["y2"], name="scale_rows"),
    ]
    model = onnx_model(nodes, [("x", (1, 4, 16))], [("y1", (1, 64)), ("y2", (2, 2, 16))],
                       {"s1": np.array([1, 64], "int64"), "b": rng.standard_normal(64)
                        .astype("float32"), "s2": np.array([2, 2, 16], "int64"),
                        "c": rng.standard_normal((2, 1)).astype("float32")})
    cm = compiler.compile(model, target="host")
    assert not _report(cm)["rewrites"], _report(cm)
    x = rng.standard_normal((1, 4, 16)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, want in zip(cm.session().run(None, {"x": x}), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _residual_stream(blocks=6, s=8, c=32):
    """GPT-2's Conv1D blocks: h = h + reshape(reshape(h, [S, C]) @ W + b, [1, S, C]),
    ``blocks`` times: each add reads a last-axis-keeping reshape and the previous add."""
    rng = np.random.default_rng(3)
    nodes, inits, h = [], {"flat": np.array([s, c], "int64"),
                           "back": np.array([1, s, c], "int64")}, "x"
    for k in range(blocks):
        inits[f"w{k}"] = rng.standard_normal((c, c)).astype("float32") * 0.2
        inits[f"b{k}"] = rng.standard_normal(c).astype("float32")
        nodes += [helper.make_node("Reshape", [h, "flat"], [f"f{k}"], name=f"view{k}"),
                  helper.make_node("Gemm", [f"f{k}", f"w{k}", f"b{k}"], [f"g{k}"],
                                   name=f"proj{k}"),
                  helper.make_node("Reshape", [f"g{k}", "back"], [f"r{k}"], name=f"unview{k}"),
                  helper.make_node("Add", [h, f"r{k}"], [f"h{k}"], name=f"residual{k}")]
        h = f"h{k}"
    return onnx_model(nodes, [("x", (1, s, c))], [(h, (1, s, c))], inits), (1, s, c)


def test_residual_stream_settles_in_few_sweeps_and_is_idempotent(monkeypatch):
    """Each residual add's reshape sinks once, in one sweep for the whole stream (the
    residual's view it leaves is never sunk back); running the pass again changes nothing."""
    import passes
    from compiler.frontend.importer import import_onnx
    from compiler.frontend.loader import load_model
    from passes import sink_reshape

    model, shape = _residual_stream()
    sweeps = []
    scan = sink_reshape._candidates
    monkeypatch.setattr(sink_reshape, "_candidates", lambda df: sweeps.append(1) or scan(df))
    mod = import_onnx(load_model(model), "m", None, None, True, set())
    ctx = passes.PassContext()
    once = ctx.run([sink_reshape.SinkReshape()], mod)
    assert ctx.reports[-1].rewrites, ctx.reports[-1]
    assert len(sweeps) <= 4, len(sweeps)
    twice = passes.PassContext().run([sink_reshape.SinkReshape()], once)
    assert twice.same_as(once)

    cm = compiler.compile(model, target="host")
    x = np.random.default_rng(4).standard_normal(shape).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.session().run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
