"""Shape arithmetic on symbolic dims, evaluated at import (``Shape -> Gather -> Concat``).

Exporters compute reshape targets, position ids and masks from ``Shape`` of run-time
tensors.  With static shapes ``fold_onnx`` evaluates all of it; with symbolic input dims
(``lowering/symbolic.py``) the values hold the dims themselves.  The importer keeps such
"known values" (numpy object arrays of ints and ``tirx`` expressions of the dims) and
evaluates the ops below on them, so that a ``Reshape`` gets ``R.shape([batch, seq, 12,
64])`` rather than a tensor it cannot plan.  A known value becomes, in Relax: a constant
(all ints), a ``ShapeExpr`` (1-D) or ``PrimValue`` (0-D) for the ops that take shapes, and a
small int64 kernel (``materialize``) for ops that need a tensor (``mask_index * seq``).
``Range`` over known bounds becomes a kernel of symbolic length.

Must run inside the importer's node loop (``importer._Importer._construct_nodes``).
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
from onnx import helper

# Known values above this many elements are not tracked (they are data, not shapes).
MAX_ELEMENTS = 64

_INT_TYPES = {"int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool"}


# {dim name: (min, max)} of the ranges the caller declared (``dims=``), while importing
# (``declared_ranges``): what the analyzer may assume of each dim beyond ">= 1"
_RANGES: contextvars.ContextVar = contextvars.ContextVar("dim_ranges", default={})
# {dim name: (largest value the model runs at, why)} found while importing (Slice bounds)
_CAPS: contextvars.ContextVar = contextvars.ContextVar("dim_caps", default=None)


@contextlib.contextmanager
def declared_ranges(ranges: dict | None):
    """Import with the dims' declared ``{name: (min, max, ...)}`` known to the shape
    arithmetic (a wav2vec2 export's positional conv is sliced to
    ``min(max(n, 0), n + 1)`` frames, ``n`` only when the samples give at least one
    frame: true over the declared range, not for every sample count >= 1).  Yields the
    caps the import finds: ``{dim: (largest value, why)}`` (``check_slice_bounds``)."""
    caps: dict = {}
    token = _RANGES.set({k: (int(v[0]), int(v[1])) for k, v in (ranges or {}).items()})
    caps_token = _CAPS.set(caps)
    try:
        yield caps
    finally:
        _CAPS.reset(caps_token)
        _RANGES.reset(token)


def _dims_in(exprs) -> list:
    """The dim Vars of ``exprs`` (ints and constants have none)."""
    from tvm import tirx

    return [v for e in exprs if not isinstance(e, (int, np.integer, tirx.IntImm))
            for v in tirx.analysis.undefined_vars(e)]


def declared_range_of(*exprs) -> dict:
    """{dim name: (min, max)} of the dims in ``exprs``: declared (``declared_ranges``),
    else the default range (``lowering/symbolic.py``)."""
    from ..lowering.symbolic import DEFAULT_MAX, DEFAULT_MIN

    ranges = _RANGES.get()
    return {v.name: ranges.get(v.name, (DEFAULT_MIN, DEFAULT_MAX)) for v in _dims_in(exprs)}


def bounded_analyzer(*exprs):
    """An Analyzer that knows each dim in ``exprs`` lies in ``declared_range_of``: the
    range run() will accept, the default one for a dim not declared."""
    from tvm.sym.analyzer import Analyzer, ConstIntBound

    ana, ranges = Analyzer(), declared_range_of(*exprs)
    for v in _dims_in(exprs):
        lo, hi = ranges[v.name]
        ana.update(v, ConstIntBound(int(lo), int(hi)), override=True)
    return ana


def analyzer(*exprs):
    """An Analyzer that knows every dim in ``exprs`` is >= 1 (a symbolic input dim's range
    starts at 1: ``lowering/symbolic.py``), so ``max(seq, 0)`` is ``seq``, and within its
    declared range where the caller gave one (``declared_ranges``)."""
    from tvm.sym.analyzer import Analyzer, ConstIntBound

    ana = Analyzer()
    ranges = _RANGES.get()
    for v in _dims_in(exprs):
        lo, hi = ranges.get(v.name, (1, None))
        ana.update(v, ConstIntBound(max(int(lo), 1), ConstIntBound.POS_INF
                                    if hi is None else int(hi)), override=True)
    return ana


def provably_equal(a, b) -> bool:
    """Whether two dim expressions are equal for every value of their dims: the
    analyzer's proof, else the same polynomial over the same atoms (``_poly``).  TVM's
    simplifier does not see ``((x * 128 + 128) * y) // 128 == ((x * 32 + 32) * y) // 32``
    (both ``(x + 1) * y``: the -1 of two Reshapes of one tensor, SegFormer's tokens)."""
    if analyzer(a, b).can_prove_equal(a, b):
        return True
    pa, pb = _poly(a), _poly(b)
    return pa is not None and pa == pb


def _poly(e):
    """``e`` as {monomial: coefficient}, a monomial a sorted tuple of atom keys (dims, and
    floor divisions that do not divide exactly, keyed by their own normal form); a floor
    division by a constant dividing every coefficient divides exactly.  None for what it
    cannot normalise."""
    from tvm import tirx

    if isinstance(e, (int, np.integer)):
        return {(): int(e)} if int(e) else {}
    if isinstance(e, tirx.IntImm):
        return {(): int(e.value)} if int(e.value) else {}
    if isinstance(e, tirx.Var):
        return {(e.name,): 1}
    if isinstance(e, (tirx.Add, tirx.Sub)):
        pa, pb = _poly(e.a), _poly(e.b)
        if pa is None or pb is None:
            return None
        sign = 1 if isinstance(e, tirx.Add) else -1
        out = dict(pa)
        for m, c in pb.items():
            out[m] = out.get(m, 0) + sign * c
        return {m: c for m, c in out.items() if c}
    if isinstance(e, tirx.Mul):
        pa, pb = _poly(e.a), _poly(e.b)
        if pa is None or pb is None:
            return None
        out = {}
        for ma, ca in pa.items():
            for mb, cb in pb.items():
                m = tuple(sorted(ma + mb))
                out[m] = out.get(m, 0) + ca * cb
        return {m: c for m, c in out.items() if c}
    if isinstance(e, tirx.FloorDiv) and isinstance(e.b, tirx.IntImm) and int(e.b) > 0:
        pa, d = _poly(e.a), int(e.b)
        if pa is None:
            return None
        if all(c % d == 0 for c in pa.values()):
            return {m: c // d for m, c in pa.items()}
        return {(f"({sorted(pa.items())})//{d}",): 1}
    return None


def _simplify(e):
    from tvm import tirx

    if isinstance(e, (int, np.integer, bool, np.bool_)):
        return int(e)
    e = analyzer(e).simplify(e)
    return int(e.value) if isinstance(e, tirx.IntImm) else e


def _arr(values, shape=None) -> np.ndarray:
    flat = [_simplify(v) for v in np.asarray(values, dtype=object).reshape(-1)]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(np.asarray(values, dtype=object).shape if shape is None else shape)


def symbolic(value: np.ndarray) -> bool:
    return any(not isinstance(v, int) for v in value.reshape(-1))


def known_of(expr):
    """A Relax expression's known value: a small int constant or a ShapeExpr; else None."""
    from tvm import relax
    from tvm.ir.expr import GenericConst

    if isinstance(expr, GenericConst):
        if str(expr.ty.dtype) not in _INT_TYPES:
            return None
        data = expr.value.numpy()
        if data.size > MAX_ELEMENTS:
            return None
        return _arr(data.astype(np.int64).tolist(), data.shape)
    if isinstance(expr, relax.ShapeExpr):
        return _arr(list(expr.values))
    return None  # 0-D values (PrimValues) are known by name: the importer's table


def shape_value(x):
    """The shape of a Relax tensor as a known value (ints and dims), else None."""
    from tvm import relax

    shape = getattr(x.ty, "shape", None) if isinstance(x.ty, relax.TensorType) else None
    values = getattr(shape, "values", None)
    if values is None:
        return None
    return _arr(list(values))


def _ints(v) -> list | None:
    if v is None or symbolic(v):
        return None
    return [int(x) for x in v.reshape(-1)]


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def evaluate(node, inputs: list, known: list, opset: int):
    """The node's output known value (numpy object array), or None when it is not shape
    arithmetic on known values.  ``inputs``: the Relax expressions; ``known``: their known
    values (None where unknown)."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    if op == "Shape":
        v = known[0] if known[0] is not None else shape_value(inputs[0])
        if v is None:
            return None
        shape = list(v.shape) if known[0] is not None else list(v.reshape(-1))
        rank = len(shape)
        start, end = _attr(node, "start", 0), _attr(node, "end", rank)
        start = max(0, min(rank, start + rank if start < 0 else start))
        end = max(0, min(rank, end + rank if end < 0 else end))
        return _arr(shape[start:end])
    if op == "Size":
        v = shape_value(inputs[0])
        return None if v is None else _arr(np.prod(v) if v.size else 1)
    if any(k is None for k, i in zip(known, inputs) if i is not None):
        return None
    if not any(k is not None and symbolic(k) for k in known):
        return None  # all ints: the converters and constant folding handle it
    return _evaluate(node, op, known, opset)


def _evaluate(node, op, known, opset):
    from tvm import tirx

    if op == "Identity":
        return known[0]
    if op == "Cast":
        to = helper.tensor_dtype_to_np_dtype(_attr(node, "to"))
        return known[0] if np.issubdtype(to, np.integer) else None
    if op == "Gather":
        idx = _ints(known[1])
        if idx is None:
            return None
        axis = _attr(node, "axis", 0)
        return _arr(np.take(known[0], np.asarray(idx).reshape(known[1].shape), axis=axis))
    if op == "Unsqueeze":
        axes = _attr(node, "axes") if opset < 13 else _ints(known[1])
        if axes is None:
            return None
        out = known[0]
        rank = out.ndim + len(axes)
        for a in sorted(a + rank if a < 0 else a for a in axes):
            out = np.expand_dims(out, a)
        return _arr(out)
    if op == "Squeeze":
        axes = _attr(node, "axes") if opset < 13 else (_ints(known[1]) if len(known) > 1
                                                        and known[1] is not None else None)
        out = known[0]
        return _arr(np.squeeze(out, axis=tuple(axes) if axes else None))
    if op == "Concat":
        return _arr(np.concatenate([k for k in known if k is not None],
                                   axis=_attr(node, "axis", 0)))
    if op == "Reshape":
        shape = _ints(known[1])
        if shape is None:
            return None
        shape = [d if d != 0 else known[0].shape[i] for i, d in enumerate(shape)]
        return _arr(known[0].reshape(shape))
    if op == "Slice":
        if opset < 10:
            return None
        starts, ends = _ints(known[1]), _ints(known[2])
        axes = _ints(known[3]) if len(known) > 3 and known[3] is not None else None
        steps = _ints(known[4]) if len(known) > 4 and known[4] is not None else None
        if starts is None or ends is None:
            return None
        axes = axes or list(range(len(starts)))
        steps = steps or [1] * len(starts)
        sl = [slice(None)] * known[0].ndim
        for s, e, a, st in zip(starts, ends, axes, steps):
            sl[a] = slice(s, e, st)
        return _arr(known[0][tuple(sl)])
    binary = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b,
              "Mul": lambda a, b: a * b,
              # dims are >= 0: ONNX's truncating integer division is a floor division
              "Div": lambda a, b: tirx.floordiv(a, b) if not (isinstance(a, int) and
                                                              isinstance(b, int)) else a // b,
              "Max": lambda a, b: tirx.max(a, b) if not (isinstance(a, int) and
                                                         isinstance(b, int)) else max(a, b),
              "Min": lambda a, b: tirx.min(a, b) if not (isinstance(a, int) and
                                                         isinstance(b, int)) else min(a, b)}
    if op in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual") and len(known) == 2:
        a, b = np.broadcast_arrays(known[0], known[1])
        out = [_compare(op, x, y) for x, y in zip(a.reshape(-1), b.reshape(-1))]
        return None if None in out else _arr(out, a.shape)
    if op == "Not":
        return _arr(1 - known[0])
    if op == "Neg":  # a start counted from the end (x[..., -seq:])
        return _arr([-x for x in known[0].reshape(-1)], known[0].shape)
    if op == "Where" and len(known) == 3 and not symbolic(known[0]):
        c, x, y = np.broadcast_arrays(*known)
        return _arr(np.where(c.astype(bool), x, y))
    if op in binary and len(known) == 2:
        a, b = np.broadcast_arrays(known[0], known[1])
        fn = binary[op]
        return _arr([fn(x, y) for x, y in zip(a.reshape(-1), b.reshape(-1))], a.shape)
    return None


def shaped_by(bb, node, inputs, known: list):
    """Reshape / Expand / ConstantOfShape / Tile whose shape (repeats) input is a symbolic
    known value, as the Relax op on a ``ShapeExpr`` (TVM's converters take a dynamic path
    on those); None when the node is not one of those or the shape cannot be resolved."""
    from tvm import relax

    op = node.op_type
    k = 0 if op == "ConstantOfShape" else 1
    if op not in ("Reshape", "Expand", "ConstantOfShape", "Tile") or len(known) <= k or \
            known[k] is None:
        return None
    if not symbolic(known[k]) and not (
            op == "Reshape" and -1 in [int(d) for d in known[k].reshape(-1)]
            and shape_value(inputs[0]) is not None and symbolic(shape_value(inputs[0]))):
        # (a constant target: TVM's converter, but for a -1 over a symbolic input, which
        # _quotient infers in a form later shapes equal)
        return None
    target = list(known[k].reshape(-1))
    if op == "ConstantOfShape":
        attr = _attr(node, "value")
        from onnx import numpy_helper

        fill = numpy_helper.to_array(attr).reshape(-1) if attr is not None else \
            np.zeros(1, np.float32)
        return relax.op.full(relax.ShapeExpr([_expr(d) for d in target]),
                             relax.const(fill[0], str(fill.dtype)), str(fill.dtype))
    data = shape_value(inputs[0])
    if data is None:
        return None
    data = list(data)
    if op == "Tile":
        return _tile(bb, inputs[0], data, list(known[1].reshape(-1)))
    if op == "Reshape":
        if _attr(node, "allowzero", 0):
            return None
        out = [data[i] if (isinstance(d, int) and d == 0) else d for i, d in enumerate(target)]
        if sum(isinstance(d, int) and d == -1 for d in out) == 1:
            rest = [d for d in out if not (isinstance(d, int) and d == -1)]
            inferred = _quotient(data, rest)
            if inferred is None:
                total = np.prod(np.array(data, dtype=object)) if data else 1
                part = np.prod(np.array(rest, dtype=object)) if rest else 1
                inferred = _simplify(_floordiv(total, part))
            out = [inferred if (isinstance(d, int) and d == -1) else d for d in out]
        if any(isinstance(d, int) and d < 0 for d in out):
            return None
        return relax.op.reshape(inputs[0], relax.ShapeExpr([_expr(d) for d in out]))
    # Expand: numpy broadcasting of the data shape with the target
    rank = max(len(data), len(target))
    a = [1] * (rank - len(data)) + data
    b = [1] * (rank - len(target)) + target
    out = []
    for x, y in zip(a, b):
        if isinstance(y, int) and y == 1:
            out.append(x)
        elif isinstance(x, int) and x == 1:
            out.append(y)
        elif _compare("Equal", x, y) == 1:
            out.append(x)
        else:
            return None
    return relax.op.broadcast_to(inputs[0], relax.ShapeExpr([_expr(d) for d in out]))


def _quotient(dims: list, known: list):
    """A Reshape's -1: the product of ``dims`` over that of ``known``, as a product of the
    symbolic dims ``known`` does not hold times the static quotient, or None when the
    symbolic dims do not cancel one for one (or the static ones do not divide).  Computed
    as TVM would (``32 * h' * w' // 32``) the simplifier expands the first product and
    cannot divide it again: ``((h' - 1) * 32 + 32) * w' // 32``, which no later shape
    equals (SegFormer's residual adds lost their shapes, and its arena check refused a
    tensor whose size it could not bound)."""
    left = [d for d in dims if not isinstance(d, (int, np.integer))]
    static = int(np.prod([int(d) for d in dims if isinstance(d, (int, np.integer))]))
    part = 1
    for d in known:
        if isinstance(d, (int, np.integer)):
            part *= int(d)
            continue
        match = next((i for i, e in enumerate(left) if provably_equal(e, d)), None)
        if match is None:
            return None
        left.pop(match)
    if part == 0 or static % part:
        return None
    out = None
    for d in left:  # symbolic first, the constant last: (h' * w') * 32 stays a product
        out = d if out is None else out * d
    if out is None:
        return static // part
    return _simplify(out if static == part else out * (static // part))


def _tile(bb, x, data: list, repeats: list):
    """Tile by symbolic repeats (DeBERTa's ``pos_key.repeat(q.size(0) // heads, 1, 1)``:
    repeats ``[batch, 1, 1]``) as ``tile(x, r) => reshape(broadcast_to(reshape(x, [1, d]),
    [r, d]), [r * d])``, one ``(r, d)`` pair per axis whose repeat is not 1.  TVM's Tile
    converter takes the dynamic path on those, whose output dims are fresh vars that no
    later op can relate to the batch (DeBERTa's matmul then fails to legalize)."""
    from tvm import relax

    if len(repeats) != len(data):
        return None  # ONNX requires one repeat per axis; TVM's converter reports it
    split, grown, out = [], [], []
    for d, r in zip(data, repeats):
        if isinstance(r, int) and r == 1:
            split.append(d)
            grown.append(d)
            out.append(d)
        else:
            split += [1, d]
            grown += [r, d]
            out.append(_simplify(r * d))
    shape = lambda dims: relax.ShapeExpr([_expr(v) for v in dims])  # noqa: E731
    y = bb.emit(relax.op.reshape(x, shape(split)))
    y = bb.emit(relax.op.broadcast_to(y, shape(grown)))
    return relax.op.reshape(y, shape(out))


def _floordiv(a, b):
    from tvm import tirx

    return a // b if isinstance(a, int) and isinstance(b, int) else tirx.floordiv(a, b)


def _compare(op, a, b) -> int | None:
    """1 / 0 when the analyzer proves ``a op b`` true / false, else None (not decidable at
    compile time: the node is left to its converter)."""
    from tvm import tirx

    ana = analyzer(a, b)
    a, b = (tirx.IntImm("int64", v) if isinstance(v, int) else v for v in (a, b))
    cond = {"Equal": lambda: a == b, "Greater": lambda: a > b, "Less": lambda: a < b,
            "GreaterOrEqual": lambda: a >= b, "LessOrEqual": lambda: a <= b}[op]()
    if op == "Equal":
        cond = tirx.EQ(a, b)
    if ana.can_prove(cond):
        return 1
    if ana.can_prove(tirx.Not(cond)):
        return 0
    return None


def output_dtype(node, inputs) -> str:
    """The ONNX dtype of a shape-arithmetic node's output (numpy name)."""
    if node.op_type in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not"):
        return "bool"
    if node.op_type == "Cast":
        return helper.tensor_dtype_to_np_dtype(_attr(node, "to")).name
    if node.op_type in ("Shape", "Size"):
        return "int64"
    k = 1 if node.op_type == "Where" else 0
    dtype = getattr(inputs[k].ty, "dtype", None) if inputs[k] is not None else None
    return str(dtype) if dtype is not None and str(dtype) in _INT_TYPES else "int64"


def to_relax(bb, value: np.ndarray, dtype: str = "int64"):
    """A known value as Relax: a constant, a ShapeExpr (1-D), a PrimValue (0-D), or (other
    ranks) a kernel computing it."""
    from tvm import relax

    if not symbolic(value):
        return relax.const(np.array(value.tolist(), dtype=dtype), dtype)
    if value.ndim == 1 and dtype == "int64":
        return relax.ShapeExpr([_expr(v) for v in value])
    if value.ndim == 0 and dtype == "int64":
        return relax.prim_value(_expr(value.item()))
    return materialize(bb, value, dtype)


def _expr(v):
    from tvm import tirx

    if isinstance(v, int):
        return tirx.IntImm("int64", v)
    return v if str(v.ty.dtype) == "int64" else tirx.Cast("int64", v)


def _dims_of(exprs) -> list:
    """The dim Vars the expressions read, in a stable order."""
    from tvm import tirx

    found = {}
    for e in exprs:
        if not isinstance(e, (int, tirx.IntImm)):
            for v in tirx.analysis.undefined_vars(e):
                found.setdefault(v.name, v)
    return [found[k] for k in sorted(found)]


def _emit_te(bb, build, exprs, name: str, opaque: bool = False):
    """``bb.emit_te`` of ``build(substitute)`` with the dims the expressions read passed as
    scalar arguments (PrimValues), not left free: FuseTIR drops free vars' tir_vars.
    ``opaque``: the kernel is marked opaque (``op_pattern`` 8), so FuseOps leaves it alone."""
    from tvm import tirx

    dims = _dims_of(exprs)

    def fn(*args):
        vmap = dict(zip((d.name for d in dims), args))

        return build(lambda e: e if isinstance(e, (int, tirx.IntImm)) else _subst(e, vmap))

    call = bb.call_te(fn, *dims, primfunc_name_hint=name)
    if opaque:
        mark_opaque(bb, call)
    return bb.emit(call)


def mark_opaque(bb, call) -> None:
    """Mark the kernel of ``call`` (a ``call_tir``) opaque (``op_pattern`` 8, TVM's
    kOpaque, which AnnotateTIROpPattern keeps), so FuseOps leaves it alone."""
    gv = call.args[0]
    bb.update_func(gv, bb.get()[gv].with_attr("op_pattern", 8))


def _subst(e, vmap):
    """``e`` with its dim Vars replaced by ``vmap`` ({name: expr}), rebuilt bottom up."""
    from tvm import tirx

    if isinstance(e, tirx.Var):
        return vmap.get(e.name, e)
    if isinstance(e, tirx.IntImm):
        return e
    if isinstance(e, tirx.Cast):
        return tirx.Cast(str(e.ty.dtype), _subst(e.value, vmap))
    for cls, fn in ((tirx.Add, lambda a, b: a + b), (tirx.Sub, lambda a, b: a - b),
                    (tirx.Mul, lambda a, b: a * b), (tirx.FloorDiv, tirx.floordiv),
                    (tirx.FloorMod, tirx.floormod), (tirx.Max, tirx.max),
                    (tirx.Min, tirx.min)):
        if isinstance(e, cls):
            return fn(_subst(e.a, vmap), _subst(e.b, vmap))
    raise ValueError(f"shape expression {e} ({type(e).__name__}) cannot be rebuilt")


def materialize(bb, value: np.ndarray, dtype: str = "int64"):
    """A known value as a tensor: a kernel that writes each element (the dims it reads
    are its scalar arguments)."""
    from tvm import te, tirx

    flat = [_expr(v) for v in value.reshape(-1)]
    shape = list(value.shape)

    def build(sub):
        vals = [sub(v) for v in flat]

        def elem(*idx):
            k = 0
            for i, n in zip(idx, shape):
                k = k * n + i
            out = vals[-1]
            for j in range(len(vals) - 2, -1, -1):
                out = tirx.Select(k == j, vals[j], out)
            return out.astype(dtype)

        return te.compute(shape, elem, name="shape_value")

    call = _emit_te(bb, build, flat, "shape_value", opaque=True)
    # Kept out of fusion (opaque): fused with a kernel whose buffer shapes define the same
    # dims (GPT-2's exported causal mask: Range(past + seq) compared with Shape(past)),
    # TVM 0.27's FuseTIR defines the dim twice and RenewDefs aborts ("VarRemapGet(source)
    # == nullptr").  A kernel writing a few ints costs nothing on its own.
    return call


def arange(bb, start, limit, delta, dtype: str):
    """ONNX Range over known scalars (at least one symbolic): a kernel of length
    ``max(ceil((limit - start) / delta), 0)``; its output shape names the dims, its values
    take them as scalar arguments."""
    from tvm import te, tirx

    s, l, d = (_expr(v) for v in (start, limit, delta))
    if not isinstance(d, tirx.IntImm) or d.value == 0:
        return None
    step = int(d.value)
    n = tirx.max(tirx.floordiv(l - s + (step - 1 if step > 0 else step + 1), step),
                 tirx.IntImm("int64", 0))
    n = _simplify(n)

    def build(sub):
        first = sub(s)
        return te.compute([n], lambda i: (first + i * step).astype(dtype), name="range")

    return _emit_te(bb, build, [s], "range")


def check_slice_bounds(out, label: str):
    """``out`` (a converted Slice), its symbolic bounds kept within the static axes.

    TVM's converter reads symbolic starts / ends as in bounds (``assume_inbound``: ONNX
    clamps them to the axis, TVM does not), so ``position_ids[:, :seq]`` of CLIP's
    77-entry table is ``seq`` long and read past the table for ``seq > 77``: garbage
    positions, then a crash in the embedding gather (onnxruntime refuses such an input at
    the add after it).  Where the dims' ranges (declared, else the default one) let a bound
    of one dim pass the axis, the largest value that keeps it within is recorded as the
    dim's cap (``declared_ranges`` yields them; ``lowering/symbolic.resolve_ranges``
    narrows the range to it and the compile warns); a bound no such cap keeps within is
    refused."""
    from tvm import relax, tirx

    from ..errors import DimRangeError

    if not (isinstance(out, relax.Call) and getattr(out.op, "name", "") == "relax.strided_slice"
            and bool(out.attrs.assume_inbound)):
        return out
    dims = getattr(getattr(getattr(out.args[0], "ty", None), "shape", None), "values", None)
    if dims is None:
        return out
    axes, begins, ends, steps = [int(a) for a in out.args[1]], *(list(t) for t in out.args[2:])
    caps = _CAPS.get()
    clamped = False
    for k, axis in enumerate(axes):
        size, step = dims[axis], steps[k]
        if not (isinstance(size, tirx.IntImm) and isinstance(step, tirx.IntImm)
                and int(step) > 0):
            continue
        for which, bounds in (("begin", begins), ("end", ends)):
            bound = bounds[k]
            if isinstance(bound, tirx.IntImm):
                # a constant past the axis ("to the end": INT64_MAX beside a symbolic
                # start, MPT's alibi[..., 2048 - seq:]) is the axis' size, as ONNX clamps it
                if int(bound) > int(size):
                    bounds[k], clamped = tirx.IntImm(str(bound.ty), int(size)), True
                continue
            ana = bounded_analyzer(bound)
            if ana.can_prove(bound < 0):
                # from the axis' end (-seq), as ONNX reads it: TVM would index with it
                bound = bound + size
                bounds[k], clamped = bound, True
            if ana.can_prove(bound >= 0) and ana.can_prove(bound <= size):
                continue
            fit = _largest_fitting(bound, int(size))
            if fit is not None and caps is not None:
                name, largest = fit
                why = (f"{label} slices axis {axis} ({int(size)} elements) with {which} "
                       f"{bound}, outside it for {name} > {largest}")
                if name not in caps or largest < caps[name][0]:
                    caps[name] = (largest, why)
                continue
            ranges = ", ".join(f"{n}={lo}..{hi}" for n, (lo, hi) in
                               declared_range_of(bound).items())
            raise DimRangeError(
                f"{label}: its {which} {bound} on axis {axis} can leave the axis' {int(size)} "
                f"elements over {ranges} (ONNX clamps it there, and the shapes after it "
                "no longer agree); declare ranges that keep it within (--dim NAME=MIN..MAX, "
                "API: dims=)")
    if clamped:
        return relax.op.strided_slice(out.args[0], axes, begins, ends, steps,
                                      assume_inbound=True)
    return out


def _largest_fitting(bound, size: int):
    """(dim, its largest value with ``0 <= bound <= size`` there and below) for a bound of
    one dim that holds at the dim's min; else None."""
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    dims = tirx.analysis.undefined_vars(bound)
    if len(dims) != 1:
        return None
    v = dims[0]
    lo, hi = declared_range_of(bound)[v.name]

    def fits(x):
        ana = Analyzer()
        ana.bind(v, tirx.IntImm(str(v.ty), x))
        e = ana.simplify(bound)
        return isinstance(e, tirx.IntImm) and 0 <= int(e) <= size

    if not fits(lo):
        return None
    while lo < hi:  # bisect for the last value within the axis (the bound is monotone)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return v.name, lo
