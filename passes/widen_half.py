"""op_fp16(x) => op_fp32(x): a float16 model computes in float32 on CPU targets.

What onnxruntime's CPU execution provider does with the models its fp16 converter
(``onnxruntime.transformers.float16.convert_float_to_float16``) writes: its
InsertCastTransformer runs the fp16 nodes it has no fp16 kernel for in fp32 between casts,
and drops the cast pairs that meet.  x86 cores have no fp16 arithmetic that our rules use
(AVX512-FP16 aside, which they do not target), so fp16 kernels convert every element on
every load and store and miss every fp32 rule: MobileNetV2 fp16 ran its convs NCHW at
15-25 GFLOP/s (5-7% of peak), not blocked.  Here every float16 value of ``main`` becomes
float32 (constants widened once, ``astype(x, float16)`` read as ``astype(x, float32)``,
``float16`` dtype attributes such as ``out_dtype`` as ``float32``); float16 graph inputs
are widened where first read and float16 outputs narrowed where written, so the artifact's
signature is the model's.  Calls this pass cannot see into (other functions, ``call_tir``)
get their float16 operands back and their results widened.  The model's own fp16
roundings between layers are not kept: results are at least as accurate as onnxruntime's
and differ from them by fp16 rounding (``compiler/tools/bench.py`` ``HALF_MATCH``).

Option ``enabled`` (default on; the driver turns it off for GPU targets, whose fp16
arithmetic is native).  First in the pipeline: every later pass sees float32.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .context import GraphPass, PassReport
from .dataflow import rebind, record_bindings
from .relax_util import with_fields

RULE = "op_fp16(x) => op_fp32(x)"
HALF, FLOAT = "float16", "float32"


class WidenHalf(GraphPass):
    """op_fp16(x) => op_fp32(x)"""

    name = "widen_half"
    opt_level = 0  # a compute precision, not an optimisation to trade away: always
    options = {"enabled": True}

    def rewrite(self, mod, report: PassReport, options: dict):
        if not options["enabled"] or not _has_half(mod["main"]):
            return mod
        w = _Widen(mod, mod["main"].params)
        func = w.visit_expr(mod["main"])
        if not w.widened:
            return mod
        record_bindings(report, RULE, w.widened)
        out = w.builder_.get()
        out["main"] = func
        return relax.transform.DeadCodeElimination(["main"])(out)


def _has_half(func) -> bool:
    found = []

    def visit(e):
        if HALF in str(getattr(e, "ty", "")):
            found.append(e)
    relax.analysis.post_order_visit(func, visit)
    return bool(found)


def _is_half(ty) -> bool:
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == HALF


def _widen_ty(ty):
    """A struct info with its float16 tensors float32 (tuples field by field)."""
    if _is_half(ty):
        return relax.TensorType(ty.shape, FLOAT, ty.vdevice) if ty.shape is not None \
            else relax.TensorType(ndim=ty.ndim, dtype=FLOAT)
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([_widen_ty(f) for f in ty.fields])
    return ty


def _widen_attrs(attrs):
    """``attrs`` with every float16 dtype field float32 (out_dtype, dtype), or as given."""
    info = getattr(type(attrs), "__tvm_ffi_type_info__", None) if attrs is not None else None
    if info is None:
        return attrs
    fields = {f.name: getattr(attrs, f.name) for f in info.fields}
    half = {k: FLOAT if isinstance(v, str) else tvm.DataType(FLOAT)
            for k, v in fields.items() if isinstance(v, (tvm.DataType, str)) and str(v) == HALF}
    return with_fields(attrs, **half) if half else attrs


def _widened_scalar(e):
    """A float16 PrimValue (clip's bounds) as float32, else None."""
    if isinstance(e, tirx.FloatImm) and str(e.ty) == HALF:
        return relax.prim_value(tirx.FloatImm(FLOAT, float(e.value)))
    return None


_OPAQUE = ("relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed",
           "relax.call_tir_inplace", "relax.call_tir_with_grad")


@mutator
class _Widen(PyExprMutator):
    def __init__(self, mod, params):
        super().__init__(mod)
        self.widened: list = []   # binding names whose value now computes in fp32
        self._params = list(params)
        self._up: dict = {}       # fp16 input -> its fp32 copy

    # -- leaves ---------------------------------------------------------------------
    def visit_generic_const_(self, op):
        if _is_half(op.ty):
            return relax.const(op.value.numpy().astype(np.float32), FLOAT)
        return op

    def visit_var_(self, op):
        new = super().visit_var_(op)
        if _is_half(new.ty) and any(op.same_as(p) for p in self._params):  # where first read
            if new not in self._up:
                self._up[new] = self.builder_.emit(relax.op.astype(new, FLOAT),
                                                   name_hint=f"{new.name}_f32")
            return self._up[new]
        return new

    def visit_dataflow_var_(self, op):
        return self.visit_var_(op)

    # -- bindings -------------------------------------------------------------------
    def visit_var_binding_(self, binding):
        old_ty = binding.var.ty
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                and value.op.name not in _OPAQUE:
            new = self._widened_op(value)
        elif isinstance(value, relax.Call):
            new = self._opaque(value)
        else:
            new = self.visit_expr(value)
        new = self.builder_.normalize(new)
        if not isinstance(binding.var, relax.DataflowVar) and old_ty != new.ty:
            # a block output keeps its declared type
            new = self.builder_.normalize(self._narrowed(new, old_ty))
        if new.ty != old_ty:
            self.widened.append(binding.var.name)
        if isinstance(new, relax.Var) and isinstance(binding.var, relax.DataflowVar):
            self.set_var_remap(binding.var, new)  # astype(x32, float32): x32 itself
            return
        rebind(self, binding, new)

    def visit_match_cast_(self, binding):
        value = self.visit_expr(binding.value)
        ty = _widen_ty(binding.ty)
        cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
        var = cls(binding.var.name, ty)
        self.builder_.emit_normalized(relax.MatchCast(var, value, ty))
        self.set_var_remap(binding.var, var)

    def _widened_op(self, call):
        args = [w if (w := _widened_scalar(a)) is not None else self.visit_expr(a)
                for a in call.args]
        if call.op.name == "relax.astype" and str(call.attrs.dtype) == HALF:
            x = args[0]
            if str(getattr(x.ty, "dtype", "")) == FLOAT:
                return x  # the model's rounding to fp16: computed in fp32, dropped
            return relax.op.astype(x, FLOAT)
        ty_args = [_widen_ty(t) for t in call.ty_args]
        return relax.Call(call.op, args, _widen_attrs(call.attrs), ty_args)

    def _opaque(self, call):
        """A call whose callee keeps float16: float16 operands back, results widened."""
        args = [self._narrowed(self.visit_expr(a), a.ty) for a in call.args]
        out = relax.Call(self.visit_expr(call.op), args, call.attrs, call.ty_args)
        if _is_half(call.ty):
            return relax.op.astype(self.builder_.emit(out), FLOAT)
        return out

    def _narrowed(self, expr, ty):
        """``expr`` (widened) cast back to ``ty`` where ``ty`` holds float16 tensors."""
        if _is_half(ty) and not _is_half(expr.ty):
            return relax.op.astype(expr, HALF)
        if isinstance(ty, relax.TupleType) and ty != expr.ty:
            expr = self.builder_.emit(expr) if not isinstance(expr, relax.Var) else expr
            return relax.Tuple([self.builder_.normalize(self._narrowed(
                self.builder_.emit(relax.TupleGetItem(expr, i)), f))
                for i, f in enumerate(ty.fields)])
        return expr
