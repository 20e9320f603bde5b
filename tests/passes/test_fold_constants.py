"""fold_constants: op(constants) => constant."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import compiler
from tests.conftest import assert_close, ort_run


def _gemm(weight_is_constant: bool):
    """Gemm with transB=1: the importer emits permute_dims(B), foldable when B is constant."""
    b = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    inits = []
    if weight_is_constant:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 3]))
    g = helper.make_graph([helper.make_node("Gemm", ["x", "b"], ["y"], name="fc", transB=1)],
                          "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                     [2, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), b


def _report(cm):
    return next(p for p in cm.report["passes"] if p["name"] == "fold_constants")


def test_folds_constant_transpose():
    model, _ = _gemm(True)
    cm = compiler.compile(model)
    r = _report(cm)
    assert r["changed"] and r["rewrites"] == {"op(const) => const": 1}
    assert r["nodes"] == ["relax.permute_dims"]
    assert cm.report["kernels"] == 1  # the transpose no longer runs per inference
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    assert_close(cm.session().run(None, {"x": x}), ort_run(model, {"x": x}))


def test_disabled_leaves_the_transpose_and_stays_correct():
    model, _ = _gemm(True)
    cm = compiler.compile(model, disabled_passes=["fold_constants"])
    assert _report(cm)["skipped"] == "disabled"
    x = np.ones((2, 3), np.float32)
    assert_close(cm.session().run(None, {"x": x}), ort_run(model, {"x": x}))


def test_does_not_fire_when_weight_is_an_input():
    model, b = _gemm(False)
    cm = compiler.compile(model)
    assert not _report(cm)["changed"]
    x = np.ones((2, 3), np.float32)
    (y,) = cm.session().run(None, {"x": x, "b": b})
    np.testing.assert_allclose(y, x @ b.T, rtol=1e-5)


# -- the fast evaluator against TVM's FoldConstant --------------------------------------------


def _relax_module(dataflow: bool = True):
    """main(x): constants reshaped, transposed, concatenated, laid out in blocks, added and
    measured (shape_to_tensor(shape_of(W))), each result used with x."""
    import tvm
    from tvm import relax

    rng = np.random.default_rng(0)
    c = [relax.const(rng.standard_normal(s).astype(np.float32)) for s in
         [(2, 8), (8, 2), (16,), (16,), (4, 4)]]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16,), "float32"))
    with bb.function("main", [x]):
        with (bb.dataflow() if dataflow else _nothing()):
            a = bb.emit(relax.op.reshape(c[0], (16,)))                  # numpy
            b = bb.emit(relax.op.reshape(relax.op.permute_dims(c[1]), (16,)))
            t = bb.emit(relax.op.add(c[2], c[3]))                         # TVM, alone
            blk = bb.emit(relax.op.layout_transform(
                c[4], index_map=lambda i, j: (i // 2, j, i % 2)))       # numpy
            n = bb.emit(relax.op.reshape(blk, (16,)))
            cat = bb.emit(relax.op.concat([a, b], axis=0))
            shp = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(c[4])))
            y = bb.emit(relax.op.add(x, a))                               # x: not folded
            y = bb.emit(relax.op.add(y, b))
            y = bb.emit(relax.op.add(y, t))
            y = bb.emit(relax.op.add(y, n))
            y = bb.emit(relax.op.add(y, relax.op.strided_slice(cat, [0], [0], [16])))
            y = bb.emit(relax.op.add(y, relax.op.astype(relax.op.sum(shp), "float32")))
            out = bb.emit_output(y) if dataflow else y
        bb.emit_func_output(out)
    return bb.get(), tvm


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fold(mod, evaluator):
    from passes.context import PassReport
    from passes.fold_constants import FoldConstants

    report = PassReport("fold_constants")
    return FoldConstants().rewrite(mod, report, {"evaluator": evaluator}), report


def test_fast_evaluator_gives_tvms_module():
    mod, tvm = _relax_module()
    fast, report = _fold(mod, "fast")
    slow, _ = _fold(mod, "tvm")
    tvm.ir.assert_structural_equal(fast, slow, map_free_vars=True)
    # reshape x3 (one after permute_dims), permute_dims, add, layout_transform, concat,
    # shape_to_tensor, then the strided_slice / sum / astype / add chain on constants
    assert report.rewrites["op(const) => const"] >= 8
    assert {"relax.reshape", "relax.layout_transform", "relax.concat", "relax.add",
            "relax.shape_to_tensor"} <= set(report.nodes)
    from passes.relax_util import op_counts

    left = op_counts(fast)
    assert left["relax.add"] == 6  # the adds on x
    assert not {"relax.reshape", "relax.permute_dims", "relax.layout_transform",
                "relax.concat", "relax.shape_of", "relax.shape_to_tensor"} & set(left)


def _integer_module():
    """main(x): the shape arithmetic of GPT-2's / LLaMA's exports on constants (a shape
    as a tensor, take, int64 add / subtract / multiply, comparisons, where), a take with
    an index out of range, and a float add, each result used with x."""
    from tvm import relax

    def const(v, dtype="int64"):
        return relax.const(np.array(v, dtype), dtype)

    c = const([[0, 1, 2, 3]])
    three = const(3)
    big = const([2**62, 2**62])  # the add wraps around, as TVM's kernel does
    f = const(np.ones(4), "float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "int64"))
    with bb.function("main", [x]):
        with bb.dataflow():
            shp = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(c)))
            n = bb.emit(relax.op.take(shp, const(1), axis=0))
            bad = bb.emit(relax.op.take(shp, const(5), axis=0, mode="clip"))  # TVM folds it
            lt = bb.emit(relax.op.less(c, three))
            s = bb.emit(relax.op.add(c, n))
            d = bb.emit(relax.op.multiply(relax.op.subtract(c, three), s))
            w = bb.emit(relax.op.where(lt, d, s))
            o = bb.emit(relax.op.add(big, big))
            fl = bb.emit(relax.op.add(f, f))  # float: TVM's kernel
            y = bb.emit(relax.op.add(x, w))
            y = bb.emit(relax.op.add(y, n))  # a 0-d constant read by x's chain
            y = bb.emit(relax.op.add(y, relax.op.reshape(bad, (1, 1))))
            y = bb.emit(relax.op.add(y, relax.op.reshape(relax.op.sum(o), (1, 1))))
            y = bb.emit(relax.op.add(y, relax.op.astype(relax.op.reshape(fl, (1, 4)),
                                                          "int64")))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _fold_counting_builds(mod, monkeypatch):
    """The fast evaluator's fold of ``mod`` and its report, and the op of every binding
    it handed to TVM's FoldConstant (an LLVM build each)."""
    from tvm import relax

    import passes.fold_constants as fc

    built = []
    fold = relax.transform.FoldConstant

    def counting():
        inner = fold()

        def run(m):
            built.append(m["main"].body.blocks[0].bindings[0].value.op.name)
            return inner(m)
        return run

    monkeypatch.setattr(fc.relax.transform, "FoldConstant", counting)
    fast, report = _fold(mod, "fast")
    monkeypatch.undo()
    return fast, report, built


