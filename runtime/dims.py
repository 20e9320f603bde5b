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

__all__ = ["ShapeExpr", "DimError", "bind_dims", "call_kernels", "check_expr", "pick_variant",
           "variant_choices"]

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


def call_kernels(call: dict) -> list:
    """Every kernel a graph call may run: its own, then its row-tile variants'
    (compiler/lowering/row_variants.py; ``rows_variant``: an artifact of an older onnxc)."""
    if call.get("row_variants"):
        return [c[0] for c in call["row_variants"]["choices"]]
    if call.get("rows_variant"):
        return [call["kernel"], call["rows_variant"]["kernel"]]
    return [call["kernel"]]


def variant_choices(call: dict) -> tuple | None:
    """(row count expression text, [(kernel, tile, cost)]) of a call with row-tile variants
    (the call's own kernel first), else None."""
    v = call.get("row_variants")
    if v is not None:
        return v["rows"], [(k, int(t), float(c)) for k, t, c in v["choices"]]
    v = call.get("rows_variant")  # older artifacts: a one-row kernel and its padded twin
    if v is not None:
        return v["rows"], [(call["kernel"], 1, 1.5), (v["kernel"], int(v["tile"]), 1.0)]
    return None


def pick_variant(rows: int, choices) -> int:
    """Index of the choice (``(kernel, tile, cost)``) that runs ``rows`` rows fastest: the
    least rows computed (``rows`` padded to whole ``tile``-row tiles) times the tile's time
    per row (``cost``); ties go to the larger tile.  A one-row kernel (tile 1, cost 1.5)
    against its 12-row padded variant (cost 1): the variant from 8 rows (GPT-2 prefill,
    one thread, Zen 3, one-row build / 6-row variant (ms): 2 rows 48 / 43, 4 rows 69 / 67,
    7 rows 95 / 102, 12 rows 153 / 122, 64 rows 535 / 374)."""
    costs = [-(-max(rows, 1) // t) * t * c for _, t, c in choices]
    return min(range(len(costs)), key=lambda i: (costs[i], -choices[i][1]))
