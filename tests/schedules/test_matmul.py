"""cpu.matmul: structure under a Target, numerics against onnxruntime / numpy, negatives."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax, te

import targets
from schedules.cpu.matmul import Matmul
from tests.schedules.util import TARGET, check_against_ort, fused_primfunc, onnx_model

# AVX2, 16 ymm registers (this rule's 12-accumulator tiles)
AVX2 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2})


def _bmm(a_shape, b_shape, transposed=False, dtype="float32", epilogue=True):
    """A te matmul PrimFunc, B read [.., k, j] or [.., j, k], with a scale + mask epilogue."""
    a = te.placeholder(a_shape, name="a", dtype=dtype)
    b = te.placeholder(b_shape, name="b", dtype=dtype)
    kk = a_shape[-1]
    n = b_shape[-2] if transposed else b_shape[-1]
    out = tuple(a_shape[:-1]) + (n,)
    k = te.reduce_axis((0, kk), name="k")

    def bval(idx, j):
        bat = idx[len(idx) - len(b_shape) + 2:] if len(b_shape) > 2 else ()
        return b[(*bat, j, k)] if transposed else b[(*bat, k, j)]

    c = te.compute(out, lambda *idx: te.sum(a[(*idx[:-1], k)] * bval(idx[:-2], idx[-1]),
                                            axis=k), name="mm")
    if not epilogue:
        return te.create_prim_func([a, b, c]), out
    mask = te.placeholder(out[-2:], name="mask", dtype=dtype)
    d = te.compute(out, lambda *idx: c[idx] * 0.125 + mask[idx[-2:]], name="epi")
    return te.create_prim_func([a, b, mask, d]), out


def _alloc_shape(text, name):
    """The shape of buffer ``name`` as allocated in scheduled TIR text."""
    m = re.search(rf"{name} = T\.sblock_alloc_buffer\(\(([^)]*(?:\)[^)]*)*?)\)\)", text)
    return [int(x) for x in re.findall(r"(\d+)\)?(?:,|$)", m.group(1))] if m else None


def _widths(text, kind):
    """Extents of the ``kind`` ("vectorized", "unroll") loops in scheduled TIR text."""
    return {int(n) for n in re.findall(rf"T\.{kind}\((?:T\.int64\()?(\d+)", text)}


def test_structure_dense_gelu_epilogue():
    def build(bb, a, b, c):
        return bb.emit(relax.op.nn.gelu(relax.op.add(relax.op.matmul(a, b), c)))
    f = fused_primfunc(build, [(1, 64, 48), (48, 96), (96,)], "matmul")
    text = Matmul().apply(f, TARGET).mod["main"].script()
    assert "T.parallel" in text and "T.vectorized(T.int64(32))" in text
    assert "_local" in text and "T.erf" in text  # epilogue in the tile's write-back


def test_structure_bert_tile_unchanged_avx512():
    """Shapes whose tiles divide keep the 8 x 2-vector AVX-512 tile, no padding."""
    f = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                       [(12, 128, 64), (12, 64, 128)], "matmul")
    text = Matmul().apply(f, TARGET).mod["main"].script()
    assert "T.unroll(T.int64(8))" in text and "T.vectorized(T.int64(32))" in text
    assert "_pad" not in text


@pytest.mark.parametrize("target", [TARGET, AVX2], ids=["znver5", "znver3"])
@pytest.mark.parametrize("transposed", [False, True], ids=["NN", "NT"])
def test_structure_197_padded(target, transposed):
    """ViT's 197 x 197 scores: padded to whole tiles (no 1-row / 1-lane tile), the inner
    loop a vector of the target's lanes times 1-2, parallel outer loop, B in a panel."""
    lanes = targets.cpu_facts(target)["lanes"]
    f, _ = _bmm((12, 197, 64), (12, 197, 64) if transposed else (12, 64, 197), transposed)
    text = Matmul().apply(f, target).mod["main"].script()
    assert "T.parallel" in text and "b_pad_global" in text and "a_pad" in text
    assert _widths(text, "vectorized") & {lanes, 2 * lanes}
    assert min(_widths(text, "unroll")) >= 4  # register rows, not 1-row tiles


