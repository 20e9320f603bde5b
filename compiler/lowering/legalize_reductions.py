"""Float max/min reductions with -inf/+inf as their identity.

TVM 0.27 legalizes ``relax.max`` / ``relax.min`` with ``topi.max`` / ``topi.min``, whose
reducer starts from the lowest / highest *finite* value of the dtype: the max of a row that
is all ``-inf`` comes out as ``-3.4028235e38`` (float32), not ``-inf``.  ONNX (numpy) gives
``-inf``, and graphs rely on it: the expanded ONNX ``Attention`` function decides which
rows are fully masked with ``Equal(ReduceMax(bias), -inf)``, which then never holds, and the
masked rows came out NaN instead of 0.  ``ReduceMax`` over an all ``-inf`` slice was wrong
the same way.

This module replaces the legalization of both ops, for float dtypes, by a TE reduction
whose identity is -inf (max) / +inf (min); integer dtypes and empty reductions keep TVM's.
It is registered on the ops themselves (``FLegalize``), so that constant folding (which
legalizes with the registered functions) and the lowering agree; ``compiler.lowering.install``
installs it.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx

_ATTR = "FLegalize"


def _axes(axis, ndim: int) -> list[int]:
    if axis is None:
        return list(range(ndim))
    out = []
    for a in axis:
        a = int(a.value) if isinstance(a, tirx.IntImm) else int(a)
        out.append(a + ndim if a < 0 else a)
    return sorted(set(out))


def _te_reduce(kind: str):
    def compute(x, axis, keepdims):
        ndim = len(x.shape)
        axes = _axes(axis, ndim)
        inf = float("inf") if kind == "min" else float("-inf")
        combine = tirx.min if kind == "min" else tirx.max
        reducer = te.comm_reducer(lambda a, b: combine(a, b),
                                  lambda t: tirx.const(inf, t), name=f"{kind}_inf")
        rvars = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
        if keepdims:
            out_shape = [1 if i in axes else x.shape[i] for i in range(ndim)]
        else:
            out_shape = [x.shape[i] for i in range(ndim) if i not in axes]

        def body(*idx):
            it, rit, full = iter(idx), iter(rvars), []
            for i in range(ndim):
                if i in axes:
                    full.append(next(rit))
                    if keepdims:
                        next(it)
                else:
                    full.append(next(it))
            return reducer(x[tuple(full)], axis=rvars)

        return te.compute(out_shape, body, name=f"{kind}_red", tag="comm_reduce")

    return compute


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def _has_zero_dim(call) -> bool:
    values = getattr(call.args[0].ty.shape, "values", None) or []
    return any(isinstance(v, tirx.IntImm) and int(v.value) == 0 for v in values)


def _install_one(op_name: str, kind: str) -> None:
    op = tvm.ir.Op.get(op_name)
    default = op.get_attr(_ATTR)
    if getattr(default, "__onnxc_inf_identity__", False):
        return  # already installed (module reloaded)
    compute = _te_reduce(kind)

    def legalize(bb, call):
        dtype = str(call.args[0].ty.dtype)
        if not _is_float(dtype) or _has_zero_dim(call):
            return default(bb, call)
        return bb.call_te(compute, call.args[0], call.attrs.axis, call.attrs.keepdims,
                          primfunc_name_hint=kind)

    legalize.__onnxc_inf_identity__ = True
    tvm.ir.register_op_attr(op_name, _ATTR, legalize, level=11)



def install() -> None:
    """Register the +-inf-identity legalization on ``relax.max`` and ``relax.min`` (once)."""
    _install_one("relax.max", "max")
    _install_one("relax.min", "min")
