"""Each kernel over symbolic dims states their declared ranges to TVM's lowering.

``annotate_dim_opt`` (``symbolic.py``) records on each such kernel the ``--dim`` ranges of the
dims it uses (:data:`symbolic.DIM_RANGE_ATTR`, ``{name: [min, max]}``).  Before the build,
:func:`assume_dim_ranges` puts ``assert min <= dim <= max`` at the top of the kernel's root
block.  TVM's ``LowerIntrin`` (an analyser-carrying mutator) takes an assert's condition as
known for the statements after it, so:

* a floor division or modulo by a symbolic extent (a fused parallel loop over batch x row
  tiles x column panels is split back by ``(seq + 11) // 12``) lowers to a plain truncated
  one, not TVM's sign-agnostic ``Select`` form: it needs the divisor's sign, which a bare
  shape variable does not have;
* that matters beyond the index arithmetic: LLVM code generation binds every ``Let`` in a
  TVM analyser, which substitutes each bound value into the next, so a vectorised math
  epilogue (the polynomial ``exp`` of a sigmoid, in ``Let``s) re-simplifies the index of
  each load it reads at every use.  CLIP's text MLP (``x * sigmoid(1.702 x)`` after a matmul
  with a symbolic batch and sequence) took 31 s to build that one kernel, 0.3 s with the
  ranges stated (a static build: 0.2 s).

The runtime refuses feeds outside the declared ranges (``runtime/``), so every call meets
the assertion.  By default TVM's ``SkipAssert`` then drops it (``tirx.disable_assert``,
``parallel_build.compile_kernels``); with ``ONNXC_KERNEL_ASSERTS=1`` it stays a check.
"""

from __future__ import annotations

from .symbolic import DIM_RANGE_ATTR, dim_vars


def assume_dim_ranges(mod, state: bool = True):
    """``mod`` with each kernel's :data:`DIM_RANGE_ATTR` ranges asserted at the top of its
    root block (``state``; else not), the attribute removed; other kernels unchanged."""
    import tvm

    changed = {}
    for gv, func in mod.functions.items():
        attrs = getattr(func, "attrs", None)
        if attrs is None or DIM_RANGE_ATTR not in attrs:
            continue
        func_out = func.without_attr(DIM_RANGE_ATTR)
        cond = _condition(func_out, {str(k): (int(v[0]), int(v[1]))
                                     for k, v in attrs[DIM_RANGE_ATTR].items()}) if state \
            else None
        changed[gv] = func_out if cond is None else _with_assert(func_out, cond)
    if not changed:
        return mod
    return tvm.IRModule({gv: changed.get(gv, f) for gv, f in mod.functions.items()},
                        attrs=mod.attrs)


def _condition(func, ranges: dict):
    from tvm import tirx

    terms = []
    for name, var in dim_vars(func).items():
        if name not in ranges:
            continue
        lo, hi = ranges[name]
        dtype = str(var.ty)
        # a min above 1 is stated as 1: with w >= 5 known, TVM 0.27's code generation
        # failed on a resize kernel ("IntImm supports only int or uint or bool type, but
        # float32 was supplied": its interval analysis of float((w - 1) >> 1))
        terms.append(tirx.all(tirx.const(min(lo, 1), dtype) <= var, var <= tirx.const(hi, dtype)))
    return tirx.all(*terms) if terms else None


def _with_assert(func, cond):
    from tvm import s_tir, tirx
    from tvm.ir import StringImm

    # TVM 0.27's Python AssertStmt passes (kind, condition) on to a constructor that takes
    # (condition, kind): the arguments in the constructor's order
    check = tirx.AssertStmt(cond, StringImm("ValueError"),
                            [StringImm("a symbolic dim outside its declared range")])
    body = func.body
    if isinstance(body, s_tir.SBlockRealize):  # inside the root block: schedules keep it
        b = body.block
        block = s_tir.SBlock(b.iter_vars, b.reads, b.writes, b.name_hint,
                             tirx.SeqStmt([check, b.body]), b.init, b.alloc_buffers,
                             b.match_buffers, b.annotations)
        return func.with_body(s_tir.SBlockRealize(body.iter_values, body.predicate, block))
    return func.with_body(tirx.SeqStmt([check, body]))
