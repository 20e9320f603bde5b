"""assume_dim_ranges: a kernel over symbolic dims states their ranges to TVM's lowering."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx

import targets
from compiler.lowering.assume_dim_ranges import assume_dim_ranges
from compiler.lowering.parallel_build import compile_kernels
from compiler.lowering.symbolic import DIM_RANGE_ATTR
from schedules.database import workload_hash


def _gather_by_row_tiles():
    """out[i] reads x at the (batch, row tile, column) that a fused loop over
    ``batch * ceil(n / 12) * 64`` tasks splits ``i`` into: divisions and modulos by the
    symbolic ``(n + 11) // 12``, as the matmul rules' parallel loop over a symbolic batch
    and sequence (CLIP's text MLP)."""
    batch, n = tirx.Var("batch", "int64"), tirx.Var("n", "int64")
    x = te.placeholder((batch, n, 64), name="x")
    r = (n + 11) // 12
    out = te.compute((batch * r * 64,), lambda i: x[i // (r * 64), tirx.min(i % r * 12, n - 1),
                                                    i % (r * 64) // r] * 2.0, name="out")
    return te.create_prim_func([x, out]).with_attr("global_symbol", "k")


def _reference(x):
    batch, n, _ = x.shape
    r = (n + 11) // 12
    i = np.arange(batch * r * 64)
    return x[i // (r * 64), np.minimum(i % r * 12, n - 1), i % (r * 64) // r] * 2


RANGES = {"batch": [1, 8], "n": [1, 512]}


def _lowered(func):
    """``func`` built as the compiler builds kernels; the module after ``LowerIntrin``
    as text, and the built library."""
    seen = {}

    @tvm.ir.instrument.pass_instrument
    class Keep:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.LowerIntrin":
                seen["text"] = mod.script()

    with tvm.transform.PassContext(opt_level=3, instruments=[Keep()]):
        lib = compile_kernels(tvm.IRModule({"k": func}), targets.resolve("host").tvm_target())
    return seen["text"], lib


def test_the_assert_opens_the_root_block_and_the_attribute_goes():
    f = _gather_by_row_tiles()
    mod = assume_dim_ranges(tvm.IRModule({"k": f.with_attr(DIM_RANGE_ATTR, RANGES),
                                          "plain": f}))
    k = mod["k"]
    assert DIM_RANGE_ATTR not in k.attrs
    first = k.body.block.body.seq[0]
    assert isinstance(first, tirx.AssertStmt)
    assert str(first.condition) == ("T.int64(1) <= batch and batch <= T.int64(8) and "
                                    "(T.int64(1) <= n and n <= T.int64(512))")
    assert mod["plain"].same_as(f)
    # a min above 1 is stated as 1 (TVM's interval analysis failed on some mins)
    low = assume_dim_ranges(tvm.IRModule({"k": f.with_attr(DIM_RANGE_ATTR, {"n": [5, 64]})}))
    assert str(low["k"].body.block.body.seq[0].condition) == \
        "T.int64(1) <= n and n <= T.int64(64)"


def test_the_lowering_knows_the_range():
    """Stated, the divisions lower as plain truncated ones; unstated, TVM writes its
    sign-agnostic Select form (the control: the test can fail).  The kernel computes the
    same at the range's edges and between."""
    f = _gather_by_row_tiles()
    plain, _ = _lowered(f)
    ranged, lib = _lowered(f.with_attr(DIM_RANGE_ATTR, RANGES))
    assert "T.Select" in plain
    assert "T.Select" not in ranged and "T.Div(" in ranged
    dev = tvm.cpu()
    for batch, n in ((1, 1), (3, 13), (8, 512)):
        x = np.random.default_rng(n).standard_normal((batch, n, 64)).astype(np.float32)
        want = _reference(x)
        out = tvm.runtime.tensor(np.zeros(want.shape, np.float32), dev)
        lib["k"](tvm.runtime.tensor(x, dev), out)
        np.testing.assert_array_equal(out.numpy(), want)


def test_tuning_keys_ignore_the_ranges():
    f = _gather_by_row_tiles()
    assert workload_hash(f.with_attr(DIM_RANGE_ATTR, RANGES)) == workload_hash(f)


def test_a_build_that_fails_with_the_ranges_is_built_without_them(monkeypatch):
    """The ranges only speed the lowering up: where TVM fails with them known (its interval
    analysis crashed on a resize kernel's float((w - 1) >> 1) with w >= 5 stated), the
    kernels are built as before."""
    real = tvm.compile
    tried = []

    def fussy(mod, target=None, **kw):
        stated = "assert" in mod.script()
        tried.append(stated)
        if stated:
            raise tvm.error.InternalError("IntImm supports only int or uint or bool type")
        return real(mod, target=target, **kw)

    monkeypatch.setattr(tvm, "compile", fussy)
    f = _gather_by_row_tiles().with_attr(DIM_RANGE_ATTR, RANGES)
    with tvm.transform.PassContext(opt_level=3):
        lib = compile_kernels(tvm.IRModule({"k": f}), targets.resolve("host").tvm_target())
    assert tried == [True, False]
    x = np.random.default_rng(0).standard_normal((2, 30, 64)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(_reference(x).shape, np.float32), tvm.cpu())
    lib["k"](tvm.runtime.tensor(x, tvm.cpu()), out)
    np.testing.assert_array_equal(out.numpy(), _reference(x))
