"""Tile on CPUs as one copy kernel, written already scheduled.

The Tile converter (``compiler/frontend/converters/tensor.py``) calls it for a static
input and constant repeats on CPU targets::

    parallel over the output's rows (every dim but the last):
        for each repeat q of the last dim:
            y[row, q * W + w] = x[row's input coordinates, w]   for w < W (a contiguous
                                                                 copy, explicit vectors)

Each output coordinate ``c`` of a dim of input extent ``I`` reads ``c % I``, computed once
per row.  TVM's ``topi.tile`` computes ``c % I`` for every element, the last dim's too: a
vector of outputs crossing a repeat boundary reads through a gather (Tile of [1, 64, 28,
28] by [2, 1, 2, 2]: 4.6x onnxruntime's time).  The template's conventions:
``schedules/cpu/templates.py``.
"""

from __future__ import annotations

from .templates import indent, kernel, row_loop, static_copy_params

RULE = "cpu.tile"

_TEMPLATE = """
    with T.sblock("root"):
        for p in T.parallel(T.int64({rows})):
            for q in range(T.int64({rep})):
{copy}
"""


def tile_kernel(shape: list, repeats: list, dtype: str):
    """The PrimFunc (x, y) of Tile of a static ``shape`` by ``repeats`` (rank >= 1)."""
    out = [d * r for d, r in zip(shape, repeats)]
    lead = out[:-1]
    coords = []
    stride = 1
    for d in reversed(lead):  # the row index p split into the output's leading coordinates
        coords.append(f"p // T.int64({stride}) % T.int64({d})")
        stride *= d
    coords.reverse()
    width = shape[-1]
    in_row = [f"{c} % T.int64({i})" if r > 1 else c
              for c, i, r in zip(coords, shape[:-1], repeats[:-1])]

    def stmt(w):
        return (f"y[{', '.join(coords + [f'q * T.int64({width}) + {w}'])}] = "
                f"x[{', '.join(in_row + [w])}]")

    rows = 1
    for d in lead:
        rows *= d
    body = _TEMPLATE.format(rows=rows, rep=repeats[-1],
                            copy=indent(row_loop(width, stmt), 16))
    return kernel(static_copy_params(shape, out, dtype), RULE, body)
