"""Symbolic dims at compile time: their ranges, and shapes as expressions of them.

A symbolic input dimension (``dim_param``) is imported as a ``tirx.Var`` named after it
(``frontend/importer.py``) and stays symbolic through the passes, lowering and the
kernels.  Here:

* :func:`resolve_ranges`: each dim's ``(min, max, opt)`` from ``dims=`` / ``--dim``, else
  :data:`DEFAULT_RANGE` (reported as not declared);
* :func:`annotate_dim_opt`: each kernel over symbolic dims carries their ``opt`` values
  (attribute :data:`DIM_OPT_ATTR`), so a schedule rule can pick the schedule for the size
  it will mostly run at (a decoder compiled with ``seq`` opt 1: its one-token steps), and
  their ranges (:data:`DIM_RANGE_ATTR`), which the build states to TVM's lowering
  (``assume_dim_ranges.py``);
* :func:`expr_text`: a TIR shape expression as the runtime's expression text
  (``runtime/dims.py``), refusing what the runtime could not bind;
* :func:`monotone`: whether a size expression never shrinks when a dim grows.  The arena is
  planned with every size at the dims' maxima; the offsets stay valid for every smaller
  binding only because each buffer's size is monotone non-decreasing in every dim (a
  buffer that fits at MAX fits below it, and lifetimes do not depend on the dims).  Sizes
  built from dims, non-negative ints, ``+``, ``*``, ``//`` by a positive int,
  ``min``/``max`` and ``x - c`` are monotone; anything else is refused.
"""

from __future__ import annotations

from ..errors import UnsupportedError

# Undeclared dims: 1..DEFAULT_MAX, optimised for DEFAULT_MAX.  It bounds the arena (planned
# for the maxima): BERT-base at batch 128 x seq 128 plans ~1.3 GB; declare a range
# (--dim NAME=MIN..MAX[:OPT]) for anything else.  The report lists every defaulted dim.
DEFAULT_MIN, DEFAULT_MAX = 1, 128
DEFAULT_RANGE = (DEFAULT_MIN, DEFAULT_MAX, DEFAULT_MAX)


# The kernel attribute {dim name: opt} that annotate_dim_opt sets (left out of tuning keys).
DIM_OPT_ATTR = "onnxc.dim_opt"
# ... and {dim name: [min, max]}: asserted at the build (assume_dim_ranges.py), not keyed
DIM_RANGE_ATTR = "onnxc.dim_range"


def parse_dim_option(text: str) -> tuple[str, tuple]:
    """``NAME=MIN..MAX[:OPT]`` (the CLI's ``--dim``) -> (name, (min, max, opt))."""
    name, eq, rest = text.partition("=")
    rng, _, opt = rest.partition(":")
    lo, dots, hi = rng.partition("..")
    try:
        if not (name and eq and dots):
            raise ValueError
        lo, hi = int(lo), int(hi)
        opt = int(opt) if opt else hi
    except ValueError:
        raise ValueError(f"--dim {text!r}: expected NAME=MIN..MAX[:OPT] with integers, e.g. "
                         "seq=1..512:128") from None
    return name, (lo, hi, opt)


def resolve_ranges(names: list, declared: dict | None, where: str = "model",
                   caps: dict | None = None) -> list[dict]:
    """[{name, min, max, opt, declared}] for the model's symbolic dims, in first-use order.

    ``declared``: {name: (min, max) or (min, max, opt)}.  A name the model does not have is
    refused (a typo would otherwise silently keep the default).  Bad ranges raise
    ValueError (a bad argument, as ``input_shapes=`` does: never deferred to run time).
    ``caps``: {name: (largest value, why)} the import found the model valid up to
    (``frontend/shape_arith.check_slice_bounds``): a range above one is narrowed to it
    (max, and opt if above), the entry's ``narrowed`` giving the asked max and why."""
    declared = dict(declared or {})
    unknown = sorted(set(declared) - set(names))
    if unknown:
        raise ValueError(f"{where}: dims={unknown} name no symbolic input dimension; the "
                           f"model's are {names or 'none (all input shapes are static)'}")
    out = []
    for name in names:
        if name in declared:
            rng = tuple(int(v) for v in declared[name])
            if len(rng) == 2:
                rng = (*rng, rng[1])
            if len(rng) != 3:
                raise ValueError(f"{where}: dims[{name!r}] = {declared[name]}: expected "
                                   "(min, max) or (min, max, opt)")
            lo, hi, opt = rng
            # min 0 is allowed: an empty past key/value cache at a decoder's prefill step
            # (kernels see a zero extent; the runtime binds empty tensors to no memory)
            if not (0 <= lo <= opt <= hi and opt >= 1):
                raise ValueError(f"{where}: dims[{name!r}] = {declared[name]}: need "
                                   "0 <= min <= opt <= max, opt >= 1")
            out.append({"name": name, "min": lo, "max": hi, "opt": opt, "declared": True})
        else:
            lo, hi, opt = DEFAULT_RANGE
            out.append({"name": name, "min": lo, "max": hi, "opt": opt, "declared": False})
        cap, why = (caps or {}).get(name, (None, None))
        if cap is not None and out[-1]["max"] > cap:
            d = out[-1]
            d["narrowed"] = {"max": d["max"], "why": why}
            d["max"], d["opt"] = cap, min(d["opt"], cap)
    return out


