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
28] by [2, 1, 2, 2]: 4.6x onnxruntime's time).  Opaque to fusion, in a root block, as
``schedules/cpu/topk.py`` explains.
"""

from __future__ import annotations

from .axis_views import row_loop
from .recurrence import PRESCHEDULED

RULE = "cpu.tile"

_TEMPLATE = """
@T.prim_func(private=True)
def main(x: T.Buffer(({in_shape}), "{dt}"), y: T.Buffer(({out_shape}), "{dt}")):
    T.func_attr({{"tirx.noalias": True, "{attr}": "{rule}", "op_pattern": 8}})
    with T.sblock("root"):
        for p in T.parallel(T.int64({rows})):
            for q in range(T.int64({rep})):
{copy}
"""


def tile_kernel(shape: list, repeats: list, dtype: str):
    """The PrimFunc (x, y) of Tile of a static ``shape`` by ``repeats`` (rank >= 1)."""
    import tvm

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

    def dims(ds):
        return ", ".join(f"T.int64({d})" for d in ds) + ("," if len(ds) == 1 else "")

    rows = 1
    for d in lead:
        rows *= d
    src = _TEMPLATE.format(attr=PRESCHEDULED, rule=RULE, dt=dtype, in_shape=dims(shape),
                           out_shape=dims(out), rows=rows, rep=repeats[-1],
                           copy="\n".join(" " * 16 + ln for ln in row_loop(width, stmt)))
    return tvm.script.from_source(src, check_well_formed=False)
