"""CumSum / CumProd on CPUs as one scan kernel, written already scheduled.

The converters (``compiler/frontend/converters/math.py``) view the input as ``[O, N, I]``
(the axis in the middle) and call this kernel on CPU targets::

    parallel over the O rows x blocks of up to 64 inner positions:
        acc[w] = 0 (1 for a product)
        for n in range(N):                    # the axis, once; reversed for ``reverse``
            for each inner position i of the block:
                inclusive: acc[i] += x[o, n, i]; y[o, n, i] = acc[i]
                exclusive: y[o, n, i] = acc[i]; acc[i] += x[o, n, i]

O(N) per row, summed in the order of the axis, as onnxruntime sums.  The TE form this
replaces summed each output's whole prefix (O(N^2) per row: CumSum over [64, 1024] took
3.9x onnxruntime's time, the int64 position ids of a [8, 512] mask 7.6x).  The extents
are the buffers' (symbolic allowed: ``cumsum(attention_mask)`` over a symbolic sequence),
the inner one static where the converter knows it (1: a row is one running value).
The template's conventions: ``schedules/cpu/templates.py``.
"""

from __future__ import annotations

from .templates import axis_views, indent, kernel

RULE = "cpu.scan"

# inner positions per task when the axis is not the last one
BLOCK = 64

_TEMPLATE = """
{decls}
    with T.sblock("root"):
{views}
        for t in T.parallel({O} * {IB}):
            acc = T.alloc_buffer(({B},), "{dt}", scope="global")
            for i in range({width}):
                acc[i] = T.{dt}({ident})
            for n in range({N}):
                for i in range({width}):
{step}
"""


def scan_kernel(kind: str, dtype: str, exclusive: bool, reverse: bool, shape: list,
                axis: int):
    """The PrimFunc (x, y) of the running sum (``kind`` "sum") or product ("prod") along
    ``axis``.  ``shape``: x's dims, an int each or None where symbolic."""
    decls, views, o, n, ii = axis_views(shape, axis, [("var_x", "x", dtype, None),
                                                      ("var_y", "y", dtype, None)])
    op = "+" if kind == "sum" else "*"
    block = 1 if ii == "T.int64(1)" else BLOCK
    ib = f"(({ii} + T.int64({block - 1})) // T.int64({block}))"
    at = f"t // {ib}, {f'{n} - T.int64(1) - n' if reverse else 'n'}, " \
         f"t % {ib} * T.int64({block}) + i"
    if exclusive:
        step = [f"y[{at}] = acc[i]", f"acc[i] = acc[i] {op} x[{at}]"]
    else:
        step = [f"acc[i] = acc[i] {op} x[{at}]", f"y[{at}] = acc[i]"]
    width = "1" if block == 1 else f"T.min(T.int64({block}), {ii} - t % {ib} * T.int64({block}))"
    is_float = dtype.startswith("float") or dtype.startswith("bfloat")
    ident = 0 if kind == "sum" else 1
    body = _TEMPLATE.format(
        dt=dtype, O=o, N=n, IB=ib, B=block, width=width,
        decls=indent(decls, 4), views=indent(views, 8),
        ident=float(ident) if is_float else ident, step=indent(step, 20))
    return kernel("var_x: T.handle, var_y: T.handle", RULE, body)