@pytest.mark.parametrize("target", [TARGET, AVX2], ids=["znver5", "znver3"])
def test_structure_odd_columns_cut_per_row_block(target):
    """Whisper's 1500 x 1500 scores: N is no whole number of tiles, so the tiles run a row
    block at a time over B packed once ahead, and each tile's padded columns are cut off
    (with the epilogue) inside the column-tile loop, from the tile's block in L1; that loop
    is marked for partitioning (whole tiles unguarded); a B too large to sweep per row
    block keeps the column-panel order and cuts C in a stage of its own."""
    lanes = targets.cpu_facts(target)["lanes"]
    f, _ = _bmm((8, 1500, 64), (8, 1500, 64), transposed=True)
    sch = Matmul().apply(f, target)
    epi, tiles = (sch.get_loops(sch.get_sblock(n)) for n in ("epi", "mm_update"))
    assert sch.get(epi[0]).same_as(sch.get(tiles[0]))   # the parallel row-block loop
    assert sch.get(epi[1]).same_as(sch.get(tiles[1]))   # the column-tile loop
    assert "pragma_loop_partition_hint" in sch.get(tiles[1]).annotations
    text = sch.mod["main"].script()
    assert "T.parallel" in text and _widths(text, "vectorized") & {lanes, 2 * lanes}
    # all of B packed ahead panel-major [8, N/jt, K, jt]: a tile's 64 x jt panel contiguous
    h, panels, kk, jt = _alloc_shape(text, "b_pad_global")
    assert (h, kk) == (8, 64) and jt in (lanes, 2 * lanes) and panels == -(-1500 // jt)
    assert sch.get(epi[-1]).extent == jt  # the cut: one tile's columns
    # negative: K x N = 768 x 1001 floats of B (3 MB)
    f, _ = _bmm((2, 64, 768), (2, 768, 1001))
    sch = Matmul().apply(f, target)
    epi, tiles = (sch.get_loops(sch.get_sblock(n))[0] for n in ("epi", "mm_update"))
    assert not sch.get(epi).same_as(sch.get(tiles))


@pytest.mark.parametrize("target", [TARGET, AVX2], ids=["znver5", "znver3"])
def test_structure_padded_rows_small_b_row_tiles_outer(target):
    """YOLOS-tiny's P V ([3, 1381, 1381] @ [3, 1381, 64]): M no whole tiles, N whole tiles,
    B small: B packed once ahead (its own parallel nest over the heads), the row tiles
    outer and parallel, A's padded rows copied once per row tile (inside it, before the
    column tiles) in whole vectors plus a tail, not as one 1381-lane vector."""
    lanes = targets.cpu_facts(target)["lanes"]
    f, _ = _bmm((3, 1381, 1381), (3, 1381, 64), epilogue=False)
    sch = Matmul().apply(f, target)
    # the pad's row loop partitioned (block a_pad_ax2_common): whole vectors, then a tail
    pb, pad, tiles = (sch.get_loops(sch.get_sblock(n))
                      for n in ("b_global", "a_pad_ax2_common", "mm_update"))
    assert not sch.get(pb[0]).same_as(sch.get(tiles[0]))  # B ahead of the tiles
    assert sch.get(pad[0]).same_as(sch.get(tiles[0]))     # A's pad inside the row tile
    assert sch.get(pad[0]).kind == 1  # parallel
    widths = _widths(sch.mod["main"].script(), "vectorized")
    assert 1381 not in widths and widths & {lanes, 2 * lanes, 4 * lanes}
    h, panels, kk, jt = _alloc_shape(sch.mod["main"].script(), "b_global")
    assert (h, kk, panels * jt) == (3, 1381, 64)  # panel-major, as the row-block order
    # negative: K x N = 1381 x 256 floats of B (1.4 MB) keeps the column-panel order, the
    # panel copied per column tile
    f, _ = _bmm((3, 1381, 1381), (3, 1381, 256), epilogue=False)
    sch = Matmul().apply(f, target)
    pb, tiles = (sch.get_loops(sch.get_sblock(n)) for n in ("b_global", "mm_update"))
    assert sch.get(pb[0]).same_as(sch.get(tiles[0]))
    assert len(_alloc_shape(sch.mod["main"].script(), "b_global")) == 3  # a panel per tile


@pytest.mark.parametrize("target", [TARGET, AVX2], ids=["znver5", "znver3"])
def test_structure_broadcast_batch_and_decode(target):
    f = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                       [(2, 12, 128, 64), (64, 64)], "matmul")
    text = Matmul().apply(f, target).mod["main"].script()
    assert "T.parallel" in text and _widths(text, "vectorized")
    # decoding: one row, B streamed row by row (k outer), vector over N
    f = fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)),
                       [(12, 1, 64), (12, 64, 1024)], "matmul")
    sch = Matmul().apply(f, target)
    text = sch.mod["main"].script()
    lanes = targets.cpu_facts(target)["lanes"]
    assert "T.parallel" in text and lanes in _widths(text, "vectorized")
    assert 4 in _widths(text, "unroll")  # 4 rows of B per accumulator load / store


