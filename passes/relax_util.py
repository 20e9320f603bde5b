"""Small helpers over Relax IR shared by the passes (counting, walking main's bindings)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx


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


def apply_index_map(index_map, src: np.ndarray) -> np.ndarray:
    """``layout_transform`` of a numpy array: ``dst[f(i)] = src[i]`` for the index map ``f``
    (floordiv/floormod/+/*/- of the source indices; no padding), vectorised over all
    source indices."""
    grids = np.indices(src.shape, dtype=np.int64, sparse=True)
    env = {v: g for v, g in zip(index_map.initial_indices, grids)}
    dst_idx = [np.broadcast_to(_eval(e, env), src.shape) for e in index_map.final_indices]
    dst_shape = [int(i.max()) + 1 if i.size else 0 for i in dst_idx]
    if int(np.prod(dst_shape)) != src.size:
        raise ValueError(f"index map {index_map} pads or drops elements of {src.shape}")
    dst = np.empty(dst_shape, dtype=src.dtype)
    dst[tuple(dst_idx)] = src
    return dst


def _eval(e, env):
    if isinstance(e, tirx.Var):
        return env[e]
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    ops = {tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod, tirx.Add: np.add,
           tirx.Sub: np.subtract, tirx.Mul: np.multiply}
    for cls, fn in ops.items():
        if isinstance(e, cls):
            return fn(_eval(e.a, env), _eval(e.b, env))
    raise ValueError(f"unsupported index expression {e}")
