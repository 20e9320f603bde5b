"""Kernels written already scheduled, as TVMScript templates: what they share.

``schedules/cpu/topk.py``, ``scan.py``, ``arg_rows.py``, ``tile.py`` and ``pad.py`` (their
converters emit them on CPU targets) build a function body as text; ``kernel`` wraps it:

* the attributes: ``onnxc.prescheduled`` naming the rule (``schedules.apply_schedules``
  keeps such a kernel as it is) and ``op_pattern`` 8 (TVM's kOpaque: FuseOps leaves it
  alone);
* the body goes in a root block (TVM's reshape detection, RewriteDataflowReshape, expects
  one in every kernel it inspects), which TVMScript's well-formedness check does not
  accept around plain loops: the check is off;
* per-task state is allocated ``"global"``, not ``"local"``: TVM puts small global
  allocations on the stack and takes local ones from the runtime's workspace allocator
  (three calls per row of a TopK, most of its time).

``axis_views``: a kernel over one axis of an N-D tensor indexes ``[outer, axis, inner]``:
each argument is matched at its own N-D shape (so the Relax call needs no reshape: a
reshape of a kernel's result into a graph output stays a copy kernel) and viewed as 3-D
over the same data (``T.decl_buffer``).  A static dim is a literal, a symbolic one a
variable of the kernel bound from the argument at each call.  ``row_loop``: a row copy as
explicit vector steps.
"""

from __future__ import annotations

import math

from .recurrence import PRESCHEDULED


def kernel(params: str, rule: str, body: str):
    """The PrimFunc ``main(params)`` of ``body`` (TVMScript, indented 4), already
    scheduled under ``rule``."""
    import tvm

    src = (f"@T.prim_func(private=True)\ndef main({params}):\n"
           f'    T.func_attr({{"tirx.noalias": True, "{PRESCHEDULED}": "{rule}", '
           f'"op_pattern": 8}})\n{body}')
    return tvm.script.from_source(src, check_well_formed=False)


def indent(text, n: int) -> str:
    """``text`` (a string of lines, or a list of them) with every line indented by ``n``."""
    lines = text if isinstance(text, list) else text.rstrip("\n").split("\n")
    return "\n".join(" " * n + line for line in lines)


def dim_exprs(shape: list) -> list:
    """TVMScript of each dim: a static one a literal, a symbolic one (None) the variable
    ``d<i>`` that ``axis_views`` declares."""
    return [f"T.int64({d})" if d is not None else f"d{i}" for i, d in enumerate(shape)]


def shape_text(exprs: list) -> str:
    """The inside of a TVMScript shape tuple (``()`` for a scalar)."""
    return ", ".join(exprs) + ("," if exprs else "")


def static_copy_params(shape: list, out: list, dtype: str) -> str:
    """The parameters ``x``, ``y`` of a kernel from a static ``shape`` to ``out``."""
    return (f'x: T.Buffer(({shape_text(dim_exprs(shape))}), "{dtype}"), '
            f'y: T.Buffer(({shape_text(dim_exprs(out))}), "{dtype}")')


def _product(terms: list) -> str:
    return " * ".join(terms) if terms else "T.int64(1)"


def axis_views(shape: list, axis: int, buffers: list) -> tuple:
    """(declarations, views, O, N, I): TVMScript lines for the body's start (before the
    root block), lines for inside it, and the view's extents.

    ``shape``: each dim an int, or None where symbolic; ``buffers``: (handle, view name,
    dtype, axis length or None for the input's) per argument, in order.  The declarations
    bind the symbolic dims and match each handle at its N-D shape, the views declare each
    3-D view; O, N, I are TVMScript expressions (I a literal when every inner dim is
    static)."""
    dims = dim_exprs(shape)
    lines = [f"d{i} = T.int64()" for i, d in enumerate(shape) if d is None]
    inner = shape[axis + 1:]
    o = _product(dims[:axis])
    i = f"T.int64({math.prod(inner)})" if None not in inner else _product(dims[axis + 1:])
    views = []
    for handle, name, dtype, length in buffers:
        nd = list(dims)
        if length is not None:
            nd[axis] = f"T.int64({length})"
        lines.append(f"{name}_nd = T.match_buffer({handle}, ({shape_text(nd)}), \"{dtype}\")")
        views.append(f"{name} = T.decl_buffer(({o}, {nd[axis]}, {i}), \"{dtype}\", "
                     f"data={name}_nd.data)")
    return lines, views, o, dims[axis], i


# elements per vectorised step of a row copy (row_loop): four AVX-512 vectors of fp32
ROW_STEP = 64


def row_loop(count: int, stmt) -> list:
    """TVMScript lines of a loop ``w`` over ``count`` elements of a row, as explicit vector
    steps (``stmt(w_expr)``: the statement for one element): steps of ROW_STEP, then the
    rest as one vector.  Explicit: a plain loop of constant count inside a parallel loop
    over rows was unrolled by LLVM, which then vectorised the loop over rows, every access
    a gather or a scatter (a reflect pad 3x slower than onnxruntime that way)."""
    lines = []
    head = count - count % ROW_STEP
    if head:
        lines += [f"for wo in range(T.int64({head // ROW_STEP})):",
                  f"    for wi in T.vectorized(T.int64({ROW_STEP})):",
                  "        " + stmt(f"wo * T.int64({ROW_STEP}) + wi")]
    rest = count - head
    if rest > 1:
        lines += [f"for wi in T.vectorized(T.int64({rest})):",
                  "    " + stmt(f"T.int64({head}) + wi")]
    elif rest == 1:
        lines.append(stmt(f"T.int64({head})"))
    return lines