def test_rejects_integer_conv_and_reduction():
    f, _ = _bmm((8, 16), (16, 32), dtype="int32", epilogue=False)
    assert Matmul().apply(f, TARGET) is None
    conv = fused_primfunc(lambda bb, x, w: bb.emit(relax.op.nn.conv2d(x, w)),
                          [(1, 4, 8, 8), (8, 4, 3, 3)], "conv2d")
    assert Matmul().apply(conv, TARGET) is None
    red = fused_primfunc(lambda bb, x: bb.emit(relax.op.sum(x, axis=[1])), [(8, 16)], "sum")
    assert Matmul().apply(red, TARGET) is None
    # both operands read [i, k]: a Gram-like product with no j in B is not a matmul
    a = te.placeholder((8, 16), name="a")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((8, 8), lambda i, j: te.sum(a[i, k] * a[i, k], axis=k), name="c")
    assert Matmul().apply(te.create_prim_func([a, c]), TARGET) is None


@pytest.mark.parametrize("a_shape,b_shape,transposed", [
    ((12, 197, 64), (12, 64, 197), False),
    ((12, 197, 64), (12, 197, 64), True),   # Q @ K^T with K as [S, d]
    ((4, 77, 64), (4, 64, 77), False),
    ((4, 50, 33), (4, 50, 33), True),
    ((2, 128, 64), (2, 64, 128), False),
    ((2, 197, 197), (2, 197, 64), False),   # P @ V
    ((12, 1, 64), (12, 64, 1024), False),   # decoding
    ((12, 1, 64), (12, 197, 64), True),     # decoding, transposed K
    ((2, 3, 37, 64), (3, 64, 37), False),   # broadcast batch
    ((3, 101, 101), (3, 101, 64), False),   # padded rows, row tiles outer (YOLOS P V)
    ((2, 101, 101), (2, 101, 24), False),   # the same, N a partial panel: B panel-major
    ((2, 60, 40), (2, 100, 40), True),      # N no whole tiles: row blocks, B panel-major
    ((2, 66, 40), (2, 96, 40), True),       # tiles divide: no pad, B per column tile
])
def test_numerics_scheduled_kernel_vs_numpy(a_shape, b_shape, transposed):
    """The scheduled kernel (on this host's target) against numpy, scale + mask epilogue."""
    f, out = _bmm(a_shape, b_shape, transposed)
    target = targets.resolve("host").tvm_target()
    sch = Matmul().apply(f, target)
    assert sch is not None
    lib = tvm.compile(tvm.IRModule({"mm": sch.mod["main"].with_attr("global_symbol", "mm")}),
                      target=target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype("float32")
    b = rng.standard_normal(b_shape).astype("float32")
    mask = rng.standard_normal(out[-2:]).astype("float32")
    dev = tvm.cpu()
    res = tvm.runtime.tensor(np.zeros(out, "float32"), dev)
    lib.mod["mm"](*(tvm.runtime.tensor(x, dev) for x in (a, b, mask)), res)
    bm = np.swapaxes(b, -1, -2) if transposed else b
    np.testing.assert_allclose(res.numpy(), np.matmul(a, bm) * 0.125 + mask,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 20), (20, 10)),            # MLP head: M, N below one register tile
    ((1, 37, 24), (24, 48)),        # odd M
    ((2, 3, 17, 8), (2, 3, 8, 32)), # batch matmul
    ((1, 16, 24), (24, 64)),        # a weight pack_matmul_weights would pack, kept [K, N]
])
def test_numerics_matmul_add(a_shape, b_shape):
    rng = np.random.default_rng(0)
    b = rng.standard_normal(b_shape).astype("float32")
    out = a_shape[:-1] + b_shape[-1:]
    bias = rng.standard_normal(b_shape[-1:]).astype("float32")
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "bias"], ["y"], name="add")]
    model = onnx_model(nodes, [("a", a_shape)], [("y", out)], {"b": b, "bias": bias})
    # this rule's [K, N] form: constant weights stay unpacked
    check_against_ort(model, {"a": rng.standard_normal(a_shape).astype("float32")},
                      "cpu.matmul", disabled_passes=["pack_matmul_weights"])


