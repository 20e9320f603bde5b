"""Float max/min (and argmax/argmin) reductions with ONNX's identity and onnxruntime's NaN rule.

TVM 0.27 legalizes ``relax.max`` / ``relax.min`` with ``topi.max`` / ``topi.min``, whose
reducer starts from the lowest / highest *finite* value of the dtype: the max of a row that
is all ``-inf`` comes out as ``-3.4028235e38`` (float32), not ``-inf``.  ONNX (numpy) gives
``-inf``, and graphs rely on it: the expanded ONNX ``Attention`` function decides which
rows are fully masked with ``Equal(ReduceMax(bias), -inf)``, which then never holds, and the
masked rows came out NaN instead of 0.  ``ReduceMax`` over an all ``-inf`` slice was wrong
the same way.

TVM's reducer also drops or keeps a NaN by its position in the loop order (issue #17).
This module replaces the legalization of both ops, for float dtypes, by onnxruntime's fold
(``compiler/lowering/nan_reducers.py``):

* ``max(x) => fold(acc = -inf; acc = (v > acc or isnan(v)) ? v : acc)`` over
  ``v = (k > 0 and isnan(x[k])) ? -inf : x[k]``  (min alike)

(``k > 0``: any reduced index past the slice's first element): a leading NaN wins and
stays, any other NaN is skipped, an all ``-inf`` slice gives ``-inf`` (TVM's reducer starts
from the lowest finite value).  One reduction block, correct in any loop order (a second
block selecting the leading NaN changed dlight's schedule of attention's masked-row kernel
into one LLVM rejects).  ``relax.argmax`` / ``relax.argmin`` get the matching fold
(``arg_compute``: a leading NaN is index 0, other NaN are skipped, the first index among
equal values); the ArgMax / ArgMin converters call ``arg_compute`` directly for
``select_last_index``, or, over a long last axis, ``arg_partial_compute`` then
``arg_merge_compute`` (lanes of independent folds, then their merge).  Integer dtypes and empty reductions
keep TVM's.  Registered on the ops themselves (``FLegalize``), so that constant folding
(which legalizes with the registered functions) and the lowering agree;
``compiler.lowering.install`` installs it.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx

from .nan_reducers import arg_reducer, lead_nan_input, lead_nan_reducer

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
        reducer = lead_nan_reducer(kind)
        rvars = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
        if keepdims:
            out_shape = [1 if i in axes else x.shape[i] for i in range(ndim)]
        else:
            out_shape = [x.shape[i] for i in range(ndim) if i not in axes]

        def full_index(idx, reduced):
            it, rit, full = iter(idx), iter(reduced), []
            for i in range(ndim):
                if i in axes:
                    full.append(next(rit))
                    if keepdims:
                        next(it)
                else:
                    full.append(next(it))
            return tuple(full)

        return te.compute(
            out_shape,
            lambda *idx: reducer(lead_nan_input(kind, x[full_index(idx, rvars)], rvars),
                                 axis=rvars),
            name=f"{kind}_red", tag="comm_reduce")

    return compute


def arg_compute(x, axis: int, keepdims: bool, kind: str, last: bool = False):
    """int64 ``arg{kind}`` of float ``x`` along ``axis`` with onnxruntime's NaN fold (see
    ``nan_reducers.arg_reducer``)."""
    ndim = len(x.shape)
    axis = axis + ndim if axis < 0 else axis
    reducer = arg_reducer(kind, last)
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    out_shape = [1 if i == axis else x.shape[i] for i in range(ndim) if keepdims or i != axis]

    def body(*idx):
        full = list(idx)
        if keepdims:
            full[axis] = k
        else:
            full.insert(axis, k)
        return reducer((k.var.astype("int64"), x[tuple(full)]), axis=k)

    index, _ = te.compute(out_shape, body, name=f"arg{kind}_red")
    return index


# A row at least this long is reduced in two stages (``arg_partial_compute``).
ARG_SPLIT_MIN = 1024
ARG_LANES = 64


def arg_partial_compute(x, kind: str, last: bool = False, lanes: int = ARG_LANES):
    """Stage one of an arg{kind} over ``x``'s last axis ``R``: ``(index, value)`` of shape
    ``[..., lanes]``, lane ``j`` the fold over ``x[..., k * lanes + j]`` (past ``R``: the
    identity).  A fold is one chain of dependent selects (~5 ns an element on one core);
    ``lanes`` independent chains, reading ``lanes`` contiguous elements a step, run as a
    tile of outputs (``cpu.arg_reduction``) and split over cores.  The reducer's order is
    total (a leading NaN first, a later NaN last, numbers by value then index), so folding
    lanes then merging them (``arg_merge_compute``) gives the one fold's result."""
    *outer, n = x.shape
    n = int(n)
    steps = (n + lanes - 1) // lanes
    reducer = arg_reducer(kind, last)
    k = te.reduce_axis((0, steps), name="k")
    nan = tirx.const(float("nan"), x.dtype)

    def body(*idx):
        *o, j = idx
        pos = k.var * lanes + j
        if n % lanes == 0:
            return reducer((pos.astype("int64"), x[(*o, pos)]), axis=k)
        inside = pos < n
        value = tirx.Select(inside, x[(*o, tirx.min(pos, n - 1))], nan)
        index = tirx.Select(inside, pos.astype("int64"), tirx.const(-1, "int64"))
        return reducer((index, value), axis=k)

    index, value = te.compute([*outer, lanes], body, name=f"arg{kind}_lanes")
    return index, value


def arg_merge_compute(index, value, keepdims: bool, kind: str, last: bool = False):
    """Stage two: the int64 arg{kind} of ``arg_partial_compute``'s lanes (same reducer)."""
    *outer, lanes = index.shape
    reducer = arg_reducer(kind, last)
    j = te.reduce_axis((0, lanes), name="j")

    def body(*idx):
        o = idx[:len(outer)]
        return reducer((index[(*o, j)], value[(*o, j)]), axis=j)

    out_shape = [*outer, 1] if keepdims else list(outer)
    merged, _ = te.compute(out_shape, body, name=f"arg{kind}_merge")
    return merged


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



def _install_arg(op_name: str, kind: str) -> None:
    op = tvm.ir.Op.get(op_name)
    default = op.get_attr(_ATTR)
    if getattr(default, "__onnxc_inf_identity__", False):
        return

    def legalize(bb, call):
        dtype = str(call.args[0].ty.dtype)
        if not _is_float(dtype) or _has_zero_dim(call) or call.attrs.axis is None:
            return default(bb, call)
        return bb.call_te(arg_compute, call.args[0], int(call.attrs.axis),
                          bool(call.attrs.keepdims), kind, primfunc_name_hint=f"arg{kind}")

    legalize.__onnxc_inf_identity__ = True
    tvm.ir.register_op_attr(op_name, _ATTR, legalize, level=11)


def install() -> None:
    """Register the NaN-fold legalizations of ``relax.max`` / ``min`` / ``argmax`` /
    ``argmin`` (once)."""
    _install_one("relax.max", "max")
    _install_one("relax.min", "min")
    _install_arg("relax.argmax", "max")
    _install_arg("relax.argmin", "min")
