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
  float32: TVM's integer max of ``order_key`` s, other floats
  ``skip_nan_reducer`` with a NaN identity (``legalize_pool``).

Every reducer here is a select per element (no libm call), so it vectorises; it is not one
of the combiners TVM's ``rfactor`` recognises, so rules that rfactor leave such kernels to
the next rule rather than re-introducing ``T.max``.
"""

from __future__ import annotations

from tvm import te, tirx


def skip_nan_reducer(kind: str):
    """``max`` / ``min`` that skips NaN operands, with identity NaN: a NaN accumulator takes
    the next value, a NaN value leaves the accumulator; all NaN gives NaN; of equal values
    (+0 and -0 only) the later one.  A select chain per element (a NaN test and a
    compare): float32 max pools take an integer max of ``order_key`` s instead, 2.5x faster."""

    def combine(acc, x):
        # `acc > x ? acc : x` (x86's maxps(acc, x)): a NaN accumulator gives x; the NaN
        # test is on x, off the accumulator's dependency chain
        keep = acc > x if kind == "max" else acc < x
        return tirx.Select(tirx.isnan(x), acc, tirx.Select(keep, acc, x))

    return te.comm_reducer(combine, lambda t: tirx.const(float("nan"), t),
                           name=f"{kind}_skip_nan")


# float32 order keys: ``order_key(v)`` is an int32 whose signed order is v's (-0 below +0),
# every NaN below -inf; ``from_order_key`` inverts it (a NaN's key gives a NaN)
_MAGNITUDE = 0x7FFFFFFF
_INT_MIN = -(2**31)


def order_key(v):
    """The int32 order key of a float32 (see above): negative values' magnitude bits
    flipped (``b ^ ((b >> 31) & 0x7FFFFFFF)``: signed order = float order, NaN of either
    sign beyond +-inf), every NaN INT_MIN.  The NaN test is ``T.isnan`` (an unordered
    compare; this stage reads global buffers, whose isnan TVM vectorises): an integer
    test of the bits came out of the TE -> TIR conversion (int64 indices) as an int64
    compare, and no wrapping add moves the positive NaNs instead (TVM emits ``add nsw``)."""
    b = tirx.reinterpret("int32", v)
    k = b ^ ((b >> 31) & tirx.const(_MAGNITUDE, "int32"))
    return tirx.Select(tirx.isnan(v), tirx.const(_INT_MIN, "int32"), k)


def from_order_key(k):
    """The float32 of an order key: the flip is its own inverse; INT_MIN (every NaN's key,
    and the empty max's) gives a NaN."""
    return tirx.reinterpret("float32", k ^ ((k >> 31) & tirx.const(_MAGNITUDE, "int32")))


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
