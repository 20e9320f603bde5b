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
    return relax.const(np.ascontiguousarray(out), str(ty.dtype))


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
    if out is None:
        return None
    out = np.asarray(out)
    if out.shape != tuple(int(v.value) for v in values) or str(out.dtype) != str(ty.dtype):
        return None
    # reshape: ascontiguousarray makes a 0-d array 1-d (TVM's scalar constant is 0-d)
    return relax.const(np.ascontiguousarray(out).reshape(out.shape), str(ty.dtype))


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