@pytest.mark.parametrize("s,transpose", [(197, False), (197, True), (77, True), (1, False),
                                         (50, False), (128, True)])
def test_numerics_attention_scores_vs_ort(s, transpose):
    """Q @ K^T (K given [h, d, S], or [h, S, d] through a Transpose node) * scale + mask, both
    operands activations, against onnxruntime."""
    rng = np.random.default_rng(0)
    k_shape = (4, s, 32) if transpose else (4, 32, s)
    nodes = []
    kname = "k"
    if transpose:
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="tr"))
        kname = "kt"
    nodes += [helper.make_node("MatMul", ["q", kname], ["m"], name="mm"),
              helper.make_node("Mul", ["m", "scale"], ["sm"], name="scale_mul"),
              helper.make_node("Add", ["sm", "mask"], ["y"], name="mask_add")]
    m = 1 if s == 1 else s
    model = onnx_model(nodes, [("q", (4, m, 32)), ("k", k_shape)], [("y", (4, m, s))],
                       {"scale": np.array(0.125, "float32"),
                        "mask": rng.standard_normal((m, s)).astype("float32")})
    check_against_ort(model, {"q": rng.standard_normal((4, m, 32)).astype("float32"),
                              "k": rng.standard_normal(k_shape).astype("float32")},
                      "cpu.matmul")


def test_structure_symbolic_seq_pads_a_once_per_head():
    """Q K^T with a symbolic seq: A's rows are padded once per (batch, head), not once per
    column tile (seq / 16 copies); the heads are the parallel loop."""
    from tvm import tirx

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    f = fused_primfunc(lambda bb, q, k, m: bb.emit(relax.op.add(relax.op.matmul(q, k), m)),
                       [(b, 12, s, 64), (b, 12, 64, s), (b, 1, s, s)], "matmul")
    text = Matmul().apply(f, TARGET).mod["main"].script()
    assert "in T.parallel(batch * T.int64(12))" in text
    head, rest = text.split("in T.parallel(batch * T.int64(12))", 1)
    # the A pad is the first block under the head loop, before the column-tile loop
    assert rest.index('T.sblock("p0_pad")') < rest.index("for i3_0 in range(")


def test_numerics_symbolic_attention_scores_vs_ort():
    from tests.conftest import assert_close, ort_run

    import compiler

    model = onnx_model(
        [helper.make_node("MatMul", ["q", "k"], ["qk"], name="qk"),
         helper.make_node("Add", ["qk", "m"], ["y"], name="mask")],
        [("q", ["batch", 4, "seq", 8]), ("k", ["batch", 4, 8, "seq"]),
         ("m", ["batch", 1, "seq", "seq"])], [("y", ["batch", 4, "seq", "seq"])])
    cm = compiler.compile(model, dims={"batch": (1, 2), "seq": (1, 40)})
    assert isinstance(cm, compiler.CompiledModel)
    assert cm.report["schedules"].get("cpu.matmul") == 1, cm.report["schedules"]
    sess = cm.session()
    rng = np.random.default_rng(0)
    for b, s in [(1, 1), (2, 5), (1, 17), (2, 40)]:
        feeds = {"q": rng.standard_normal((b, 4, s, 8)).astype("float32"),
                 "k": rng.standard_normal((b, 4, 8, s)).astype("float32"),
                 "m": rng.standard_normal((b, 1, s, s)).astype("float32")}
        assert_close(sess.run(None, feeds), ort_run(model, feeds))


def _decode_scores(heads: int, head_dim: int):
    """Decoding's Q K^T * scale + mask over a symbolic key length ``n``, the key cache
    [heads, n, head_dim] read transposed in place (as after fold_transpose_matmul)."""
    from tvm import tirx

    h, d = (tirx.IntImm("int64", x) for x in (heads, head_dim))  # int64 like the importer's
    return _bmm((h, tirx.IntImm("int64", 1), d), (h, tirx.Var("n", "int64"), d),
                transposed=True)[0]


