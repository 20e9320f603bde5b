"""Pad in reflect / edge / wrap mode on CPUs as one copy kernel, written already scheduled.

The Pad converter (``compiler/frontend/converters/tensor.py``) calls it for a static input
and constant pads >= 0 on CPU targets::

    parallel over the output's rows (every dim but the last):
        the row's input coordinates (each padded dim mapped back, once per row)
        y[row, w] = x[in row, map(w - left)]        for w < left (a few elements)
        y[row, left + w] = x[in row, w]             for w < W (a contiguous copy)
        y[row, left + W + w] = x[in row, map(W + w)] for w < right
        (each loop as explicit vectors: ``templates.row_loop``)

``map`` per mode: reflect ``i < 0: -i``, ``i >= n: 2 (n - 1) - i``; edge: ``i`` clamped to
``[0, n - 1]``; wrap: ``i mod n``.  TVM's ``mirror_pad`` computed every element's source
with selects, one scalar gather each (8.4x onnxruntime's time over [1, 64, 56, 56]); the
mirrored slices concatenated instead (this kernel's predecessor) still chose a source per
column (2.85x).  The template's conventions: ``schedules/cpu/templates.py``.
"""

from __future__ import annotations

from .templates import indent, kernel, row_loop, static_copy_params

RULE = "cpu.pad"

MODES = ("reflect", "edge", "wrap")

_TEMPLATE = """
    with T.sblock("root"):
        for p in T.parallel(T.int64({rows})):
{loops}
"""


def fits(mode: str, n: int, before: int, after: int) -> bool:
    """Whether the kernel pads a dim of ``n`` elements by ``before`` / ``after`` (>= 0) in
    ``mode``: reflect mirrors at most n - 1 elements a side (onnxruntime's limit too)."""
    if min(before, after) < 0 or n < 1:
        return False
    return mode != "reflect" or (max(before, after) <= n - 1)


def _map(mode: str, i: str, n: int) -> str:
    """TVMScript of the source index of the unpadded position ``i`` in a dim of ``n``."""
    if mode == "reflect":
        return (f"T.Select({i} < T.int64(0), T.int64(0) - ({i}), T.Select({i} >= T.int64({n}),"
                f" T.int64({2 * (n - 1)}) - ({i}), {i}))")
    if mode == "edge":
        return f"T.max(T.min({i}, T.int64({n - 1})), T.int64(0))"
    return f"T.floormod({i}, T.int64({n}))"


def pad_kernel(mode: str, shape: list, before: list, after: list, dtype: str):
    """The PrimFunc (x, y) of Pad of a static ``shape`` (rank >= 1) in ``mode``."""
    out = [n + b + a for n, b, a in zip(shape, before, after)]
    coords, stride = [], 1
    for d in reversed(out[:-1]):  # the row index p split into the output's coordinates
        coords.append(f"(p // T.int64({stride}) % T.int64({d}))")
        stride *= d
    coords.reverse()
    src_row = [_map(mode, f"{c} - T.int64({b})", n) if (b or a) else c
               for c, n, b, a in zip(coords, shape[:-1], before[:-1], after[:-1])]
    n, left, right = shape[-1], before[-1], after[-1]

    def copy(start: int, count: int, source) -> list:
        def stmt(w):
            dst = ", ".join(coords + [f"T.int64({start}) + {w}"])
            return f"y[{dst}] = x[{', '.join(src_row + [source(w)])}]"
        return row_loop(count, stmt)

    lines = (copy(0, left, lambda w: _map(mode, f"{w} - T.int64({left})", n))
             + copy(left, n, lambda w: w)
             + copy(left + n, right, lambda w: _map(mode, f"{w} + T.int64({n})", n)))
    rows = 1
    for d in out[:-1]:
        rows *= d

    body = _TEMPLATE.format(rows=rows, loops=indent(lines, 12))
    return kernel(static_copy_params(shape, out, dtype), RULE, body)
