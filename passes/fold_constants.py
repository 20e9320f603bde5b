"""op(constants) => constant: evaluate every binding whose inputs are all constants.

Runs first: ONNX exports carry weight reshapes, casts and shape arithmetic on initializers
that would otherwise become kernels run on every inference.

The result is what TVM's ``relax.transform.FoldConstant`` gives (same IR, same values), at
a fraction of its cost.  FoldConstant legalizes *every* op call of the graph to see whether
it can fold it (4 s on DenseNet-121, where nothing but 60 bias reshapes folds) and builds
one LLVM module per distinct folded kernel (0.2 s each).  Here:

* data movement on constants (reshape, permute_dims, expand_dims, squeeze, flatten,
  concat, layout_transform) is evaluated with numpy: it moves bytes, so the values are
  those TVM's kernel would write;
* integer / bool arithmetic, comparisons, ``where``, in-range ``take`` and
  ``shape_to_tensor`` on constants (transformer exports' position and mask shape
  arithmetic: each was a 0.06-0.1 s LLVM build) are evaluated with numpy too: integer
  results are exact, so they are TVM's bits;
* any other op whose inputs are all constants is handed to FoldConstant alone, in a
  one-binding function, so only that call is legalized and built;
* as FoldConstant does, only inside dataflow blocks, with variables bound to constants
  (or, in op arguments, to shapes) replaced by their values and unused bindings removed.

Option ``evaluator``: ``fast`` (the above) or ``tvm`` (FoldConstant over the whole module,
for comparison: tests/passes/test_fold_constants.py checks both give the same module).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27
from tvm.relax.expr_functor import PyExprMutator, mutator

from .context import GraphPass, PassConfigError, PassReport
from .relax_util import apply_index_map, op_counts

# dtypes numpy holds natively (bfloat16, float8, ... constants go through TVM)
_NUMPY_DTYPES = {"bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
                 "uint8", "uint16", "uint32", "uint64"}


class FoldConstants(GraphPass):
    name = "fold_constants"
    opt_level = 1
    options = {"evaluator": "fast"}

    def rewrite(self, mod, report: PassReport, options: dict):
        evaluator = str(options["evaluator"])
        if evaluator == "tvm":
            return _fold_with_tvm(mod, report)
        if evaluator != "fast":
            raise PassConfigError(f"fold_constants: evaluator {evaluator!r} is not one of "
                                  "'fast', 'tvm'")
        out = mod
        folded: dict = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            folder = _ConstantFolder(out)
            new = relax.analysis.remove_all_unused(folder.visit_expr(func))
            out = folder.builder_.get()  # holds the PrimFuncs of the original module
            out[gv] = new
            for op, n in folder.folded.items():
                folded[op] = folded.get(op, 0) + n
        if folded:
            report.rewrites["op(const) => const"] = sum(folded.values())
            report.nodes = sorted(folded)
        return out


def _fold_with_tvm(mod, report: PassReport):
    """TVM's FoldConstant over the whole module (the reference the fast path matches)."""
    before = op_counts(mod)
    mod = relax.transform.FoldConstant()(mod)
    after = op_counts(mod)
    folded = {op: before[op] - after.get(op, 0) for op in before
              if after.get(op, 0) < before[op]}
    if folded:
        report.rewrites["op(const) => const"] = sum(folded.values())
        report.nodes = sorted(folded)
    return mod


