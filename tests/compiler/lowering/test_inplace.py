"""In-place analysis: which outputs may overwrite which inputs."""

from __future__ import annotations

from tvm import te, topi

from compiler.lowering.inplace import inplace_candidates


def test_elementwise_and_residual():
    a = te.placeholder((4, 16), name="a")
    r = te.placeholder((4, 16), name="r")
    out = te.compute((4, 16), lambda i, j: te.max(a[i, j], 0.0) + r[i, j], name="out")
    assert inplace_candidates(te.create_prim_func([a, r, out]), 2) == [(0, 0), (1, 0)]


def test_transpose_is_not_in_place():
    a = te.placeholder((4, 16), name="a")
    t = te.compute((16, 4), lambda i, j: a[j, i], name="t")
    assert inplace_candidates(te.create_prim_func([a, t]), 1) == []


def test_square_transpose_is_not_in_place():
    a = te.placeholder((8, 8), name="a")
    t = te.compute((8, 8), lambda i, j: a[j, i], name="t")
    assert inplace_candidates(te.create_prim_func([a, t]), 1) == []


def test_softmax_reads_rows_repeatedly():
    a = te.placeholder((4, 16), name="a")
    assert inplace_candidates(te.create_prim_func([a, topi.nn.softmax(a)]), 1) == []


def test_broadcast_input_is_not_in_place():
    a = te.placeholder((4, 16), name="a")
    b = te.placeholder((16,), name="b")
    out = te.compute((4, 16), lambda i, j: a[i, j] + b[j], name="out")
    assert inplace_candidates(te.create_prim_func([a, b, out]), 2) == [(0, 0)]


def test_input_read_by_an_intermediate_block_is_refused():
    a = te.placeholder((4, 16), name="a")
    c = te.compute((4, 16), lambda i, j: a[i, j] * 2, name="c")
    d = te.compute((4, 16), lambda i, j: c[i, j] + a[i, j], name="d")
    assert inplace_candidates(te.create_prim_func([a, d]), 1) == []


def test_dtype_mismatch():
    a = te.placeholder((4,), name="a", dtype="float32")
    out = te.compute((4,), lambda i: a[i].astype("float16"), name="out")
    assert inplace_candidates(te.create_prim_func([a, out]), 1) == []