def test_integer_arithmetic_folds_in_numpy_as_tvm_folds_it(monkeypatch):
    """Integer ops on constants give TVM's module (bits included, wraparound too) without
    a TVM build; an out-of-range take still goes to TVM's FoldConstant."""
    import tvm

    mod = _integer_module()
    slow, _ = _fold(mod, "tvm")
    fast, report, built = _fold_counting_builds(mod, monkeypatch)
    tvm.ir.assert_structural_equal(fast, slow, map_free_vars=True)
    import tvm_ffi

    assert tvm_ffi.structural_hash(fast) == tvm_ffi.structural_hash(slow)  # 0-d stays 0-d
    assert {"relax.shape_to_tensor", "relax.less", "relax.where", "relax.multiply",
            "relax.subtract"} <= set(report.nodes)
    # the out-of-range take, and what reads it, were TVM's; the float add folds in numpy
    # (one IEEE operation per element: TVM's bits, test below)
    assert "relax.take" in built and "relax.add" not in built
    assert "relax.shape_to_tensor" not in built and "relax.where" not in built
    assert built.count("relax.take") == 1


def test_float_ops_and_dequantize_fold_in_numpy_as_tvm_folds_them(monkeypatch):
    """A QDQ model's constant requantisation (dequantize, multiply, round with its ties,
    max / min, casts in and out of range, float64) folds in numpy to TVM's module, bits
    included, without a TVM build; a NaN input and a division still go to TVM."""
    import numpy as np
    import tvm
    import tvm_ffi
    from tvm import relax

    rng = np.random.default_rng(0)
    a = np.concatenate([rng.standard_normal(500) * 100,
                        [2.5, -2.5, 0.5, -0.5, 1.5, -0.0, 255.4, 300.0]]).astype(np.float32)
    b = rng.standard_normal(a.shape).astype(np.float32)
    q = rng.integers(-2 ** 20, 2 ** 20, a.shape).astype(np.int32)
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            A, B = relax.const(a), relax.const(b)
            r = bb.emit(relax.op.round(relax.op.multiply(A, B)))
            m = bb.emit(relax.op.minimum(relax.op.maximum(r, relax.const(np.float32(-7.0))),
                                         relax.const(np.float32(255.0))))
            i = bb.emit(relax.op.astype(m, "int32"))                 # in range
            u = bb.emit(relax.op.astype(A, "uint8"))                 # out of range: TVM's
            d = bb.emit(relax.op.dequantize(relax.const(q), relax.const(np.float32(0.0013)),
                                            relax.const(np.int32(7)), axis=0))
            f = bb.emit(relax.op.subtract(relax.op.add(d, A), relax.op.astype(i, "float32")))
            w = bb.emit(relax.op.astype(relax.op.astype(f, "float64"), "float32"))
            n = bb.emit(relax.op.add(relax.const(np.array([np.nan, 1.0], np.float32)),
                                     relax.const(np.float32(1.0))))  # NaN: TVM's
            v = bb.emit(relax.op.divide(A, B))                       # division: TVM's
            out = bb.emit_output(relax.Tuple([w, u, n, v]))
        bb.emit_func_output(out)
    mod = bb.get()
    slow, _ = _fold(mod, "tvm")
    fast, _, built = _fold_counting_builds(mod, monkeypatch)
    tvm.ir.assert_structural_equal(fast, slow, map_free_vars=True)
    assert tvm_ffi.structural_hash(fast) == tvm_ffi.structural_hash(slow)
    assert sorted(built) == ["relax.add", "relax.astype", "relax.divide"], built


