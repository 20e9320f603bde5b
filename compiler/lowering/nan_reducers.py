"""TE reducers with onnxruntime's NaN rules for max / min / arg-max / arg-min (issue #17).

TVM's ``max`` / ``min`` reducers combine with TIR ``Max`` / ``Min``, which LLVM emits as
``a > b ? a : b``: whether a NaN survives depends on where it sits in the loop order (the
last element of a window or row kept it, any earlier one was dropped), and a schedule that
splits or vectorises the reduction changes the answer.  onnxruntime 1.32 (measured,
``tests/compiler/lowering/test_nan_semantics.py``):

* ArgMax / ArgMin fold ``best = x[0]; if x[k] > best: best = x[k]`` (``>=`` with
  ``select_last_index``): a NaN in the first position wins (index 0), a NaN anywhere else
  is skipped.  ``arg_reducer``.
* ReduceMax / ReduceMin follow the same fold where their Eigen kernels are not vectorised
  (reductions over an outer axis): a leading NaN gives NaN, a later NaN is skipped.  Over
  the innermost axis Eigen's packet maxima also lose values next to a NaN (max of
  ``[0, nan, 2, .., 15]`` = 14): no rule, so the fold is what we copy.
  ``lead_nan_reducer`` over ``lead_nan_input`` (``legalize_reductions``).
* MaxPool / GlobalMaxPool (MLAS) keep or drop a NaN by where it sits: the 2-D kernels keep
  it only as a window's last tap, the 1-D kernel never (an all-NaN window gives
  ``-FLT_MAX``), GlobalMaxPool only in the next-to-last position.  No rule to copy; we skip
  NaN wherever the window holds a number (NaN for an all-NaN window), which equals
  onnxruntime wherever the NaN is not in the position its kernel happens to keep.
  ``skip_nan_reducer`` with a NaN identity (``legalize_pool``).

Every reducer here is a select per element (no libm call), so it vectorises; it is not one
of the combiners TVM's ``rfactor`` recognises, so rules that rfactor leave such kernels to
the next rule rather than re-introducing ``T.max``.
"""

from __future__ import annotations

from tvm import te, tirx


def isnan_bits(v):
    """``isnan(v)`` for a float32 as an integer test of its bits, ``|bits| > inf's``, for a
    reducer's accumulator: TVM 0.27's loop vectoriser scalarises ``T.isnan`` of a load from
    a ``local`` buffer (the register tile a schedule caches an accumulator in; of a
    global buffer it vectorises them), simplifies ``v != v`` to false and rewrites ``not
    (|v| <= inf)`` into ``inf < |v|`` (false for a NaN); ``llvm.is.fpclass`` cannot be
    called through ``call_llvm_pure_intrin``.  In a pool's reduction the scalarised update
    left LLVM (znver5) a masked store per tap into a stack tile: ResNet-50's stem max pool
    400 -> 172 us alone (onnxruntime 84)."""
    if str(v.ty) != "float32":
        return tirx.isnan(v)
    bits = tirx.reinterpret("int32", v) & tirx.const(0x7FFFFFFF, "int32")
    return bits > tirx.const(0x7F800000, "int32")


def skip_nan_reducer(kind: str):
    """``max`` / ``min`` that skips NaN operands, with identity NaN: a NaN accumulator takes
    the next value, a NaN value leaves the accumulator; all NaN gives NaN; of equal values
    (+0 and -0 only) the later one."""

    def combine(acc, x):
        # the max (min) of two where a NaN accumulator gives x: `acc > x ? acc : x`, x86's
        # maxps(acc, x); a NaN x keeps acc.  The NaN test is on x, off the accumulator's
        # dependency chain: testing the accumulator (`x > acc or isnan(acc)`) chained 5
        # instructions per tap, and the pools were latency-bound on it (GoogLeNet's 3x3
        # max pools in NCHW16c 2-3.7x onnxruntime on znver4)
        keep = acc > x if kind == "max" else acc < x
        return tirx.Select(isnan_bits(x), acc, tirx.Select(keep, acc, x))

    return te.comm_reducer(combine, lambda t: tirx.const(float("nan"), t),
                           name=f"{kind}_skip_nan")


def lead_nan_reducer(kind: str):
    """``max`` / ``min`` in which a NaN operand wins and stays (identity -inf / +inf); fed
    by ``lead_nan_input``, which turns every NaN but the leading one into the identity, it
    computes onnxruntime's fold in one reduction, in any order."""

    def combine(acc, x):
        better = x > acc if kind == "max" else x < acc
        return tirx.Select(tirx.Or(better, tirx.isnan(x)), x, acc)

    inf = float("-inf") if kind == "max" else float("inf")
    return te.comm_reducer(combine, lambda t: tirx.const(inf, t), name=f"{kind}_lead_nan")


def lead_nan_input(kind: str, value, reduce_vars):
    """``value`` at the reduction index ``reduce_vars``, a NaN replaced by the identity of
    ``lead_nan_reducer`` unless every reduce var is 0 (the leading element)."""
    inf = tirx.const(float("-inf") if kind == "max" else float("inf"), value.dtype)
    later = tirx.any(*[v.var > 0 for v in reduce_vars]) if reduce_vars else None
    if later is None:
        return value
    return tirx.Select(tirx.And(later, tirx.isnan(value)), inf, value)


def arg_reducer(kind: str, last: bool):
    """``(index, value)`` reducer of onnxruntime's ArgMax / ArgMin fold: the element at index
    0 wins when it is NaN; otherwise the largest (smallest) non-NaN value, the first
    (``last``: the last) index among equal ones.  Identity ``(-1, NaN)``; an index of -1
    never survives a non-empty reduction (index 0 is either NaN, and wins, or a number)."""

    def combine(a, b):
        ai, av = a
        bi, bv = b
        lead_a = tirx.And(ai == 0, tirx.isnan(av))
        lead_b = tirx.And(bi == 0, tirx.isnan(bv))
        better = bv > av if kind == "max" else bv < av
        tie = tirx.And(bv == av, bi > ai if last else bi < ai)
        beats = tirx.Or(tirx.Or(tirx.isnan(av), better), tie)
        take_b = tirx.Or(lead_b, tirx.And(tirx.Not(lead_a),
                                          tirx.And(tirx.Not(tirx.isnan(bv)), beats)))
        return tirx.Select(take_b, bi, ai), tirx.Select(take_b, bv, av)

    def identity(ti, tv):
        return tirx.const(-1, ti), tirx.const(float("nan"), tv)

    return te.comm_reducer(combine, identity, name=f"arg{kind}_nan_first")
