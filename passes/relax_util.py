"""Small helpers over Relax IR shared by the passes (counting, walking main's bindings)."""

from __future__ import annotations

import tvm
from tvm import relax


def bindings(mod, func: str = "main") -> list:
    """All variable bindings of ``func``, in order, across its binding blocks."""
    body = mod[func].body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for block in body.blocks for b in block.bindings]


def op_counts(mod, func: str = "main") -> dict:
    """{op name: number of calls} over ``func``'s bindings (e.g. ``relax.nn.conv2d``)."""
    counts: dict = {}
    for b in bindings(mod, func):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
            counts[v.op.name] = counts.get(v.op.name, 0) + 1
    return counts