@pytest.mark.parametrize("target", [TARGET, AVX2], ids=["znver5", "znver3"])
def test_structure_decode_scores_dot_rows(target):
    """One query row against the key cache: a dot product per key (vector FMAs into a
    register accumulator, rfactor over the lanes), the cache read in place (no padded,
    transposed panel), the scale + mask applied per key inside the heads' parallel loop."""
    lanes = targets.cpu_facts(target)["lanes"]
    text = Matmul().apply(_decode_scores(12, 64), target).mod["main"].script()
    assert "_pad" not in text and "_rf_local" in text
    assert lanes in _widths(text, "vectorized")
    assert text.count("T.parallel(") == 1 and re.search(r"T\.parallel\((T\.int64\()?12\)", text)
    # one head: the keys are split in blocks of DOT_ROWS for the cores
    from schedules.cpu.matmul import DOT_ROWS

    # a head_dim of one vector (LLaMA-tiny's 8 on AVX2): the k-block loop is a unit loop
    text = Matmul().apply(_decode_scores(12, lanes), target).mod["main"].script()
    assert "_pad" not in text and "_rf_local" in text
    text = Matmul().apply(_decode_scores(1, 64), target).mod["main"].script()
    assert "_pad" not in text and "T.parallel(" in text
    assert re.search(rf"\b{DOT_ROWS}\b", text.split("T.parallel(", 1)[1])


def test_structure_decode_dot_rows_negative():
    """Not dot rows: a head_dim that is no whole number of vectors (12 on AVX2's 8 lanes,
    the padded panel path), or more than one query row."""
    text = Matmul().apply(_decode_scores(12, 12), AVX2).mod["main"].script()
    assert "_rf_local" not in text and "_pad" in text
    f, _ = _bmm((12, 2, 64), (12, 197, 64), transposed=True)
    assert "_rf_local" not in Matmul().apply(f, AVX2).mod["main"].script()


def test_structure_decode_values_symbolic_k():
    """P V over a symbolic key length (one row): B streamed row by row, vector over N, no
    padding (the reduction over the symbolic K taken as it is)."""
    from tvm import tirx

    n = tirx.Var("n", "int64")
    f = fused_primfunc(lambda bb, p, v: bb.emit(relax.op.matmul(p, v)),
                       [(12, 1, n), (12, n, 64)], "matmul")
    text = Matmul().apply(f, AVX2).mod["main"].script()
    assert "_pad" not in text and "T.parallel(T.int64(12))" in text
    assert 8 in _widths(text, "vectorized") and "matmul_global" in text


def test_numerics_decode_attention_symbolic_past_vs_ort():
    """Decode attention over a symbolic past (one query row, 4 heads of 16): Q K^T * scale
    + mask as dot rows, softmax, P V streamed; against onnxruntime at past 1 .. 64."""
    from tests.conftest import assert_close, ort_run

    import compiler

    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["qk"], name="qk"),
             helper.make_node("Mul", ["qk", "scale"], ["s"], name="scale"),
             helper.make_node("Add", ["s", "m"], ["sm"], name="mask"),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    model = onnx_model(nodes, [("q", [1, 4, 1, 16]), ("k", [1, 4, "past", 16]),
                               ("v", [1, 4, "past", 16]), ("m", [1, 1, 1, "past"])],
                       [("y", [1, 4, 1, 16])], {"scale": np.array(0.25, "float32")})
    cm = compiler.compile(model, dims={"past": (1, 64)})
    assert isinstance(cm, compiler.CompiledModel)
    assert cm.report["schedules"].get("cpu.matmul") == 2, cm.report["schedules"]
    sess = cm.session()
    rng = np.random.default_rng(0)
    for past in (1, 7, 33, 64):
        feeds = {"q": rng.standard_normal((1, 4, 1, 16)).astype("float32"),
                 "k": rng.standard_normal((1, 4, past, 16)).astype("float32"),
                 "v": rng.standard_normal((1, 4, past, 16)).astype("float32"),
                 "m": rng.standard_normal((1, 1, 1, past)).astype("float32")}
        assert_close(sess.run(None, feeds), ort_run(model, feeds))