def test_nothing_folds_outside_dataflow_blocks():
    """FoldConstant folds only inside dataflow blocks; so does the fast evaluator."""
    mod, tvm = _relax_module(dataflow=False)
    fast, report = _fold(mod, "fast")
    slow, _ = _fold(mod, "tvm")
    tvm.ir.assert_structural_equal(fast, slow, map_free_vars=True)
    assert not report.rewrites


def test_unknown_evaluator_is_refused():
    import pytest

    from passes import PassConfigError

    mod, _ = _relax_module()
    with pytest.raises(PassConfigError, match="evaluator"):
        _fold(mod, "numpy")


def test_reshape_to_a_scalar_folds_to_a_0d_constant():
    # a [1] float constant reshaped to []: the fold keeps the 0-d shape (numpy's
    # ascontiguousarray made it [1], and the module no longer matched TVM's fold)
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.reshape(relax.const(np.array([2.5], np.float32)), ()))
            out = bb.emit_output(bb.emit(relax.op.add(x, s)))
        bb.emit_func_output(out)
    mod = bb.get()
    fast, report = _fold(mod, "fast")
    slow, _ = _fold(mod, "tvm")
    assert report.rewrites.get("op(const) => const", 0) == 1
    tvm.ir.assert_structural_equal(fast, slow, map_free_vars=True)
    from tvm.ir.expr import GenericConst

    consts = []
    __import__("tvm_ffi").structural_walk(fast["main"], [(GenericConst, consts.append)])
    assert [tuple(c.value.shape) for c in consts] == [()]
