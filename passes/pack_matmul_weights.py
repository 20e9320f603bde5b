"""matmul(x, W[K, N]) => matmul_packed(x, Wp[N/nr, K, nr]), Wp packed at compile time.

With the weight as ``N/nr`` contiguous ``K x nr`` panels, the x86 rule ``matmul_packed``
streams each panel straight from memory into its ``mr x nr`` register tile: no per-kernel
copy of a ``K x nr`` panel of W (rows ``4 N`` bytes apart: 12 KiB on BERT's 768x3072
weights, where that copy held the kernel to 74-86 GFLOP/s single core).  Fires on float32
``x[.., M, K] @ W[K, N]`` with a constant 2-D W, static shapes and ``N`` a multiple of
``panel`` (two AVX-512 vectors by default).  Emitted through ``call_te`` (a call_tir of our
own TE compute), so FoldConstant does not undo the packing, and a reduction that FuseOps
fuses bias / GELU / residual adds into.  Runs after the passes that build the matmul chains
(fuse_gelu, fuse_attention) and needs the weights folded to constants (fold_constants).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27
from tvm.relax.expr_functor import PyExprMutator, mutator

from .context import GraphPass, PassReport
from .dataflow import nodes_of

RULE = "matmul(x, W) => matmul_packed(x, [N/nr, K, nr](W))"


class PackMatmulWeights(GraphPass):
    """matmul(x, W) => matmul_packed(x, pack(W)) for float32 matmuls with constant W."""

    name = "pack_matmul_weights"
    opt_level = 2
    options = {"panel": 32}

    def rewrite(self, mod, report: PassReport, options: dict):
        m = _Pack(mod, int(options["panel"]))
        main = m.visit_expr(mod["main"])
        if not m.rewritten:
            return mod
        out = m.builder_.get()
        out["main"] = main
        out = relax.transform.DeadCodeElimination(["main"])(out)
        report.rewrites[RULE] = len(m.rewritten)
        names = report.node_names
        report.nodes = [names[k] if k < len(names) else v.name
                        for v in m.rewritten for k in nodes_of(v.name) or [len(names)]]
        return out


def matmul_packed(x, wp):
    """TE compute: ``out[.., i, j] = sum_k x[.., i, k] * wp[j // nr, k, j % nr]`` with
    ``wp`` of shape [N/nr, K, nr]."""
    *bat, m, kk = x.shape
    no, _, nr = (int(d) for d in wp.shape)
    k = te.reduce_axis((0, kk), "k")
    return te.compute(
        (*bat, m, no * nr),
        lambda *idx: te.sum(
            x[(*idx[:-1], k)] * wp[te.indexdiv(idx[-1], nr), k, te.indexmod(idx[-1], nr)],
            axis=k),
        name="matmul_packed")


def pack_kn(w: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> [N/nr, K, nr]: ``wp[jo, k, ji] = w[k, jo * nr + ji]``."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k, n // nr, nr).transpose(1, 0, 2))


@mutator
class _Pack(PyExprMutator):
    def __init__(self, mod, panel):
        super().__init__(mod)
        self.panel = panel
        self.rewritten = []

    def visit_var_binding_(self, binding):
        value = binding.value
        new = self._packed(value) if _is_matmul(value) else None
        if new is None:
            super().visit_var_binding_(binding)
            return
        # same name as the matmul it replaces: kernels keep naming their ONNX node
        new = self.builder_.normalize(new)
        cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
        var = cls(binding.var.name, new.ty)
        self.builder_.emit_normalized(relax.VarBinding(var, new))
        self.set_var_remap(binding.var, var)
        self.rewritten.append(binding.var)

    def _packed(self, call):
        x, weight = call.args
        if not isinstance(weight, GenericConst):
            return None
        out_dtype = call.attrs.out_dtype if call.attrs is not None else None
        if (str(out_dtype) if out_dtype is not None else "") not in ("", "void", "float32"):
            return None
        xt = x.ty
        w = weight.value.numpy()
        if str(xt.dtype) != "float32" or w.dtype != np.float32 or w.ndim != 2:
            return None
        if xt.ndim is None or xt.ndim < 2 or xt.shape is None or any(
                not isinstance(d, tvm.tirx.IntImm) for d in xt.shape):
            return None
        if int(xt.shape[-1]) != w.shape[0] or w.shape[1] % self.panel:
            return None
        x = self.visit_expr(x)
        wp = relax.const(pack_kn(w, self.panel))
        return self.builder_.call_te(matmul_packed, x, wp, primfunc_name_hint="matmul")


def _is_matmul(value) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.matmul")