def _seq_scores(opt):
    """Q K^T * scale + mask with a symbolic query count ``seq`` and key count ``n``, the
    kernel annotated with seq's opt as compile_static() does (None: no annotation)."""
    from tvm import tirx

    from compiler.lowering.symbolic import DIM_OPT_ATTR

    h, d = (tirx.IntImm("int64", x) for x in (12, 64))
    seq, n = tirx.Var("seq", "int64"), tirx.Var("n", "int64")
    f = _bmm((h, seq, d), (h, n, d), transposed=True)[0]
    return f if opt is None else f.with_attr(DIM_OPT_ATTR, {"seq": opt, "n": 512})


def test_structure_symbolic_rows_at_opt_one_are_dot_rows():
    """A decoder compiled with seq's opt 1 (its one-token steps): the symbolic query rows
    take the one-row schedule; opt 128 or no annotation keep the padded register tiles."""
    assert "_rf_local" in Matmul().apply(_seq_scores(1), AVX2).mod["main"].script()
    for opt in (128, None):
        text = Matmul().apply(_seq_scores(opt), AVX2).mod["main"].script()
        assert "_rf_local" not in text and "_pad" in text


def test_numerics_decoder_attention_seq_opt_one_vs_ort():
    """Attention of a decoder step, queries ``seq`` (opt 1) against ``total`` keys: the
    one-row schedules, also at a prefill of several rows, against onnxruntime."""
    from tests.conftest import assert_close, ort_run

    import compiler

    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["qk"], name="qk"),
             helper.make_node("Add", ["qk", "m"], ["sm"], name="mask"),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    model = onnx_model(nodes, [("q", [1, 4, "seq", 16]), ("k", [1, 4, "total", 16]),
                               ("v", [1, 4, "total", 16]), ("m", [1, 1, "seq", "total"])],
                       [("y", [1, 4, "seq", 16])])
    cm = compiler.compile(model, dims={"seq": (1, 8, 1), "total": (1, 64)})
    assert isinstance(cm, compiler.CompiledModel)
    assert cm.report["schedules"].get("cpu.matmul") == 2, cm.report["schedules"]
    sess = cm.session()
    rng = np.random.default_rng(0)
    for seq, total in ((1, 1), (1, 40), (5, 5), (8, 64)):
        feeds = {"q": rng.standard_normal((1, 4, seq, 16)).astype("float32"),
                 "k": rng.standard_normal((1, 4, total, 16)).astype("float32"),
                 "v": rng.standard_normal((1, 4, total, 16)).astype("float32"),
                 "m": rng.standard_normal((1, 1, seq, total)).astype("float32")}
        assert_close(sess.run(None, feeds), ort_run(model, feeds))


