"""Float max pooling (1-D, 2-D, 3-D, any layout) that skips NaN, as onnxruntime mostly does.

TVM 0.27 lowers ``relax.nn.max_pool{1,2,3}d`` with topi's pool, a ``T.max`` reduction from
``-FLT_MAX``: a NaN survives only when it is the last element of its window (issue #17).
onnxruntime 1.32's MaxPool / GlobalMaxPool (MLAS) keep a NaN only in
the position their loop order happens to favour (the last tap of a 2-D window, none in 1-D,
the next-to-last element of a global pool; measured, ``nan_reducers``): we skip NaN
wherever the window holds a number and give NaN for an all-NaN window (docs/conformance.md).
This legalization keeps topi's structure (a ``pad_temp`` block, then the ``pool_max``
reduction, the shape ``schedules/cpu/pool.py`` matches):

* float32: ``pad_temp`` holds each input's ``nan_reducers.order_key`` (an int32 whose
  order is the float's, every NaN below -inf; the padding -FLT_MAX's key), built once per
  input element, also without padding (``pad_temp`` is kept by the schedules:
  ``common.inline_around``); ``pool_max`` is TVM's int32 max of the keys (one ``vpmaxsd``
  per tap, no dependency on a compare; identity INT_MIN, a NaN's key: a reducer rfactor
  and the GPU rules' cross-thread reduction know), and ``pool_max_value`` turns the key
  back into the float (an all-NaN window's max is a NaN's key).  The select-based
  reducer before it (a NaN test and a compare per tap) ran the 3x3/1 NCHW16c pools at
  2.4x a plain max on znver4;
* other float dtypes: ``pool_max(w) => fold(acc = NaN; acc = isnan(v) ? acc : (acc > v ?
  acc : v))`` (``nan_reducers.skip_nan_reducer``) over the input padded with -FLT_MAX.

Ceil mode: the output size comes from the call's inferred shape; the bottom / right
padding is extended to cover the last window as topi does.  Integer dtypes and a call whose
``out_layout`` differs from ``layout`` keep TVM's.  Registered on the ops (``FLegalize``);
``compiler.lowering.install`` installs it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx

from .nan_reducers import from_order_key, order_key, skip_nan_reducer

_ATTR = "FLegalize"
_MARK = "__onnxc_pool_skip_nan__"


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def _pool_compute(x, out_shape, layout: str, kernel, strides, dilation, before, after):
    spatial = [layout.index(c) for c in "DHW" if c in layout]
    dtype = str(x.dtype)
    lowest = tirx.const(float(np.finfo(np.dtype(dtype)).min), dtype)
    pad_shape = list(x.shape)
    for j, a in enumerate(spatial):
        need = (out_shape[a] - 1) * strides[j] + (kernel[j] - 1) * dilation[j] + 1
        extra = tvm.sym.Analyzer().simplify(need - x.shape[a] - before[j])
        if isinstance(extra, tirx.IntImm):
            after[j] = max(after[j], int(extra))
        pad_shape[a] = x.shape[a] + before[j] + after[j]
    padded, keyed = any(before) or any(after), dtype == "float32"

    def prepared(*i):  # the (padded) input, as order keys when keyed
        inside, idx = [], list(i)
        for j, a in enumerate(spatial):
            idx[a] = i[a] - before[j]
            inside += [i[a] >= before[j], i[a] < x.shape[a] + before[j]]
        v = tirx.if_then_else(tirx.all(*inside), x(*idx), lowest) if padded else x(*i)
        return order_key(v) if keyed else v

    src = te.compute(pad_shape, prepared, name="pad_temp", tag="pad") if padded or keyed else x
    rk = [te.reduce_axis((0, kernel[j]), name=f"rv{j}") for j in range(len(spatial))]
    # keys: TVM's integer max (identity INT_MIN, a NaN's key), a reducer rfactor and the
    # GPU's cross-thread reduction know
    reducer = te.max if keyed else skip_nan_reducer("max")

    def body(*o):
        idx = list(o)
        for j, a in enumerate(spatial):
            idx[a] = o[a] * strides[j] + rk[j] * dilation[j]
        return reducer(src(*idx), axis=rk)

    out = te.compute(out_shape, body, name="pool_max", tag="pool_max")
    if not keyed:
        return out
    return te.compute(out_shape, lambda *i: from_order_key(out(*i)), name="pool_max_value",
                      tag="elemwise")


def _legalize(default):
    def legalize(bb, call):
        attrs = call.attrs
        if not _is_float(str(call.args[0].ty.dtype)) or attrs.layout != attrs.out_layout:
            return default(bb, call)
        k = len(attrs.pool_size)
        pad = [int(p) for p in attrs.padding]
        out_shape = list(call.ty.shape.values)
        return bb.call_te(_pool_compute, call.args[0], out_shape, str(attrs.layout),
                          [int(v) for v in attrs.pool_size], [int(v) for v in attrs.strides],
                          [int(v) for v in attrs.dilation], pad[:k], pad[k:],
                          primfunc_name_hint=f"max_pool{k}d")

    return legalize


def install() -> None:
    """Register the NaN-skipping legalization of ``relax.nn.max_pool{1,2,3}d`` (once)."""
    for name in ("relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d"):
        op = tvm.ir.Op.get(name)
        default = op.get_attr(_ATTR)
        if getattr(default, _MARK, False):
            continue
        legalize = _legalize(default)
        setattr(legalize, _MARK, True)
        tvm.ir.register_op_attr(name, _ATTR, legalize, level=11)
