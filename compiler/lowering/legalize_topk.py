"""``relax.topk`` as a TE kernel: TVM 0.27 has no legalization for it.  CPU targets take
the selection kernel of ``schedules/cpu/topk.py`` instead (the converter emits it); this
one serves other targets and constant folding.

TVM's own top-k (``topi.topk``) calls a sort routine outside the kernel, which the graph
runtime cannot run.  This one is a rank count, as a comparison sort without the sort: the
rank of element i along the axis is the number of elements that come before it (greater
for ``largest``, smaller otherwise; equal ones with a lower index first, as ONNX and
numpy's stable sort order them; NaN counts as greater than any number, as in numpy's
sort).  The element of rank r is the r-th output.  O(n^2) comparisons per row of the
axis: ``compiler/frontend/converters/shape_values.py`` refuses axes longer than
``TOPK_MAX_AXIS``.  Registered on the op (``FLegalize``), so constant folding and the
lowering agree; ``compiler.lowering.install`` installs it.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx

_ATTR = "FLegalize"


def _before(xj, xi, j, i, largest: bool, is_float: bool):
    """Whether element j comes before element i in the top-k order."""
    if largest:
        better = xj > xi
        if is_float:  # NaN is the greatest value: first when largest
            better = tirx.any(better, tirx.all(tirx.isnan(xj), tirx.Not(tirx.isnan(xi))))
    else:
        better = xj < xi
        if is_float:  # ... and last when smallest
            better = tirx.any(better, tirx.all(tirx.Not(tirx.isnan(xj)), tirx.isnan(xi)))
    same = xj == xi
    if is_float:
        same = tirx.any(same, tirx.all(tirx.isnan(xj), tirx.isnan(xi)))
    return tirx.any(better, tirx.all(same, j < i))


def topk_compute(x, k: int, axis: int, largest: bool, dtype: str):
    """(values, indices) of the top ``k`` along ``axis``, sorted, ties by lower index."""
    shape = list(x.shape)
    n = shape[axis]
    is_float = str(x.dtype).startswith("float") or str(x.dtype).startswith("bfloat")

    def at(idx, pos):
        full = list(idx)
        full[axis] = pos
        return tuple(full)

    j = te.reduce_axis((0, n), name="j")

    def rank_body(*idx):
        before = _before(x[at(idx, j)], x[idx], j, idx[axis], largest, is_float)
        return te.sum(tirx.Select(before, tirx.const(1, "int32"), tirx.const(0, "int32")),
                      axis=j)

    rank = te.compute(shape, rank_body, name="topk_rank")
    out_shape = list(shape)
    out_shape[axis] = k
    m = te.reduce_axis((0, n), name="m")

    def index_body(*idx):
        hit = rank[at(idx, m)] == idx[axis]
        return te.sum(tirx.Select(hit, m.var.astype(dtype), tirx.const(0, dtype)), axis=m)

    indices = te.compute(out_shape, index_body, name="topk_indices")
    values = te.compute(out_shape, lambda *idx: x[at(idx, indices[idx])], name="topk_values")
    return values, indices


def _legalize(bb, call):
    x = call.args[0]
    a = call.attrs
    ndim = len(x.ty.shape.values)
    axis = int(a.axis) + ndim if int(a.axis) < 0 else int(a.axis)
    k, largest, dtype, ret = int(a.k), bool(a.largest), str(a.dtype), str(a.ret_type)

    def compute(data):
        values, indices = topk_compute(data, k, axis, largest, dtype)
        if ret == "values":
            return values
        if ret == "indices":
            return indices
        return [values, indices]

    return bb.call_te(compute, x, primfunc_name_hint="topk")


def install() -> None:
    """Register the legalization on ``relax.topk`` (once)."""
    op = tvm.ir.Op.get("relax.topk")
    current = op.get_attr(_ATTR)
    if getattr(current, "__onnxc_topk__", False):
        return  # already installed (module reloaded)
    _legalize.__onnxc_topk__ = True
    tvm.ir.register_op_attr("relax.topk", _ATTR, _legalize, level=11)