def _seq_major(kind: str, heads: int, kv_heads: int, head_dim: int, rows: int = 1):
    """passes/seq_major_cache.py's attention matmuls over a sequence-major cache
    [n, 1, kv_heads, head_dim] (symbolic n): ``scores`` reads it at [j, b, h // rep, k],
    ``context`` at [k, b, h // rep, j]."""
    from tvm import tirx

    from passes.seq_major_cache import context_sm, scores_sm

    i64 = lambda x: tirx.IntImm("int64", x)  # noqa: E731  (the importer's int64 extents)
    n = tirx.Var("n", "int64")
    cache = te.placeholder((n, i64(1), i64(kv_heads), i64(head_dim)), name="cache")
    width = head_dim if kind == "scores" else n
    a = te.placeholder((i64(1), i64(heads), i64(rows), width), name="a")
    fn = scores_sm if kind == "scores" else context_sm
    return te.create_prim_func([a, cache, fn(a, cache, heads // kv_heads)])


@pytest.mark.parametrize("kv_heads", [12, 4], ids=["mha", "gqa"])
def test_structure_seq_major_cache_one_row(kv_heads):
    """A sequence-major cache (GQA's h // rep included) takes the one-row schedules: dot
    rows for Q K^T, rows streamed for P V; the cache read in place, no padded panel."""
    text = Matmul().apply(_seq_major("scores", 12, kv_heads, 64), AVX2).mod["main"].script()
    assert "_pad" not in text and "_rf_local" in text and 8 in _widths(text, "vectorized")
    text = Matmul().apply(_seq_major("context", 12, kv_heads, 64), AVX2).mod["main"].script()
    assert "_pad" not in text and "context_sm_global" in text  # the row block, streamed
    assert 8 in _widths(text, "vectorized") and "_rf_local" not in text


def test_structure_seq_major_cache_many_rows_left_to_next_rule():
    """Several query rows over a sequence-major cache: the padded tiles copy B's panels as
    [.., j, k] / [.., k, j], so the rule declines (None: the next rule takes it)."""
    assert Matmul().apply(_seq_major("scores", 4, 4, 16, rows=3), AVX2) is None


@pytest.mark.parametrize("n,d", [(37, 16), (21, 8), (21, 40)])
def test_numerics_seq_major_cache_vs_numpy(n, d):
    """Scheduled scores and context kernels over a GQA sequence-major cache against numpy
    (head sizes 8 and 40: half-vectors on AVX-512, the one-row schedules in 8 lanes)."""
    rng = np.random.default_rng(5)
    heads, kvh = 4, 2
    cache = rng.standard_normal((n, 1, kvh, d)).astype(np.float32)
    heads_view = np.repeat(cache.transpose(1, 2, 0, 3), heads // kvh, axis=1)  # [1, H, n, d]
    target = targets.resolve("host").tvm_target()
    for kind, width in (("scores", d), ("context", n)):
        sch = Matmul().apply(_seq_major(kind, heads, kvh, d), target)
        assert sch is not None
        lib = tvm.compile(sch.mod, target=target)
        a = rng.standard_normal((1, heads, 1, width)).astype(np.float32)
        want = a @ (heads_view.transpose(0, 1, 3, 2) if kind == "scores" else heads_view)
        out = tvm.runtime.empty(want.shape, "float32")
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(cache), out)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim", [8, 40])
def test_structure_decode_half_vectors_on_avx512(head_dim):
    """A head size that is half-vectors on AVX-512 (8, 40: not a multiple of 16) still takes
    the one-row schedules, in 8-lane vectors: dot rows for Q K^T (also over a seq-major
    cache), rows for P V; before, the fallback took them on AVX-512 hosts only."""
    text = Matmul().apply(_decode_scores(12, head_dim), TARGET).mod["main"].script()
    assert "_pad" not in text and "_rf_local" in text and 8 in _widths(text, "vectorized")
    for kind in ("scores", "context"):
        sch = Matmul().apply(_seq_major(kind, 4, 2, head_dim), TARGET)
        assert sch is not None and 8 in _widths(sch.mod["main"].script(), "vectorized")
    # a width of no whole 8-lane vector is left to the padded tiles
    assert "_rf_local" not in Matmul().apply(_decode_scores(12, 12), TARGET).mod["main"].script()



@pytest.mark.parametrize("transposed", [False, True])
def test_structure_odd_n_cut_per_row_block_and_b_packed_by_panels(transposed):
    """ViT's [12, 197, 64] QK^T on AVX-512 (11 x 32 tiles): B is packed panel by panel, a
    row of jt columns one vector, the guarded last panel partitioned off; a row block's
    11 x 224 outputs (9.9 KB, under CUT_ROW_BYTES) are cut once per row block over the 197
    real columns, whole vectors then a tail (per tile, the column guard scalarised the copy)."""
    f, _ = _bmm((12, 197, 64), (12, 197, 64) if transposed else (12, 64, 197), transposed)
    text = Matmul().apply(f, TARGET).mod["main"].script()
    # 6 whole panels, each row one 32-lane vector, then the last (guarded) one
    assert re.search(r"T\.grid\(6, 64\):\s*\n\s*for \w+ in T\.vectorized\(32\)", text)
    assert "range(6, 7)" in text
    assert "T.vectorized(192, 197)" in text and "T.vectorized(64)" in text  # the cut: 3 x 64 + 5


def test_structure_wide_odd_n_keeps_the_cut_per_tile():
    """Whisper's [8, 1500, 64] QK^T: a row block's 12 x 1504 outputs outgrow CUT_ROW_BYTES,
    so the cut stays per column tile (from L1), guarded in the last tile only."""
    from schedules.cpu.matmul import CUT_ROW_BYTES

    assert 12 * 1504 * 4 > CUT_ROW_BYTES >= 11 * 224 * 4
    f, _ = _bmm((8, 1500, 64), (8, 64, 1500), False)
    text = Matmul().apply(f, TARGET).mod["main"].script()
    assert "pragma_loop_partition_hint" in text and "range(1472, 1500)" not in text
