"""ArgMax / ArgMin over the last axis of short rows on CPUs: one kernel, already scheduled.

The ArgMax / ArgMin converters (``compiler/frontend/converters/reduction.py``) call it for
float rows shorter than ``ARG_SPLIT_MIN`` (longer rows are folded in lanes, then merged:
``legalize_reductions.arg_partial_compute``), on CPU targets::

    parallel over blocks of R rows, the R rows as the lanes of a vector:
        best[r], at[r] = x[row r, 0], 0
        for k in 1 .. N - 1:
            for r in R (vectorised: a gather, a compare, two blends):
                at[r] = x[row r, k] > best[r] ? k : at[r]
                best[r] = x[row r, k] > best[r] ? x[row r, k] : best[r]
        out[row r] = at[r]

onnxruntime's fold (``compiler/lowering/nan_reducers.py``): ``>`` (``<`` for ArgMin),
``>=`` / ``<=`` with ``select_last_index``, so a NaN in the first position wins and any
other NaN is skipped (a compare with a NaN is false).  One row's fold alone is a chain of
dependent compare-and-selects (~5 ns an element: the fallback's loop order, 12.6x
onnxruntime's time on ArgMax over YOLO's [8400, 80] class scores; 8 rows interleaved as
scalars, 2.9x); R rows as vector lanes, 0.28x.  A block past the last row repeats the last
row (the same value written again by one task).  The row count may be symbolic.  The
template's conventions: ``schedules/cpu/templates.py``.
"""

from __future__ import annotations

from .templates import axis_views, dim_exprs, indent, kernel, shape_text

RULE = "cpu.arg_rows"

# rows folded together, as vector lanes (one AVX-512 vector of fp32, two of AVX2)
ROWS = 16

_TEMPLATE = """
{decls}
    o_nd = T.match_buffer(var_o, ({out_dims}), "int64")
    with T.sblock("root"):
{views}
        o = T.decl_buffer(({O},), "int64", data=o_nd.data)
        for t in T.parallel(({O} + T.int64({R1})) // T.int64({R})):
            best = T.alloc_buffer(({R},), "{dt}", scope="global")
            at = T.alloc_buffer(({R},), "int64", scope="global")
            for r in T.vectorized({R}):
                best[r] = x[{row}, T.int64(0), T.int64(0)]
                at[r] = T.int64(0)
            for k in range(T.int64(1), {N}):
                for r in T.vectorized({R}):
                    at[r] = T.Select(x[{row}, k, T.int64(0)] {cmp} best[r], k, at[r])
                    best[r] = T.Select(x[{row}, k, T.int64(0)] {cmp} best[r],
                                       x[{row}, k, T.int64(0)], best[r])
            for r in T.unroll({R}):
                o[{row}] = at[r]
"""


def arg_rows_kernel(kind: str, last: bool, dtype: str, shape: list, keepdims: bool):
    """The PrimFunc (x, out) of arg``kind`` ("max" / "min") over the last axis of x,
    int64; ``shape``: x's dims, an int each or None where symbolic (the last static);
    ``last``: select_last_index."""
    axis = len(shape) - 1
    decls, views, o, n, _ = axis_views(shape, axis, [("var_x", "x", dtype, None)])
    out_dims = dim_exprs(shape)[:-1] + (["T.int64(1)"] if keepdims else [])
    cmp = (">" if kind == "max" else "<") + ("=" if last else "")
    body = _TEMPLATE.format(
        dt=dtype, O=o, N=n, R=ROWS, R1=ROWS - 1, cmp=cmp,
        row=f"T.min(t * T.int64({ROWS}) + r, {o} - T.int64(1))",
        out_dims=shape_text(out_dims), decls=indent(decls, 4), views=indent(views, 8))
    return kernel("var_x: T.handle, var_o: T.handle", RULE, body)