@mutator
class _ConstantFolder(PyExprMutator):
    """FoldConstant's walk: post-order, substituting constants, folding in dataflow blocks."""

    def __init__(self, mod):
        super().__init__(mod)
        self.mod = mod
        self.folded: dict = {}  # op name -> calls folded

    def visit_var_(self, var):
        bound = self.lookup_binding(var)
        return bound if isinstance(bound, GenericConst) else super().visit_var_(var)

    def visit_dataflow_var_(self, var):
        bound = self.lookup_binding(var)
        return bound if isinstance(bound, GenericConst) else super().visit_dataflow_var_(var)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name == "relax.call_tir":
            return self._fold_call_tir(call)
        args = [self._shape_of_var(a) for a in call.args]
        if any(not a.same_as(b) for a, b in zip(args, call.args)):
            call = relax.Call(call.op, args, call.attrs, call.ty_args, call.span)
        if not self.builder_.current_block_is_dataflow():
            return call
        # a variable of a known shape (shape_of a constant) counts as that shape, as it
        # does when FoldConstant normalizes the call (shape_to_tensor(shape_of(W)) folds)
        known = [_known_shape(a) for a in args]
        if not all(map(_is_const, known)):
            return call
        value = _numpy_eval(call)
        if value is None:
            value = _integer_eval(call, known)
        if value is None:
            value = _dequantize_eval(call, known)
        if value is None:
            value = _float_eval(call, known)
        if value is None:
            same = all(k.same_as(a) for k, a in zip(known, args))
            value = self._tvm_eval(call if same else
                                   relax.Call(call.op, known, call.attrs, call.ty_args))
        if value is None:
            return call
        self.folded[call.op.name] = self.folded.get(call.op.name, 0) + 1
        return value

    def _shape_of_var(self, arg):
        """A variable bound to a shape, as FoldConstant passes it: the shape itself."""
        if isinstance(arg, relax.Var):
            bound = self.lookup_binding(arg)
            if isinstance(bound, relax.ShapeExpr):
                return bound
        return arg

    def _fold_call_tir(self, call):
        """call_tir on constants (custom TE ops): FoldConstant folds those too."""
        if (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"
                and self.builder_.current_block_is_dataflow()
                and all(map(_is_const, call.args[1:]))):
            value = self._tvm_eval(call)
            if value is not None:
                self.folded[call.op.name] = self.folded.get(call.op.name, 0) + 1
                return value
        return call

    def _tvm_eval(self, call):
        """FoldConstant on a function holding only ``call``: its constant, or None."""
        funcs = {gv: f for gv, f in self.mod.functions.items() if isinstance(f, tirx.PrimFunc)}
        bb = relax.BlockBuilder(tvm.IRModule(funcs))
        with bb.function("main", []):
            with bb.dataflow():
                out = bb.emit_output(call)
            bb.emit_func_output(out)
        folded = relax.transform.FoldConstant()(bb.get())["main"].body
        while isinstance(folded, relax.SeqExpr):
            folded = folded.body
        return folded if isinstance(folded, (GenericConst, relax.ShapeExpr)) else None


def _known_shape(e):
    """``e``, or the ShapeExpr of a shape-typed variable whose values are all known."""
    if isinstance(e, relax.Var) and isinstance(e.ty, relax.ShapeType):
        values = getattr(e.ty, "values", None)
        if values is not None and all(isinstance(v, tirx.IntImm) for v in values):
            return relax.ShapeExpr(values)
    return e


def _is_const(e) -> bool:
    if isinstance(e, relax.ShapeExpr):
        return all(isinstance(v, tirx.IntImm) for v in e.values)
    if isinstance(e, relax.Tuple):
        return all(_is_const(f) for f in e.fields)
    return isinstance(e, tvm.ir.expr.Constant) or isinstance(e, tvm.ir.GlobalVar)


def _numpy_eval(call):
    """The constant a data-movement op on constants produces, or None (not one of those,
    a dtype numpy does not hold, a shape that is not static)."""
    fn = _NUMPY_OPS.get(call.op.name)
    ty = call.ty
    if fn is None or not isinstance(ty, relax.TensorType) or str(ty.dtype) not in _NUMPY_DTYPES:
        return None
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    shape = tuple(int(v.value) for v in values)
    tensors = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else [call.args[0]]
    if not all(isinstance(t, GenericConst) and str(t.ty.dtype) == str(ty.dtype)
               for t in tensors):
        return None
    try:
        out = fn(call, [t.value.numpy() for t in tensors], shape)
    except ValueError:  # e.g. a layout_transform that pads
        return None
    if out.shape != shape:
        return None
    # reshape: ascontiguousarray makes a 0-d array 1-d (a reshape to a scalar)
    return relax.const(np.ascontiguousarray(out).reshape(shape), str(ty.dtype))


