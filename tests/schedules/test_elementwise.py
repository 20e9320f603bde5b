"""cpu.elementwise: kernels without a reduction get the loop schedule under their own name;
structure under AVX-512 and AVX2 targets, numerics against onnxruntime, and what it leaves."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax

from schedules.cpu.elementwise import Elementwise
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

AVX2 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


def _swish(shape):
    return fused_primfunc(
        lambda bb, x: bb.emit(relax.op.multiply(x, relax.op.sigmoid(x))), [shape], "sigmoid")


@pytest.mark.parametrize("target,lanes", [(TARGET, 16), (AVX2, 8)])
def test_structure_vectorised_and_parallel(target, lanes):
    text = Elementwise().apply(_swish((1, 144, 56, 56)), target).mod["main"].script()
    assert "T.parallel" in text and f"T.vectorized(T.int64({lanes}))" in text
    blocks = text.count("T.sblock(") - text.count("T.sblock(\"root\")")
    assert blocks == 1  # sigmoid inlined into the multiply


def test_leaves_reductions():
    summed = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(64, 256)],
                            "sum")
    assert Elementwise().apply(summed, TARGET) is None


@pytest.mark.parametrize("shape", [(1, 144, 56, 56), (2, 5, 7, 3)])
def test_swish_against_onnxruntime(shape):
    # 56 x 56 divides the lanes after fusing; 7 x 3 does not (scalar inner loop)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    x = (np.random.default_rng(0).standard_normal(shape) * 30).astype(np.float32)
    x.flat[:5] = [np.nan, np.inf, -np.inf, -0.0, -100.0]
    check_against_ort(onnx_model(nodes, [("x", shape)], [("y", shape)]), {"x": x},
                      "cpu.elementwise")


def test_symbolic_innermost_loop_stays_serial_outside_the_parallel_fusion():
    """Attention's K^T transpose [batch, seq, 12, 64] -> [batch, 12, 64, seq]: fused with
    seq, every element's index would be divided by seq (4.5x slower at seq 128); the outer
    loops are fused and parallel, seq is a plain loop for LLVM to vectorise."""
    from tvm import tirx

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.multiply(
        relax.op.permute_dims(x, [0, 2, 3, 1]), relax.const(0.35, "float32"))),
        [(b, s, 12, 64)], "transpose")
    text = Elementwise().apply(f, AVX2).mod["main"].script()
    assert "in T.parallel(batch * T.int64(768))" in text and "in range(seq)" in text
    assert "// seq" not in text and "% seq" not in text


def test_symbolic_reshape_fuses_one_symbolic_loop():
    """ShuffleNet's channel shuffle over a symbolic image, [b, 116, h, w] -> [b, 2, 58, h,
    w] as a kernel: its indices already divide by the symbolic extents; with the rows
    fused into the parallel loop too, TVM's simplifier took 209 s to build it.  The
    parallel loop takes the loops before the second symbolic one (b x 116); built and
    checked against numpy."""
    from tvm import te, tirx, topi

    b, h, w = (tirx.Var(n, "int64") for n in ("b", "h", "w"))
    x = te.placeholder((b, tirx.IntImm("int64", 116), h, w), name="x")
    y = topi.reshape(x, (b, 2, 58, h, w))
    f = te.create_prim_func([x, y])
    sch = Elementwise().apply(f, TARGET)
    text = sch.mod["main"].script()
    assert "T.parallel(b * T.int64(116))" in text, text
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol",
                                                                      "main")}), TARGET)
    a = np.random.default_rng(0).standard_normal((1, 116, 5, 3)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((1, 2, 58, 5, 3), "float32"))
    lib["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), a.reshape(1, 2, 58, 5, 3))


def test_symbolic_transpose_numerics():
    from tests.conftest import assert_close, ort_run

    import compiler

    model = onnx_model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1],
                                         name="t")],
                       [("x", ["batch", "seq", 4, 8])], [("y", ["batch", 4, 8, "seq"])])
    cm = compiler.compile(model, dims={"batch": (1, 2), "seq": (1, 40)})
    assert isinstance(cm, compiler.CompiledModel)  # one symbolic artifact
    sess = cm.session()
    for shape in [(1, 1, 4, 8), (2, 13, 4, 8), (2, 40, 4, 8)]:
        x = {"x": np.random.default_rng(shape[1]).standard_normal(shape).astype("float32")}
        assert_close(sess.run(None, x), ort_run(model, x))


@pytest.mark.parametrize("target", [TARGET, AVX2])
def test_structure_odd_rows_keep_a_plain_inner_loop(target):
    """A 1-pixel zero pad of [1, 64, 112, 112]: 114-wide rows divide no vector; the row
    loop stays a plain loop inside the parallel one (it was fused into 831744 parallel
    iterations with a division and a modulo each: 4-8 ms against onnxruntime's 0.2), and
    is partitioned at the pad's bounds tests when lowered (its interior a plain copy)."""
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1])),
                       [(1, 64, 112, 112)], "pad")
    text = Elementwise().apply(f, target).mod["main"].script()
    assert "T.parallel(T.int64(7296))" in text  # 64 x 114 rows
    assert ('T.serial(T.int64(114), annotations={"pragma_loop_partition_hint": 1})' in text
            and "T.vectorized" not in text)


