"""Symbolic dimensions at run time: shape expressions, binding them from the feeds, ranges.

A model compiled with symbolic input dimensions (ONNX ``dim_param``) keeps them symbolic:
every tensor shape in the graph is a list whose entries are ints or *expressions* of the
named dims, written as strings in a tiny Python subset (``"seq"``, ``"batch * seq"``,
``"(seq + 15) // 16"``, ``"max(seq, 1)"``): names, non-negative ints, ``+ - * // %``,
``min`` and ``max``.  ``graph["dims"]`` lists the dims with their declared range::

    dims: [{name, min, max, opt, declared}]

At ``run()`` the session binds each dim from the shapes of the inputs that carry it as a
bare name (every input that carries it must agree), refuses a value outside the range
(naming the input, axis, dim, value and range), and evaluates every shape from the bound
values.  Nothing here imports the compiler.
"""

from __future__ import annotations

import ast

__all__ = ["ShapeExpr", "DimError", "bind_dims", "check_expr", "use_variant"]

_ALLOWED_BIN = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
_FUNCS = {"min": min, "max": max}


class DimError(ValueError):
    """A feed whose symbolic dims are inconsistent or outside their declared range."""


def check_expr(text: str, names) -> ast.Expression:
    """Parse ``text`` and refuse anything outside the shape-expression subset (no
    attribute access, calls other than min/max, names other than ``names``)."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"shape expression {text!r} does not parse: {e.msg}") from None
    for node in ast.walk(tree):
        if node is tree.body and isinstance(node, ast.Tuple):  # a whole shape
            continue
        if isinstance(node, (ast.Expression, ast.Load)) or isinstance(node, _ALLOWED_BIN):
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, _ALLOWED_BIN):
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            continue
        if isinstance(node, ast.Name) and (node.id in names or node.id in _FUNCS):
            continue
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _FUNCS and not node.keywords and len(node.args) == 2):
            continue
        raise ValueError(f"shape expression {text!r}: {ast.dump(node)[:60]} is not allowed "
                         f"(names {sorted(names)}, ints, + - * // %, min, max)")
    return tree


class ShapeExpr:
    """A shape: ints and expressions of named dims, evaluated against a binding."""

    __slots__ = ("dims", "_code", "static")

    def __init__(self, dims, names=()):
        self.dims = list(dims)
        self.static = all(isinstance(d, int) for d in self.dims)
        self._code = None
        if not self.static:
            text = "(" + ", ".join(str(d) for d in self.dims) + ",)"
            self._code = compile(check_expr(text, set(names)), "<shape>", "eval")

    def __call__(self, binding: dict) -> tuple:
        if self.static:
            return tuple(self.dims)
        return eval(self._code, {"__builtins__": {}, **_FUNCS}, binding)  # checked subset


def bind_dims(dims: list, inputs: list, feeds: dict) -> dict:
    """{dim name: value} from the fed arrays, checked against the declared ranges.

    ``dims``: ``graph["dims"]``; ``inputs``: [(input name, declared shape)] where the shape
    holds ints and dim names; ``feeds``: {input name: array}.  Raises DimError naming the
    input, axis, dim, value and range.
    """
    ranges = {d["name"]: d for d in dims}
    binding: dict = {}
    seen: dict = {}
    for name, shape in inputs:
        got = feeds[name].shape
        if len(got) != len(shape):
            raise DimError(f"input {name!r}: expected rank {len(shape)} (shape {shape}), got "
                           f"shape {list(got)}")
        for axis, (want, value) in enumerate(zip(shape, got)):
            if isinstance(want, int):
                if want != value:
                    raise DimError(f"input {name!r}: axis {axis} must be {want}, got {value} "
                                   f"(shape {list(got)}; expected {shape})")
                continue
            if want not in ranges:  # an expression: checked below, once every name is bound
                continue
            r = ranges[want]
            if value > r["max"] and "narrowed" in r:
                raise DimError(
                    f"input {name!r}: axis {axis} is dim {want!r} = {value}, above the "
                    f"{r['max']} the model runs at: {r['narrowed']['why']}")
            if not r["min"] <= value <= r["max"]:
                raise DimError(
                    f"input {name!r}: axis {axis} is dim {want!r} = {value}, outside the range "
                    f"{r['min']}..{r['max']} the model was compiled for"
                    f"{'' if r.get('declared', True) else ' (the default range)'}; recompile "
                    f"with --dim {want}=MIN..MAX (dims={{{want!r}: (min, max, opt)}})")
            if want in binding and binding[want] != value:
                other, other_axis = seen[want]
                raise DimError(f"input {name!r}: axis {axis} is dim {want!r} = {value}, but "
                               f"input {other!r} axis {other_axis} gave {want!r} = "
                               f"{binding[want]}; inputs sharing a dim must agree")
            binding[want] = value
            seen[want] = (name, axis)
    missing = [d["name"] for d in dims if d["name"] not in binding]
    if missing:  # a dim only reachable through an expression (never produced by our import)
        raise DimError(f"dims {missing} cannot be bound from the inputs' shapes")
    for name, shape in inputs:  # expressions over bound names
        if any(isinstance(d, str) and d not in ranges for d in shape):
            want = ShapeExpr(shape, ranges)(binding)
            if tuple(want) != tuple(feeds[name].shape):
                raise DimError(f"input {name!r}: expected shape {shape} = {list(want)} for "
                               f"{binding}, got {list(feeds[name].shape)}")
    return binding


def use_variant(rows: int, tile: int) -> bool:
    """Whether a one-row kernel's padded variant (compiler/lowering/row_variants.py) runs
    ``rows`` rows: when padding them to whole ``tile``-row register tiles adds at most half
    of them (a padded row costs about half a one-row one, plus the tile's fixed costs).
    GPT-2 prefill, one thread, Zen 3, one-row build / with variants (ms): 2 rows 48 / 43
    (variant not used), 4 rows 69 / 67, 7 rows 95 / 102 (12 padded rows), 12 rows 153 /
    122, 64 rows 535 / 374."""
    return rows > 1 and 2 * (-(-rows // tile) * tile) <= 3 * rows
