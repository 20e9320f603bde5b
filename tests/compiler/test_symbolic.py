"""Symbolic shapes end to end: one artifact serves every (batch, seq) in the declared range.

compiler/lowering/symbolic.py (ranges, expressions, monotone sizes), the graph runtime's
binding (runtime/dims.py, runtime/session.py), the packed matmul rule on a symbolic row
count, and the CLI's --dim.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import compiler
import runtime
from compiler.lowering.symbolic import (DEFAULT_RANGE, monotone, parse_dim_option,
                                        resolve_ranges)
from runtime.dims import DimError, ShapeExpr, bind_dims
from tests.conftest import assert_close, ort_run, zoo

DIMS = {"batch": (1, 4, 1), "seq": (1, 77, 16)}


def _model():
    return zoo.transformer(seq="seq", batch="batch", hidden=32, heads=2, ffn=64, layers=1,
                           mask=True, name="tsym")


def _feeds(batch, seq, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 4:] = 0  # padded positions: the additive mask matters
    return {"x": rng.standard_normal((batch, seq, 32)).astype(np.float32),
            "attention_mask": mask}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """The symbolic model compiled once, exported, and loaded without the compiler."""
    cm = compiler.compile(_model(), dims=DIMS)
    path = tmp_path_factory.mktemp("sym") / "tsym.so"
    cm.export(str(path))
    return cm, runtime.load(str(path)), path


@pytest.mark.parametrize("batch, seq", [(1, 1), (1, 7), (2, 16), (3, 33), (1, 77), (4, 77),
                                        (4, 1)])
def test_one_artifact_matches_onnxruntime_at_every_shape(artifact, batch, seq):
    _, sess, _ = artifact
    feeds = _feeds(batch, seq, seed=batch * 100 + seq)
    assert_close(sess.run(None, feeds), ort_run(_model(), feeds))


def test_signature_manifest_and_report_keep_the_dims(artifact):
    cm, sess, _ = artifact
    assert [i.shape for i in sess.get_inputs()] == [["batch", "seq", 32], ["batch", "seq"]]
    assert sess.get_outputs()[0].shape == ["batch", "seq", 32]
    want = [{"name": "batch", "min": 1, "max": 4, "opt": 1, "declared": True},
            {"name": "seq", "min": 1, "max": 77, "opt": 16, "declared": True}]
    assert sess.get_modelmeta()["dims"] == want and cm.report["dims"] == want
    assert not any("no declared range" in w for w in cm.report["warnings"])


def test_arena_is_planned_at_the_maxima_and_holds_every_smaller_binding(artifact):
    """Each buffer is sized at (batch, seq) = (4, 77); every tensor's size is monotone in
    the dims, so at any binding it fits the buffer its offset was planned for."""
    cm, _, _ = artifact
    graph, plan = cm.meta["graph"], cm.memory_plan
    names = {"batch", "seq"}
    rng = np.random.default_rng(0)
    bindings = [{"batch": 4, "seq": 77}] + [
        {"batch": int(rng.integers(1, 5)), "seq": int(rng.integers(1, 78))} for _ in range(20)]
    for t in graph["tensors"]:
        if t["storage"] != "arena":
            continue
        cap = graph["buffers"][t["index"]]["nbytes"]
        for b in bindings:
            n = int(np.prod(ShapeExpr(t["shape"], names)(b))) * np.dtype(t["dtype"]).itemsize
            assert n <= cap, (t["name"], b)
    top = max(graph["buffers"], key=lambda b: b["nbytes"])["nbytes"]
    assert top == 4 * 2 * 77 * 77 * 4  # the attention scores [batch, heads, seq, seq] at MAX
    assert plan.arena_bytes >= top


@pytest.mark.parametrize("batch, seq, message", [
    (1, 78, r"input 'x': axis 1 is dim 'seq' = 78, outside the range 1\.\.77"),
    (5, 8, r"input 'x': axis 0 is dim 'batch' = 5, outside the range 1\.\.4"),
    (1, 0, r"input 'x': axis 1 is dim 'seq' = 0, outside the range 1\.\.77"),
])
def test_feed_outside_the_range_is_refused(artifact, batch, seq, message):
    _, sess, _ = artifact
    with pytest.raises(DimError, match=message):
        sess.run(None, _feeds(batch, seq))


def test_instruments_and_memplan_on_a_symbolic_artifact(artifact, tmp_path):
    """Profiling and NaN checks run over the bound views; onnxc memplan prints the plan."""
    from tests.compiler.test_cli import onnxc

    path = artifact[2]
    opts = runtime.SessionOptions(enable_profiling=True, check_nan=True,
                                  profile_file_prefix=str(tmp_path / "trace"))
    sess = runtime.load(str(path), opts)
    feeds = _feeds(2, 9)
    assert_close(sess.run(None, feeds), ort_run(_model(), feeds))
    assert "kernel calls" in sess.profile_summary()
    feeds["x"][1, 3, 5] = np.nan
    with pytest.raises(runtime.NonFiniteError, match="input"):
        sess.run(None, feeds)
    r = onnxc("memplan", path)
    assert r.returncode == 0, r.stderr
    # x's buffer sized at (4, 77), its own: no output is planned over a model input
    assert f"\nx                 {4 * 77 * 32 * 4}" in r.stdout


def test_profile_counts_flops_only_at_the_dims_they_were_counted_at(artifact, tmp_path):
    """A kernel's FLOPs are counted at the dims' opt (batch 1, seq 16): a profiled run at
    other dims reports its rate unknown, not that count over its time (a BERT at seq 16
    compiled with opt 128 read 568 GFLOP/s, 193% of the peak)."""
    cm, _, path = artifact
    symbolic = [c for c in cm.meta["graph"]["calls"] if c.get("flops_at")]
    assert symbolic and all(c["flops_at"] == {d: {"batch": 1, "seq": 16}[d]
                                              for d in c["flops_at"]} for c in symbolic)

    def profiled(batch, seq):
        sess = runtime.load(str(path), runtime.SessionOptions(
            enable_profiling=True, profile_file_prefix=str(tmp_path / f"t{batch}_{seq}")))
        sess.run(None, _feeds(batch, seq))
        with open(sess.end_profiling()) as f:
            events = json.load(f)["traceEvents"]
        return sess.profile_summary(50), {e["name"]: e["args"] for e in events}

    summary, args = profiled(1, 16)
    assert "GFLOP/s unknown" not in summary
    assert all(a["flops"] is not None for a in args.values())
    summary, args = profiled(3, 40)
    assert "ran at symbolic dims other than the compile's opt" in summary
    names = {c["kernel"] for c in symbolic}
    assert all(args[n]["flops"] is None and args[n]["gflops_per_s"] is None
               for n in names if n in args)


def test_results_are_the_callers_across_bindings(artifact):
    """A symbolic session copies its outputs out (bind_io writes into returned arrays for
    static shapes only): a result is not overwritten by a later run at another binding."""
    _, sess, _ = artifact
    first = sess.run(None, _feeds(1, 7, seed=1))[0]
    kept = first.copy()
    sess.run(None, _feeds(4, 77, seed=2))
    np.testing.assert_array_equal(first, kept)


def test_inputs_sharing_a_dim_must_agree(artifact):
    _, sess, _ = artifact
    feeds = _feeds(2, 8)
    feeds["attention_mask"] = np.ones((2, 9), np.int64)
    with pytest.raises(DimError, match=r"input 'attention_mask': axis 1 is dim 'seq' = 9, but "
                                       r"input 'x' axis 1 gave 'seq' = 8"):
        sess.run(None, feeds)
    feeds = _feeds(2, 8)
    feeds["x"] = feeds["x"][..., :31]
    with pytest.raises(DimError, match="axis 2 must be 32, got 31"):
        sess.run(None, feeds)


def test_packed_matmul_rule_fires_on_a_symbolic_row_count():
    """The projections' rows are batch x seq: the kernel keeps a symbolic extent, and
    cpu.matmul_packed (not the fallback) schedules it, vectorised."""
    from tvm import tirx

    from compiler.driver import schedule_kernels

    mod, rules, _ = schedule_kernels(_model())
    packed = [name for name, rule in rules.items() if rule == "cpu.matmul_packed"]
    assert len(packed) >= 3  # q/k/v/out projections share kernels; ffn fc1, fc2
    for name in packed:
        func = mod[name]
        dims = {v.name for p in func.params for d in getattr(p, "shape", None) or ()
                if not isinstance(d, tirx.IntImm) for v in tirx.analysis.undefined_vars(d)}
        assert dims >= {"batch", "seq"}, name
        assert "T.vectorized" in func.script() and "T.parallel" in func.script()


def test_attention_kernels_keep_their_rules_with_symbolic_seq():
    """Q K^T (seq x seq), P V (reducing over seq) and the softmax over seq are scheduled by
    the rules a static build uses, not dlight or the fallback."""
    from compiler.driver import schedule_kernels

    _, rules, _ = schedule_kernels(_model())
    by_kind = {k: v for k, v in rules.items()}
    assert by_kind["softmax"] == "cpu.row_reduction"
    matmuls = [v for k, v in by_kind.items() if "matmul" in k]
    assert matmuls.count("cpu.matmul") == 2 and "fallback" not in matmuls
    assert not any(v.startswith("dlight") for v in rules.values())


def _torch_style_model():
    """Shape arithmetic as PyTorch's exporter writes it: the sequence length read with
    Shape -> Gather, position ids from Range over it, a head split reshaped to a Concat of
    gathered dims, and an Expand to a computed shape."""
    from onnx import TensorProto, helper, numpy_helper

    def c(name, value):
        return numpy_helper.from_array(np.asarray(value, np.int64), name)

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["seq"], name="gather_seq", axis=0),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="gather_batch", axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["pos"], name="range"),
        helper.make_node("Cast", ["pos"], ["posf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["posf", "axes01"], ["pos2"], name="unsq"),  # [1,1,seq]
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["b1"], name="unsq_b"),
        helper.make_node("Unsqueeze", ["seq", "axes0"], ["s1"], name="unsq_s"),
        helper.make_node("Concat", ["b1", "s1", "two", "minus1"], ["split"], name="concat",
                         axis=0),
        helper.make_node("Reshape", ["x", "split"], ["heads"], name="reshape"),  # [b,s,2,4]
        helper.make_node("Concat", ["b1", "s1", "s1"], ["sq"], name="concat_sq", axis=0),
        helper.make_node("Expand", ["pos2", "sq"], ["grid"], name="expand"),  # [b, s, s]
        helper.make_node("ReduceSum", ["grid", "axes2"], ["rowsum"], name="rowsum",
                         keepdims=1),  # [b, s, 1]: sum of positions = s (s - 1) / 2
        helper.make_node("ReduceSum", ["heads", "axes3"], ["hsum"], name="hsum", keepdims=0),
        helper.make_node("Add", ["hsum", "rowsum"], ["y"], name="add"),  # [b, s, 2]
    ]
    g = helper.make_graph(
        nodes, "torch_style",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 2])],
        [c("zero", 0), c("one", 1), c("two", [2]), c("minus1", [-1]), c("axes0", [0]),
         c("axes01", [0, 1]), c("axes2", [2]), c("axes3", [3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_exporter_shape_arithmetic_stays_symbolic():
    m = _torch_style_model()
    cm = compiler.compile(m, dims={"batch": (1, 3), "seq": (1, 40, 8)})
    assert isinstance(cm, compiler.CompiledModel)  # not the per-shape fallback
    assert [d["name"] for d in cm.report["dims"]] == ["batch", "seq"]
    # the Range kernel reads seq as a scalar argument or off its output's shape
    sess = cm.session()
    for b, s in [(1, 1), (2, 5), (3, 40)]:
        x = np.random.default_rng(s).standard_normal((b, s, 8)).astype(np.float32)
        assert_close(sess.run(None, {"x": x}), ort_run(m, {"x": x}))


@pytest.mark.slow  # ~50 s to compile on a loaded 2-core host
def test_hf_bert_export_compiles_once_for_every_shape(tmp_path):
    """transformers' exported BERT (masks built from Range / Flatten / Gather over the
    dims) as one artifact: every shape, padded masks, against onnxruntime."""
    import onnx

    from tests.conftest import REPO

    path = REPO / "tests" / "data" / "hf_bert_tiny.onnx"
    cm = compiler.compile(str(path), dims={"batch": (1, 3, 1), "sequence": (1, 64, 16)})
    assert isinstance(cm, compiler.CompiledModel)
    cm.export(str(tmp_path / "bert.so"))
    sess = runtime.load(str(tmp_path / "bert.so"))
    model = onnx.load(str(path))
    rng = np.random.default_rng(0)
    for b, s in [(1, 1), (1, 7), (2, 16), (3, 64)]:
        mask = np.ones((b, s), np.int64)
        mask[:, s - s // 3:] = 0
        feeds = {"input_ids": rng.integers(0, 100, (b, s)).astype(np.int64),
                 "attention_mask": mask,
                 "token_type_ids": rng.integers(0, 2, (b, s)).astype(np.int64)}
        assert_close(sess.run(None, feeds), ort_run(model, feeds))


def test_undeclared_dims_get_the_default_and_the_report_says_so():
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m)
    lo, hi, opt = DEFAULT_RANGE
    assert cm.report["dims"] == [{"name": "n", "min": lo, "max": hi, "opt": opt,
                                  "declared": False}]
    assert any("dim 'n' has no declared range" in w for w in cm.report["warnings"])
    assert cm.memory_plan.arena_bytes >= hi * 3 * 4
    sess = cm.session()
    x = -np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    with pytest.raises(DimError, match=r"\(the default range\)"):
        sess.run(None, {"x": np.zeros((hi + 1, 3), np.float32)})
    with pytest.raises(ValueError, match=r"dims=\['m'\] name no symbolic input dimension"):
        compiler.compile(m, dims={"m": (1, 2)})


def test_dim_ranges_are_checked():
    assert parse_dim_option("seq=1..512:128") == ("seq", (1, 512, 128))
    assert parse_dim_option("b=2..8") == ("b", (2, 8, 8))
    for bad in ("seq", "seq=1-512", "seq=a..b", "=1..2"):
        with pytest.raises(ValueError, match="expected NAME=MIN..MAX"):
            parse_dim_option(bad)
    for bad in ((8, 4), (1, 8, 9), (-1, 8), (0, 8, 0), (0, 0)):
        with pytest.raises(ValueError, match=r"need 0 <= min <= opt <= max, opt >= 1"):
            resolve_ranges(["seq"], {"seq": bad})
    # an empty extent is a valid minimum (a decoder's past at prefill)
    assert resolve_ranges(["past"], {"past": (0, 8)})[0]["min"] == 0


def test_size_expressions_must_be_monotone():
    from tvm import tirx

    s = tirx.Var("seq", "int64")
    two = tirx.IntImm("int64", 2)
    assert monotone(s * two + tirx.IntImm("int64", 3))
    assert monotone(tirx.floordiv(s + tirx.IntImm("int64", 7), tirx.IntImm("int64", 8)))
    assert monotone(s - two)
    assert not monotone(tirx.IntImm("int64", 512) - s)  # shrinks as seq grows
    assert not monotone(tirx.floormod(s, tirx.IntImm("int64", 4)))


def test_bind_dims_rules():
    dims = [{"name": "b", "min": 1, "max": 4, "opt": 4, "declared": True}]
    inputs = [("x", ["b", 3]), ("y", ["b"])]
    feeds = {"x": np.zeros((2, 3)), "y": np.zeros(2)}
    assert bind_dims(dims, inputs, feeds) == {"b": 2}
    with pytest.raises(DimError, match="expected rank 2"):
        bind_dims(dims, inputs, {"x": np.zeros(2), "y": np.zeros(2)})
    assert ShapeExpr(["b", "(b * 3) // 2", "max(b, 3)"], {"b"})({"b": 4}) == (4, 6, 4)
    with pytest.raises(ValueError, match="is not allowed"):
        ShapeExpr(["__import__('os')"], {"b"})


@pytest.mark.slow  # two compiles in child processes: ~45 s on a loaded 2-core host
def test_cli_dim_option(tmp_path):
    import onnx

    from tests.compiler.test_cli import onnxc

    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    r = onnxc("compile", path, "-o", tmp_path / "m.so", "--dim", "seq=1..5:4",
              "--dim", "batch=1..2", "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    dims = json.loads((tmp_path / "r.json").read_text())["dims"]
    assert [(d["name"], d["min"], d["max"], d["opt"]) for d in dims] == [
        ("batch", 1, 2, 2), ("seq", 1, 5, 4)]
    r = onnxc("run", tmp_path / "m.so", "--random-inputs", "--allow-untrusted-location")
    assert r.returncode == 0, r.stderr
    assert "[2, 4, 32]" in r.stdout  # random inputs at the dims' opt
    r = onnxc("compile", path, "-o", tmp_path / "n.so", "--dim", "seq=1:5")
    assert r.returncode == 2 and "expected NAME=MIN..MAX" in r.stderr


def test_annotate_dim_opt_names_the_dims_each_kernel_uses():
    """Each kernel over symbolic dims carries their opt values and ranges (buffer shapes
    and scalar dim parameters); a static kernel is left as it is; tuning keys ignore the
    attributes."""
    import tvm
    from tvm import te, tirx

    from compiler.lowering.symbolic import DIM_OPT_ATTR, DIM_RANGE_ATTR, annotate_dim_opt
    from schedules.database import workload_hash

    seq, past = tirx.Var("seq", "int64"), tirx.Var("past", "int64")
    a = te.placeholder((seq, tirx.IntImm("int64", 4)), name="a")
    sym = te.create_prim_func([a, te.compute(a.shape, lambda i, j: a[i, j] * 2.0)])
    b = te.placeholder((3, 4), name="b")
    static = te.create_prim_func([b, te.compute(b.shape, lambda i, j: b[i, j] + 1.0)])
    c = te.placeholder((past + 1,), name="c")
    shifted = te.create_prim_func([c, te.compute((past + 1,), lambda i: c[i])])
    out = annotate_dim_opt({"sym": sym, "static": static, "shifted": shifted},
                           {"seq": 1, "past": 512, "batch": 4},
                           {"seq": (1, 64), "past": (0, 512)})
    assert dict(out["sym"].attrs[DIM_OPT_ATTR]) == {"seq": 1}
    assert dict(out["shifted"].attrs[DIM_OPT_ATTR]) == {"past": 512}
    # ... and their ranges, which the build asserts (lowering/assume_dim_ranges.py)
    assert {k: list(v) for k, v in out["sym"].attrs[DIM_RANGE_ATTR].items()} == {"seq": [1, 64]}
    assert {k: list(v) for k, v in out["shifted"].attrs[DIM_RANGE_ATTR].items()} == \
        {"past": [0, 512]}
    assert out["static"].same_as(static)
    assert workload_hash(out["sym"]) == workload_hash(sym)
    assert isinstance(out["sym"], tvm.tirx.PrimFunc)


def _audio_encoder():
    """wav2vec2's shape over raw samples (``dynamic_axes`` on them): a strided conv1d
    feature encoder, tokens projected by a matmul, the positional conv (even kernel,
    grouped) trimmed by one frame (``Slice [:-1]``: its length is
    ``min(max(n, 0), n + 1)``, n only when the samples give a frame), a residual add,
    LayerNorm and a dense layer."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)

    def t(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    n = helper.make_node
    inits = [numpy_helper.from_array(a, k) for k, a in (
        ("axes1", np.array([1], np.int64)), ("c0", t(32, 1, 10)), ("c1", t(32, 32, 3)),
        ("proj", t(32, 64)), ("pb", t(64)), ("pos", t(64, 16, 4)),
        ("start", np.array([0], np.int64)), ("end", np.array([-1], np.int64)),
        ("axis2", np.array([2], np.int64)), ("g", t(64) + 1), ("b", t(64)),
        ("dense", t(64, 64)))]
    nodes = [
        n("Unsqueeze", ["x", "axes1"], ["x3"]),
        n("Conv", ["x3", "c0"], ["f0"], strides=[5]), n("Gelu", ["f0"], ["g0"]),
        n("Conv", ["g0", "c1"], ["f1"], strides=[2]), n("Gelu", ["f1"], ["g1"]),
        n("Transpose", ["g1"], ["tok"], perm=[0, 2, 1]),
        n("MatMul", ["tok", "proj"], ["p0"]), n("Add", ["p0", "pb"], ["h"]),
        n("Transpose", ["h"], ["hc"], perm=[0, 2, 1]),
        n("Conv", ["hc", "pos"], ["pc"], pads=[2, 2], group=4),
        n("Slice", ["pc", "start", "end", "axis2"], ["trim"]),
        n("Gelu", ["trim"], ["pg"]),
        n("Transpose", ["pg"], ["pt"], perm=[0, 2, 1]),
        n("Add", ["h", "pt"], ["r"]),
        n("LayerNormalization", ["r", "g", "b"], ["ln"], axis=-1),
        n("MatMul", ["ln", "dense"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "audio_encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def test_audio_encoder_over_symbolic_samples_keeps_its_rules(tmp_path):
    """Raw samples of any length in the declared range: one artifact, the convs on the
    packed conv1d rule and the dense layers on the packed matmul rule (the trimmed
    frame count imported, planned and tiled only with the declared range known: it
    failed to import, then to plan, then its matmuls fell to dlight at 12x onnxruntime),
    matching onnxruntime at lengths in the range."""
    model = _audio_encoder()
    cm = compiler.compile(model, dims={"samples": (400, 20000, 4000)})
    assert "kernel_table" in cm.report, cm.report.get("why")
    rules = {k["kernel"]: k["rule"] for k in cm.report["kernel_table"]}
    assert not any(r.startswith("dlight") or r == "fallback" for r in rules.values()), rules
    assert sum(r == "cpu.conv2d_packed" for r in rules.values()) == 3, rules
    assert sum(r == "cpu.matmul_packed" for r in rules.values()) == 2, rules
    cm.export(str(tmp_path / "m.so"))
    sess = runtime.load(str(tmp_path / "m.so"))
    for samples in (4000, 400, 1237, 20000):
        x = np.random.default_rng(samples).standard_normal((1, samples)).astype(np.float32)
        assert_close(sess.run(None, {"x": x}), ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_padded_row_counts_in_any_form_are_tiled():
    """pack_matmul_weights' padding of a row count TVM folds into another form still
    reads as whole multiples of the tile."""
    from tvm import tirx

    from schedules.cpu.common import row_multiple

    s = tirx.Var("samples", "int64")
    c = lambda v: tirx.const(v, "int64")  # noqa: E731
    assert row_multiple((s - c(400)) // c(3840) * c(12) + c(12)) == 12
    assert row_multiple(((s + c(11)) // c(12)) * c(12)) == 12
    assert row_multiple(s + c(1)) is None


def _dynamo_mask_model():
    """transformers' padding mask as torch's dynamo exporter writes it when each input has
    its own batch symbol (``Dim.DYNAMIC`` per input): ``mask[batch_idx, kv_idx]`` is a
    GatherND of the mask (batch ``mb``) at indices built from Range over the ids' batch
    ``b`` and length ``s``, broadcast with Max / Expand and concatenated."""
    from onnx import TensorProto, helper, numpy_helper

    def c(name, value):
        return numpy_helper.from_array(np.asarray(value, np.int64), name)

    nodes = [
        helper.make_node("Cast", ["mask"], ["maskb"], to=TensorProto.BOOL),
        helper.make_node("Shape", ["ids"], ["b1"], start=0, end=1),
        helper.make_node("Squeeze", ["b1"], ["b"]),
        helper.make_node("Range", ["zero", "b", "one"], ["ar_b"]),
        helper.make_node("Unsqueeze", ["ar_b", "ax1"], ["ub"]),  # [b, 1]
        helper.make_node("Shape", ["ids"], ["s1"], start=1, end=2),
        helper.make_node("Squeeze", ["s1"], ["s"]),
        helper.make_node("Range", ["zero", "s", "one"], ["ar_s"]),
        helper.make_node("Unsqueeze", ["ar_s", "ax0"], ["us"]),  # [1, s]
        helper.make_node("Max", ["ub", "us"], ["mx"]),
        helper.make_node("Shape", ["mx"], ["bs"]),
        helper.make_node("Expand", ["ub", "bs"], ["eb"]),
        helper.make_node("Unsqueeze", ["eb", "axm1"], ["ib"]),
        helper.make_node("Expand", ["us", "bs"], ["es"]),
        helper.make_node("Unsqueeze", ["es", "axm1"], ["is_"]),
        helper.make_node("Concat", ["ib", "is_"], ["idx"], axis=-1),  # [b, s, 2]
        helper.make_node("GatherND", ["maskb", "idx"], ["keep"]),  # [b, s]
        helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
        helper.make_node("Where", ["keep", "idsf", "neg"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "dynamo_mask",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["mb", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s"])],
        [c("zero", 0), c("one", 1), c("ax0", [0]), c("ax1", [1]), c("axm1", [-1]),
         numpy_helper.from_array(np.asarray(-1e4, np.float32), "neg")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_mask_with_its_own_batch_symbol_compiles_once():
    """The mask's shape as a tensor (GatherND's index bounds over ``(mb, s)``) is a kernel
    of its own: fused with the Range kernels defining ``s``, TVM's FuseTIR aborted
    ("VarRemapGet(source) == nullptr"; MiniLM / BERT / LLaMA / T5 exported by dynamo)."""
    m = _dynamo_mask_model()
    cm = compiler.compile(m, dims={"b": (1, 4, 1), "mb": (1, 4, 1), "s": (1, 40, 8)})
    assert isinstance(cm, compiler.CompiledModel)  # one artifact, not per shape
    sess = cm.session()
    for b, s in [(1, 1), (2, 5), (4, 40)]:
        rng = np.random.default_rng(b * 100 + s)
        feeds = {"ids": rng.integers(0, 100, (b, s)).astype(np.int64),
                 "mask": (rng.random((b, s)) > 0.3).astype(np.int64)}
        assert_close(sess.run(None, feeds), ort_run(m, feeds))


def test_reshape_to_another_inputs_shape_is_checked_at_run():
    """Reshape(x, Shape(y)) with x [b, s] and y [b, t]: nothing at compile time says s = t.
    A run whose feeds break it is refused naming the node (it was a view over the wrong
    number of elements: onnxruntime's test model reshape_fusion_input_is_graph_input)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Shape", ["y"], ["shape"], name="shape"),
             helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Add", ["r", "y"], ["z"], name="add")]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s"]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t"])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", "t"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(m, dims={"b": (1, 4, 1), "s": (1, 32, 8), "t": (1, 32, 8)},
                          batch_loop=False)
    assert isinstance(cm, compiler.CompiledModel)
    sess = cm.session()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 6)).astype(np.float32),
             "y": rng.standard_normal((2, 6)).astype(np.float32)}
    assert_close(sess.run(None, feeds), ort_run(m, feeds))
    feeds["y"] = rng.standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(DimError, match="'reshape' \\(Reshape\\).* 12 elements cannot become 6"):
        sess.run(None, feeds)


def _position_buckets_model():
    """T5's relative-position buckets over a symbolic sequence (HF's
    ``_relative_position_bucket``, bidirectional): a log of the distance cast to int64,
    then selects; the last select reads the log's result twice."""
    from onnx import TensorProto, helper

    f32 = lambda name, v: helper.make_tensor(name, TensorProto.FLOAT, [], [v])  # noqa: E731
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [], [v])  # noqa: E731
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "zero"], ["seq"], axis=0),
        n("Range", ["zero", "seq", "one"], ["r"]),
        n("Unsqueeze", ["r", "ax1"], ["ctx"]), n("Unsqueeze", ["r", "ax0"], ["mem"]),
        n("Sub", ["mem", "ctx"], ["rel"]),
        n("Greater", ["rel", "zero"], ["after"]), n("Cast", ["after"], ["after_i"], to=7),
        n("Mul", ["after_i", "sixteen"], ["offset"]),
        n("Abs", ["rel"], ["dist"]), n("Less", ["dist", "eight"], ["small"]),
        n("Cast", ["dist"], ["dist_f"], to=1), n("Div", ["dist_f", "eight_f"], ["ratio"]),
        n("Log", ["ratio"], ["lg"]), n("Div", ["lg", "log16"], ["scaled"]),
        n("Mul", ["scaled", "eight_f"], ["steps"]), n("Cast", ["steps"], ["steps_i"], to=7),
        n("Add", ["steps_i", "eight"], ["large"]), n("Min", ["large", "fifteen"], ["large_c"]),
        n("Where", ["small", "dist", "large_c"], ["bucket"]),
        n("Add", ["bucket", "offset"], ["b2"]),
        n("Less", ["b2", "zero"], ["neg"]), n("Add", ["b2", "thirtytwo"], ["wrapped"]),
        n("Where", ["neg", "wrapped", "b2"], ["y"])]
    inits = [i64("zero", 0), i64("one", 1), i64("eight", 8), i64("fifteen", 15),
             i64("sixteen", 16), i64("thirtytwo", 32), f32("eight_f", 8.0),
             f32("log16", float(np.log(16.0))),
             helper.make_tensor("ax0", TensorProto.INT64, [1], [0]),
             helper.make_tensor("ax1", TensorProto.INT64, [1], [1])]
    g = helper.make_graph(nodes, "buckets",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, ["seq", "seq"])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_position_buckets_over_a_symbolic_sequence():
    """The kernel computing them holds one copy of the log (copied into two reads of a
    select, its Lets made TVM's lowering refuse T5's kernel, "Binding of variable v ...
    conflicts", and this one took 6 minutes to build) and matches onnxruntime at several
    lengths."""
    from compiler import driver

    model = _position_buckets_model()
    dims = {"seq": (1, 300, 64)}
    mod, _, _ = driver.schedule_kernels(model, "host", dims=dims)
    (kernel,) = [f for gv, f in mod.functions.items() if "log" in gv.name_hint]
    # the log computed once per element (its ``e * ln2_hi`` term): not once per read
    assert kernel.script().count("0.693359375") == 1
    sess = compiler.compile(model, dims=dims).session()
    for seq in (1, 7, 64, 300):
        x = np.zeros((seq, 4), np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ort_run(model, {"x": x})[0])