@pytest.mark.parametrize("target", [TARGET, AVX2])
def test_structure_long_odd_rows_whole_vectors_then_a_tail(target):
    """wav2vec2's GELU after its InstanceNorm's per-channel scale: [1, 512, 3199]. Rows in
    parallel, each 3199 as whole vectors then a one-vector tail; the two inner loops fused
    (3199 x 512 is whole vectors) read the per-channel scale as a gather behind a division
    per lane (2.6 ms, onnxruntime 1.2 on emeraldrapids).  The tail is one short vector
    (scalar, an erf / exp tail cost ~40 ops an element)."""
    lanes = 16 if target is TARGET else 8

    def build(bb, x, s):
        return bb.emit(relax.op.nn.gelu(bb.emit(relax.op.multiply(x, s))))
    f = fused_primfunc(build, [(1, 512, 3199), (512, 1)], "gelu")
    text = Elementwise().apply(f, target).mod["main"].script()
    head = 3199 - 3199 % lanes
    assert "T.parallel(T.int64(512))" in text
    assert f"T.vectorized(T.int64({lanes}))" in text
    assert f"in T.vectorized(T.int64({head}), T.int64(3199))" in text  # the tail: one vector


def test_long_odd_rows_against_onnxruntime():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 24, 211)).astype("float32")
    s = rng.standard_normal((24, 1)).astype("float32")
    model = onnx_model([helper.make_node("Mul", ["x", "s"], ["m"]),
                        helper.make_node("Tanh", ["m"], ["y"])],
                       [("x", x.shape)], [("y", x.shape)], {"s": s})
    check_against_ort(model, {"x": x}, "cpu.elementwise")


def test_pad_odd_rows_against_onnxruntime():
    x = np.random.default_rng(3).standard_normal((1, 8, 13, 13)).astype("float32")
    pads = np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)
    for mode in ("constant", "reflect", "edge"):  # (the last two: schedules/cpu/pad.py)
        model = onnx_model([helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)],
                           [("x", x.shape)], [("y", (1, 8, 16, 16))], {"p": pads})
        check_against_ort(model, {"x": x}, "cpu.elementwise" if mode == "constant"
                          else "cpu.pad")


def test_constant_loops_inside_a_symbolic_one_stay_in_the_parallel_body():
    """GPT-2's cache Concat(past, new) -> [batch, 12, past + seq, 64]: the parallel loop
    fuses (batch, head, row) and each iteration copies a whole row of 64; fusing the 8
    vectors of a row too divided the index by the row count per 8 floats (3x slower)."""
    from tvm import tirx

    b, p, s = (tirx.Var(n, "int64") for n in ("batch", "past", "seq"))
    f = fused_primfunc(lambda bb, x, y: bb.emit(relax.op.concat([x, y], axis=2)),
                       [(b, 12, p, 64), (b, 12, s, 64)], "concatenate")
    text = Elementwise().apply(f, AVX2).mod["main"].script()
    assert "T.parallel(batch * (past + seq) * T.int64(12))" in text
    assert "in range(T.int64(8))" in text and "T.vectorized(T.int64(8))" in text