def expr_text(e, names, what: str) -> str | int:
    """A TIR integer expression as an int or as ``runtime/dims.py`` expression text."""
    from tvm import tirx

    def go(x) -> str:
        if isinstance(x, tirx.IntImm):
            if x.value < 0:
                return f"(0 - {-int(x.value)})"
            return str(int(x.value))
        if isinstance(x, tirx.Var):
            if x.name not in names:
                raise UnsupportedError(
                    f"{what}: dimension {x.name!r} is computed inside the model (not an input "
                    f"dim: {sorted(names)}), so the runtime cannot bind it")
            return x.name
        if isinstance(x, tirx.Cast):
            return go(x.value)
        for cls, op in ((tirx.Add, "+"), (tirx.Sub, "-"), (tirx.Mul, "*"),
                        (tirx.FloorDiv, "//"), (tirx.FloorMod, "%")):
            if isinstance(x, cls):
                return f"({go(x.a)} {op} {go(x.b)})"
        for cls, fn in ((tirx.Max, "max"), (tirx.Min, "min")):
            if isinstance(x, cls):
                return f"{fn}({go(x.a)}, {go(x.b)})"
        raise UnsupportedError(f"{what}: shape expression {x} ({type(x).__name__}) is not "
                               "one the runtime evaluates")

    if isinstance(e, tirx.IntImm):
        return int(e.value)
    text = go(e)
    return text[1:-1] if text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]) \
        else text


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += c == "("
        depth -= c == ")"
        if depth < 0:
            return False
    return depth == 0


def monotone(e) -> bool:
    """True when the TIR expression ``e`` never decreases as any dim grows (see above)."""
    from tvm import tirx

    if isinstance(e, tirx.IntImm):
        return e.value >= 0
    if isinstance(e, tirx.Var):
        return True
    if isinstance(e, tirx.Cast):
        return monotone(e.value)
    if isinstance(e, (tirx.Add, tirx.Mul, tirx.Max, tirx.Min)):
        return monotone(e.a) and monotone(e.b)
    if isinstance(e, tirx.FloorDiv):
        return monotone(e.a) and isinstance(e.b, tirx.IntImm) and e.b.value > 0
    if isinstance(e, tirx.Sub):
        return monotone(e.a) and isinstance(e.b, tirx.IntImm)
    return False


def dim_vars(func) -> dict:
    """{name: Var} of the dims ``func``'s signature uses: its int scalar parameters (a
    past length: T.int64) and the variables of its buffers' shapes ([.., dim]; TVM 0.27:
    a buffer parameter is a ``Var`` whose type holds the buffer's shape)."""
    import tvm
    from tvm import tirx

    out = {}
    for p in func.params:
        shape = getattr(p, "shape", None)
        if shape is None:
            if str(p.ty).startswith("int"):
                out.setdefault(p.name, p)
            continue
        for e in shape:
            if isinstance(e, (int, tirx.IntImm)):
                continue
            try:
                for v in tirx.analysis.undefined_vars(e):
                    out.setdefault(v.name, v)
            except tvm.error.InternalError:  # no expression (a scalar's shape)
                pass
    return out


def annotate_dim_opt(prim_funcs: dict, at_opt: dict, ranges: dict | None = None) -> dict:
    """``prim_funcs`` with :data:`DIM_OPT_ATTR` ``{dim: opt}`` on each kernel whose buffer
    shapes or scalar parameters use dims of ``at_opt`` (the others unchanged), and
    :data:`DIM_RANGE_ATTR` ``{dim: [min, max]}`` of those in ``ranges`` ({dim: (min,
    max)})."""
    out = {}
    for name, f in prim_funcs.items():
        used = {n for n in dim_vars(f) if n in at_opt}
        if used:
            f = f.with_attr(DIM_OPT_ATTR, {n: at_opt[n] for n in sorted(used)})
            bounded = {n: [int(ranges[n][0]), int(ranges[n][1])]
                       for n in sorted(used) if n in (ranges or {})}
            if bounded:
                f = f.with_attr(DIM_RANGE_ATTR, bounded)
        out[name] = f
    return out
