"""Small helpers over Relax IR shared by the passes (counting, walking main's bindings)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx


def with_fields(attrs, **changes):
    """An op's attrs node with the fields in ``changes`` replaced (TVM 0.27's attrs are
    immutable FFI objects: rebuilt from every field)."""
    info = type(attrs).__tvm_ffi_type_info__
    fields = {f.name: getattr(attrs, f.name) for f in info.fields}
    fields.update(changes)
    return tvm.ir.make_node(info.type_key, **fields)


def element_count(shape_values):
    """The element count of a shape (TIR values, static or symbolic) as one simplified
    TIR expression."""
    from tvm.sym.analyzer import Analyzer

    n = tirx.IntImm("int64", 1)
    for d in shape_values:
        n = n * d
    return Analyzer().simplify(n)


def bindings(mod, func: str = "main") -> list:
    """All variable bindings of ``func``, in order, across its binding blocks."""
    body = mod[func].body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for block in body.blocks for b in block.bindings]


# dtypes a relax constant's data is read in place as (``const_view``) and written in place
# into (``filled_const``): numpy's own, none that relax.const would narrow (int64, float64)
_IN_PLACE_DTYPES = {"float16", "float32", "int8", "int16", "int32", "uint8", "uint16",
                    "uint32"}


def const_view(c) -> np.ndarray:
    """The data of the relax constant ``c`` as a read-only numpy array: a view of the
    constant's own buffer (``Tensor.numpy()`` copies it: GPT-2's 340 MB of matmul
    weights), a copy for dtypes numpy does not hold."""
    t = c.value
    if str(t.dtype) in _IN_PLACE_DTYPES:
        try:
            view = np.from_dlpack(t)
        except (BufferError, TypeError, RuntimeError):
            view = None
        if view is not None and view.shape == tuple(int(d) for d in t.shape):
            view.flags.writeable = False
            return view
    return t.numpy()


def filled_const(shape, dtype: str, fill):
    """``relax.const`` of a new ``shape`` / ``dtype`` array that ``fill(view)`` writes in
    place: the bytes go once into the constant's own buffer (``relax.const(array)`` copies
    a contiguous array again); ``dtype`` one of those relax.const keeps as they are."""
    import tvm

    if dtype not in _IN_PLACE_DTYPES:
        raise ValueError(f"filled_const: dtype {dtype} is not written in place")
    t = tvm.runtime.empty(tuple(int(d) for d in shape), dtype)
    fill(np.from_dlpack(t))
    return relax.const(t)


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


# spatial dims -> (data layout, kernel layout, constructor) of a channels-first conv
CONVS = {1: ("NCW", "OIW", relax.op.nn.conv1d), 2: ("NCHW", "OIHW", relax.op.nn.conv2d),
         3: ("NCDHW", "OIDHW", relax.op.nn.conv3d)}


def static_conv(call, nd: int):
    """(input extents, output extents, the weight as numpy) of a channels-first
    ``relax.nn.conv{nd}d`` call with a constant weight and static spatial extents (the
    layouts ``CONVS`` names), else None."""
    from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

    data_layout, kernel_layout, _ = CONVS[nd]
    a = call.attrs
    data, weight = call.args
    if (not isinstance(weight, GenericConst) or a.data_layout != data_layout
            or a.kernel_layout != kernel_layout or a.out_layout != data_layout):
        return None
    shape, oshape = data.ty.shape, call.ty.shape
    if shape is None or oshape is None:
        return None
    dims = list(shape)[2:] + list(oshape)[2:]
    if any(not isinstance(d, tirx.IntImm) for d in dims):
        return None
    return ([int(d) for d in dims[:nd]], [int(d) for d in dims[nd:]], weight.value.numpy())