@pytest.mark.parametrize("target", [TARGET, AVX2])
def test_tiny_kernel_stays_serial(target):
    """Below SERIAL_BELOW iterations a parallel launch costs more than the work: [1, 64]
    is one vectorised loop on one core; [1, 144, 56, 56] above is parallel."""
    from schedules.cpu.fallback import SERIAL_BELOW

    assert 64 < SERIAL_BELOW <= 144 * 56 * 56
    text = Elementwise().apply(_swish((1, 64)), target).mod["main"].script()
    assert "T.parallel" not in text and "T.vectorized" in text


def _rotate_half_nodes(half):
    """HF's rotate_half over the last axis, then heads flattened: y = reshape(concat(-x[..,
    half:], x[.., :half])) * s + reshape(x) * c, as LLaMA / GPT-NeoX exports write it."""
    i64 = lambda name, v: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=helper.make_tensor(name, 7, [len(v)], v))
    return [i64("lo", [0]), i64("mid", [half]), i64("hi", [2 * half]), i64("ax", [-1]),
            i64("flat", [0, 0, -1]),
            helper.make_node("Slice", ["x", "lo", "mid", "ax"], ["x1"]),
            helper.make_node("Slice", ["x", "mid", "hi", "ax"], ["x2"]),
            helper.make_node("Neg", ["x2"], ["n2"]),
            helper.make_node("Concat", ["n2", "x1"], ["r"], axis=-1),
            helper.make_node("Reshape", ["r", "flat"], ["rf"]),
            helper.make_node("Reshape", ["x", "flat"], ["xf"]),
            helper.make_node("Mul", ["rf", "s"], ["rs"]),
            helper.make_node("Mul", ["xf", "c"], ["xc"]),
            helper.make_node("Add", ["rs", "xc"], ["y"])]


@pytest.mark.parametrize("shape", [(2, 6, 4, 8), (1, 128, 12, 64), (1, 7, 3, 6)])
def test_rotate_half_against_onnxruntime(shape):
    """A select on the index modulo the head size, inlined into the flattening reshape:
    LLVM's loop vectoriser for znver4 / znver5 got the scalar loop wrong (half of the
    outputs garbage, only on those hosts); the loop is split by the head size first."""
    b, s, h, d = shape
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(v).astype(np.float32)
             for n, v in (("x", shape), ("s", (b, s, h * d)), ("c", (b, s, h * d)))}
    model = onnx_model(_rotate_half_nodes(d // 2), [(n, v.shape) for n, v in feeds.items()],
                       [("y", (b, s, h * d))])
    check_against_ort(model, feeds, "cpu.elementwise")


@pytest.mark.parametrize("target", [TARGET, AVX2])
def test_structure_select_on_a_period_is_split_there(target):
    """The rotate-half block's innermost loop is split by the period (8) and partitioned at
    the select's cut (4): no modulo left in the loop; kept scalar (no vectorize)."""
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.reshape(relax.op.concat(
        [relax.op.negative(relax.op.strided_slice(x, [3], [4], [8])),
         relax.op.strided_slice(x, [3], [0], [4])], axis=3), (2, 6, 32))),
        [(2, 6, 4, 8)], "concat")
    text = Elementwise().apply(f, target).mod["main"].script()
    assert "range(T.int64(4), T.int64(8))" in text, text
    assert "T.vectorized" not in text



def _fixture(name: str):
    """The PrimFunc a test fixture (tests/data/NAME.tvmscript) holds, as FuseTIR made it."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "data", f"{name}.tvmscript")
    with open(path) as f:
        return tvm.script.from_source(f.read())


def _outputs(libs, func, name: str) -> list:
    """Each built ``libs``' output (the last parameter) on the same seeded inputs of
    ``func``'s parameters (small ints for integer ones)."""
    rng = np.random.default_rng(0)
    args = [rng.integers(0, 4, [int(d) for d in p.shape]).astype(str(p.dtype))
            if "int" in str(p.dtype) else
            rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype))
            for p in func.params]
    outs = []
    for lib in libs:
        ts = [tvm.runtime.tensor(a.copy()) for a in args]
        lib[name](*ts)
        outs.append(ts[-1].numpy())
    return outs