def _integer_eval(call, args):
    """The constant an integer / bool op on constants (shape arithmetic: GPT-2's and
    LLaMA's position and mask computations) produces, or None.  Integer and comparison
    arithmetic is exact, so numpy gives the bits TVM's kernel would (two's complement
    wraparound included); ``take`` only with every index in range (TVM's out-of-range
    behaviour depends on its mode).  ``args``: the call's arguments, shapes as ShapeExprs."""
    fn = _INTEGER_OPS.get(call.op.name)
    ty = call.ty
    if fn is None or not isinstance(ty, relax.TensorType) or str(ty.dtype) not in _INTEGER_DTYPES:
        return None
    values = getattr(getattr(ty, "shape", None), "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    xs = []
    for a in args:
        if isinstance(a, relax.ShapeExpr):
            xs.append(np.array([int(v.value) for v in a.values], np.int64))
        elif isinstance(a, GenericConst) and str(a.ty.dtype) in _INTEGER_DTYPES:
            xs.append(a.value.numpy())
        else:
            return None
    with np.errstate(over="ignore"):
        out = fn(call, xs)
    return _typed_const(out, ty)


def _typed_const(out, ty):
    """``out`` (a numpy result, or None) as the constant of the call's type ``ty``, or None
    when its shape or dtype differs from it."""
    values = getattr(getattr(ty, "shape", None), "values", None)
    if out is None or values is None:
        return None
    out = np.asarray(out)
    if out.shape != tuple(int(v.value) for v in values) or str(out.dtype) != str(ty.dtype):
        return None
    # reshape: ascontiguousarray makes a 0-d array 1-d (TVM's scalar constant is 0-d)
    return relax.const(np.ascontiguousarray(out).reshape(out.shape), str(ty.dtype))


def _dequantize_eval(call, args):
    """``relax.dequantize`` of an integer constant to float32 as TVM legalizes it
    (``float32(int32(x) - zp) * scale``: an exact integer difference, then TVM's one
    float32 rounding each for the conversion and the product), or None.  QDQ transformers
    dequantize each bias and the weights their QDQ matmul does not take: ViT-B's 991
    folds, built one LLVM module per shape, took 37 s of its compile."""
    if call.op.name != "relax.dequantize" or str(call.attrs.out_dtype) != "float32":
        return None
    if not all(isinstance(a, GenericConst) for a in args) or len(args) != 3:
        return None
    x, scale, zero = (a.value.numpy() for a in args)
    if x.dtype.kind not in "iu" or zero.dtype.kind not in "iu" or scale.dtype != np.float32:
        return None
    axis = int(call.attrs.axis)
    axis = axis + x.ndim if axis < 0 else axis

    def along(v):  # a scalar, or one value per index of ``axis``
        if v.size == 1:
            return v.reshape(())
        if v.ndim != 1 or not 0 <= axis < x.ndim or v.shape[0] != x.shape[axis]:
            raise ValueError("not per axis")
        return v.reshape([-1 if d == axis else 1 for d in range(x.ndim)])

    try:
        diff = x.astype(np.int64) - along(zero).astype(np.int64)
        scale = along(scale)
    except ValueError:
        return None
    if np.abs(diff).max(initial=0) >= 2 ** 31:  # int32 in TVM: it would wrap
        return None
    return _typed_const(diff.astype(np.int32).astype(np.float32) * scale, call.ty)


def _float_eval(call, args):
    """A float32 / float64 add, subtract, multiply, maximum, minimum, round (half to even,
    as onnxc legalizes it) or cast of constants, or None.  Each is one IEEE operation per
    element (no NaN inputs; casts to integers only in range, where they truncate), so
    numpy gives TVM's bits: QDQ models requantise their constant biases and weights as
    such ops, ~900 of them in ViT-B, each an LLVM build (28 s of its compile)."""
    fn = _FLOAT_OPS.get(call.op.name)
    ty = call.ty
    if fn is None or not isinstance(ty, relax.TensorType) or str(ty.dtype) not in _NUMPY_DTYPES:
        return None
    if not args or not all(isinstance(a, GenericConst) for a in args):
        return None
    xs = [a.value.numpy() for a in args]
    if any(x.dtype.kind == "f" and (x.dtype not in (np.float32, np.float64)
                                    or np.isnan(x).any()) for x in xs):
        return None
    return _typed_const(fn(call, xs, np.dtype(str(ty.dtype))), ty)


def _float_binary(fn):
    return lambda call, xs, dtype: (fn(*xs) if len(xs) == 2 and xs[0].dtype == xs[1].dtype
                                    == dtype and dtype.kind == "f" else None)


def _cast(call, xs, dtype):
    (x,) = xs
    if dtype.kind == "f" and dtype not in (np.float32, np.float64):
        return None  # float16 / bfloat16 rounding left to TVM
    if x.dtype.kind == "f" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if x.size and not (np.isfinite(x).all() and x.min() > info.min - 1
                           and x.max() < info.max + 1):
            return None  # out of range: undefined in LLVM's fptosi
        return np.trunc(x).astype(dtype)
    if x.dtype.kind == "b" or dtype.kind == "b":
        return None
    return x.astype(dtype)


_FLOAT_OPS = {
    "relax.add": _float_binary(np.add),
    "relax.subtract": _float_binary(np.subtract),
    "relax.multiply": _float_binary(np.multiply),
    "relax.maximum": _float_binary(np.maximum),
    "relax.minimum": _float_binary(np.minimum),
    "relax.round": lambda call, xs, dtype: (np.rint(xs[0]) if len(xs) == 1 and
                                            xs[0].dtype == dtype else None),
    "relax.astype": _cast,
}


def _same_dtype(fn, kinds="iub"):
    """A binary op of operands of one dtype (relax's arithmetic does not promote) whose
    numpy kind is one of ``kinds`` (arithmetic: integers only, bool is numpy's logic)."""
    return lambda call, xs: (fn(*xs) if len(xs) == 2 and xs[0].dtype == xs[1].dtype
                             and xs[0].dtype.kind in kinds else None)


def _where(call, xs):
    if len(xs) != 3 or xs[0].dtype != np.bool_ or xs[1].dtype != xs[2].dtype:
        return None
    return np.where(*xs)


def _take(call, xs):
    if len(xs) != 2 or xs[1].dtype.kind not in "iu" or xs[0].ndim == 0:
        return None
    axis = 0 if call.attrs.axis is None else int(call.attrs.axis)
    x, idx = xs
    if call.attrs.axis is None and x.ndim != 1:
        return None
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[axis]):
        return None
    return np.take(x, idx, axis=axis)