def test_let_over_rows_narrower_than_a_vector_builds():
    """MobileNetV3's QDQ squeeze-excitation requantisation (tests/data/
    qdq_se_requant_kernel.tvmscript, as FuseTIR made it): NCHW16c -> NCHW -> NCHW8c with a
    clip whose operand legalize_nan binds with a Let.  8 lanes a pixel, so whole vectors
    would span two pixels, indexed by a division; TVM's vectorizer scalarizes that loop and
    its simplifier then refuses the Let bound once per lane ("Let cannot bind the same var
    to two different values": the model did not build).  The rows stay scalar there; the
    kernel builds and computes what the unscheduled function does."""
    func = _fixture("qdq_se_requant_kernel")
    sch = Elementwise().apply(func, TARGET)
    built = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol",
                                                                         "main")}), "llvm")
    plain = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                        "llvm")
    got, want = _outputs((built, plain), func, "main")
    np.testing.assert_array_equal(got, want)


def test_let_under_a_requantisation_is_inlined_and_builds():
    """EfficientNet-B0's QDQ swish conv (tests/data/qdq_swish_conv_kernel.tvmscript): the
    stable sigmoid's Lets end up, once inlined into the conv's write-back, under the
    requantisation's cast to uint8, where TVM's vectorizer refused them and the model did
    not build.  schedules.lets inlines them (only there); the kernel builds and computes
    what the unscheduled function does."""
    import targets
    from schedules import apply_schedules
    from schedules.lets import inline_lets, needs_inlining

    func = _fixture("qdq_swish_conv_kernel").with_attr("global_symbol", "k")
    host = targets.resolve("host")
    mod, rules = apply_schedules(tvm.IRModule({"k": func}), host)
    assert rules == {"k": "cpu.conv2d_nchwc"}
    assert "T.Let" in func.script() and "T.Let" not in mod["k"].script()
    built = tvm.compile(mod, target=host.tvm_target())
    plain = tvm.compile(tvm.IRModule({"k": inline_lets(func)}), "llvm")
    assert not needs_inlining(func)  # unscheduled, the cast is another block's
    got, want = _outputs((built, plain), func, "k")
    np.testing.assert_allclose(got, want, atol=0.05)


@pytest.mark.parametrize("target,lanes,w", [(TARGET, 16, 56), (AVX2, 8, 28)])
def test_structure_broadcast_over_rows_keeps_its_rows(target, lanes, w):
    """Expand [1, 64, 1, w] -> [1, 64, w, w] (w no whole number of vectors, w x w one):
    the read indexes the last axis alone.  Fused with the rows its index was a modulo per
    lane, a gather (2.9x onnxruntime's time at 56 on AVX-512); each row is now whole
    vectors and a tail, read contiguously."""
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.broadcast_to(x, (1, 64, w, w))),
                       [(1, 64, 1, w)], "broadcast_to")
    text = Elementwise().apply(f, target).mod["main"].script()
    assert f"T.parallel(T.int64({64 * w}))" in text  # the rows
    assert f"T.vectorized(T.int64({lanes}))" in text
    assert f"in T.vectorized(T.int64({w - w % lanes}), T.int64({w}))" in text
    # the column read is the vector loop's own index, not a modulo of a fused one
    assert not [ln for ln in text.splitlines() if "v2 = " in ln and "%" in ln]


def test_broadcast_over_rows_against_onnxruntime():
    x = np.random.default_rng(5).standard_normal((2, 8, 1, 28)).astype("float32")
    model = onnx_model([helper.make_node("Expand", ["x", "s"], ["y"])],
                       [("x", x.shape)], [("y", (2, 8, 28, 28))],
                       {"s": np.array([2, 8, 28, 28], np.int64)})
    check_against_ort(model, {"x": x}, "cpu.elementwise")