def _shape_to_tensor(call, xs):
    return xs[0] if len(xs) == 1 else None


_INTEGER_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                   "uint64"}
_INTEGER_OPS = {
    "relax.add": _same_dtype(np.add, "iu"),
    "relax.subtract": _same_dtype(np.subtract, "iu"),
    "relax.multiply": _same_dtype(np.multiply, "iu"),
    "relax.less": _same_dtype(np.less),
    "relax.less_equal": _same_dtype(np.less_equal),
    "relax.greater": _same_dtype(np.greater),
    "relax.greater_equal": _same_dtype(np.greater_equal),
    "relax.equal": _same_dtype(np.equal),
    "relax.not_equal": _same_dtype(np.not_equal),
    "relax.where": _where,
    "relax.take": _take,
    "relax.shape_to_tensor": _shape_to_tensor,
}


def _permute(call, xs, shape):
    axes = call.attrs.axes
    return np.transpose(xs[0], None if axes is None else [int(a) for a in axes])


def _layout_transform(call, xs, shape):
    if call.attrs.pad_value is not None:
        raise ValueError("padding layout_transform")
    return apply_index_map(call.attrs.index_map, xs[0])


# reshape, flatten, squeeze and expand_dims keep the element order: the output shape (from
# the call's type) says all
_NUMPY_OPS = {
    "relax.reshape": lambda call, xs, shape: xs[0].reshape(shape),
    "relax.flatten": lambda call, xs, shape: xs[0].reshape(shape),
    "relax.squeeze": lambda call, xs, shape: xs[0].reshape(shape),
    "relax.expand_dims": lambda call, xs, shape: xs[0].reshape(shape),
    "relax.permute_dims": _permute,
    "relax.concat": lambda call, xs, shape: np.concatenate(
        xs, axis=None if call.attrs.axis is None else int(call.attrs.axis)),
    "relax.layout_transform": _layout_transform,
}
