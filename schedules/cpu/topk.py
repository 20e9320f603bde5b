"""TopK on CPUs as one selection kernel, written already scheduled.

The TopK converter (``compiler/frontend/converters/shape_values.py``) views the input as
``[O, N, I]`` (the axis in the middle) and calls this kernel on CPU targets::

    parallel over the O * I rows of the axis:
        vals[K], idxs[K] on the stack; count = 0
        for each block of 16 elements of the row:
            if count < K or any of the 16 may come before the K-th best:  # one vector compare
                for each element v, j of the block: step(v, j)
        step(v, j) for the tail
        write vals, idxs out, best first

K < ``HEAP_FROM``, the insertion form: vals is sorted, best first; an element that comes
before the K-th best takes its place and moves up past those it comes before (O(K) an
entry).  Larger K, the heap form: vals is a binary heap with the worst held at its root;
an element that comes before the root replaces it and sinks (O(log K) an entry); the heap
is taken apart worst first at the end.  On most data few elements enter after the first
blocks, and the row costs one vector compare per 16 elements; a row sorted the wrong way
(every element enters) costs O(N * K) or O(N log K).  The rank count this replaces
compared every pair of the row: O(N^2), 109x onnxruntime's time on top-5 of [64, 1000],
and axes over 4096 were refused.

"before": greater (``largest``) or smaller, NaN the greatest value (first when largest,
last when smallest: numpy's sort); between equal values the lower index (an element met
later never moves ahead of an equal one held), as ONNX and onnxruntime order them.  The
extents are the buffers' (symbolic allowed), the inner one static where the converter
knows it (1: contiguous rows, one vector load a block); K is the kernel's.  The template's
conventions: ``schedules/cpu/templates.py``.
"""

from __future__ import annotations

from .templates import axis_views, indent, kernel

RULE = "cpu.topk"

_TEMPLATE = """
{decls}
    with T.sblock("root"):
{views}
        for r in T.parallel({O} * {I}):
            vals = T.alloc_buffer(({K},), "{dt}", scope="global")
            idxs = T.alloc_buffer(({K},), "int64", scope="global")
            # count held, slot, still moving, any of the block may enter, child, spare
            st = T.alloc_buffer((6,), "int64", scope="global")
            st[0] = T.int64(0)
            for jb in range({N} // T.int64({B})):
                st[3] = T.int64(0)
                for l in T.unroll({B}):
                    st[3] = T.bitwise_or(st[3], T.Cast("int64", {may_enter}))
                if T.Or(st[0] < T.int64({K}), st[3] != T.int64(0)):
                    for l in range({B}):
{step_block}
            for j in range({N} // T.int64({B}) * T.int64({B}), {N}):
{step_tail}
{finish}
"""

# -- the insertion form: vals / idxs sorted, best first; the K-th best at K - 1 ----------
# one element's step: v = x[.., j, ..] enters if the top K is not full or it comes before
# the K-th best, then moves up past those it comes before
_INSERT = """\
if T.Or(st[0] < T.int64({K}), {before_worst}):
    st[1] = T.min(st[0], T.int64({K1}))
{rise}
    st[0] = T.min(st[0] + T.int64(1), T.int64({K}))
"""

# the element v, j placed at slot st[1] or past it: while slot st[1] has a next slot on
# v's path (rising: the slot before it in the sorted form, its parent in the heap form;
# sinking: its worse heap child) whose entry v goes past, that entry moves into st[1]
# and v goes on from the next slot
_MOVE = """\
st[2] = T.int64(1)
while st[2] == T.int64(1):
{find_next}    if {has_next}:
{pick}        if {goes_past}:
            vals[st[1]] = vals[{next}]
            idxs[st[1]] = idxs[{next}]
            st[1] = {next}
        else:
            st[2] = T.int64(0)
    else:
        st[2] = T.int64(0)
vals[st[1]] = {v}
idxs[st[1]] = {j}
"""


def _rise(v: str, j: str, parent: str, goes_past: str) -> str:
    return _MOVE.format(v=v, j=j, find_next="", has_next="st[1] > T.int64(0)", pick="",
                        next=parent, goes_past=goes_past)


_INSERT_FINISH = """\
for q in range({K}):
    vo[{row_q}] = vals[q]
    io[{row_q}] = T.Cast("{it}", idxs[q])
"""

# -- the heap form: vals / idxs a binary heap, the worst held at its root ----------------
# an element that comes before the root replaces it and sinks; while the heap fills, an
# element is appended and rises above better parents
_HEAP = """\
if st[0] < T.int64({K}):
    st[1] = st[0]
{rise}
    st[0] = st[0] + T.int64(1)
elif {before_worst}:
    st[5] = T.int64({K})
{sink}
"""

# sinking from the root of a heap of st[5] entries: the next slot is the worse child
_SINK_NEXT = "    st[4] = st[1] * T.int64(2) + T.int64(1)\n"
_SINK_PICK = """\
        if st[4] + T.int64(1) < st[5]:
            if {right_worse}:
                st[4] = st[4] + T.int64(1)
"""

# the heap taken apart worst first: each root is the worst of what is left, written at the
# back of the output; the heap's last entry sinks from the root
_HEAP_FINISH = """\
for q in range({K}):
    vo[{row_last}] = vals[0]
    io[{row_last}] = T.Cast("{it}", idxs[0])
    st[5] = T.int64({K1}) - q
    if st[5] > T.int64(0):
{sink_last}
"""

# elements checked at once against the K-th best before any is stepped through: one
# vector compare per block (LLVM vectorises the unrolled "or" of compares)
BLOCK = 16

# from this K the heap form (O(log K) per element that enters): the insertion form shifts
# O(K) per entering element.  Zen 4, one row of normal samples: top-300 of 8400 186 us by
# insertion, 46 us by heap; top-100 of 50257 74 / 51 us; top-64 of 1000 11.7 / 11.1 us;
# top-50 of 50257 20 / 30 us
HEAP_FROM = 64


def _before(v: str, u: str, largest: bool, is_float: bool) -> str:
    """TVMScript of "v comes before u" for a v met after u along the row."""
    better = f"{v} > {u}" if largest else f"{v} < {u}"
    if not is_float:
        return better
    if largest:  # NaN is the greatest value: ahead of any number
        nan = f"T.And(T.isnan({v}), T.Not(T.isnan({u})))"
    else:        # ... and behind any number
        nan = f"T.And(T.Not(T.isnan({v})), T.isnan({u}))"
    return f"T.Or({better}, {nan})"


def _worse(a: tuple, b: tuple, largest: bool, is_float: bool) -> str:
    """TVMScript of "(value, index) a comes after b" in the top-k order."""
    (va, ia), (vb, ib) = a, b
    same = f"{va} == {vb}"
    if is_float:
        same = f"T.Or({same}, T.And(T.isnan({va}), T.isnan({vb})))"
    return f"T.Or({_before(vb, va, largest, is_float)}, T.And({same}, {ib} < {ia}))"


def _may_enter(v: str, u: str, largest: bool, is_float: bool) -> str:
    """A superset of "v comes before u" that vectorises: also true when either is NaN.
    (Not ``not v <= u``: TVM's simplifier rewrites it to ``v > u``, false for a NaN.)"""
    better = f"{v} > {u}" if largest else f"{v} < {u}"
    if not is_float:
        return better
    return f"T.Or(T.Or({better}, T.isnan({v})), T.isnan({u}))"


def topk_kernel(k: int, largest: bool, dtype: str, shape: list, axis: int,
                index_dtype: str = "int64"):
    """The PrimFunc (x, values, indices) of the ``k`` first elements along ``axis`` in the
    top-k order, sorted; ``k`` >= 1.  ``shape``: x's dims, an int each or None where
    symbolic (the axis static); values and indices have ``k`` at the axis."""
    fl = dtype.startswith("float") or dtype.startswith("bfloat")
    decls, views, o, n, ii = axis_views(shape, axis, [("var_x", "x", dtype, None),
                                                      ("var_v", "vo", dtype, k),
                                                      ("var_i", "io", index_dtype, k)])
    heap = k >= HEAP_FROM
    worst = "vals[0]" if heap else f"vals[{k - 1}]"

    def sink(v, j):  # the element v, j from the root down past worse children
        pick = _SINK_PICK.format(right_worse=_worse(
            ("vals[st[4] + T.int64(1)]", "idxs[st[4] + T.int64(1)]"),
            ("vals[st[4]]", "idxs[st[4]]"), largest, fl))
        return "st[1] = T.int64(0)\n" + _MOVE.format(
            v=v, j=j, find_next=_SINK_NEXT, has_next="st[4] < st[5]", pick=pick,
            next="st[4]", goes_past=_worse(("vals[st[4]]", "idxs[st[4]]"), (v, j), largest,
                                           fl))

    def step(j: str, depth: int) -> str:
        v = f"x[r // {ii}, {j}, r % {ii}]"
        if heap:  # v rises while it is worse than its heap parent (the worst at the root)
            parent = "(st[1] - T.int64(1)) // T.int64(2)"
            rise = _rise(v, j, parent, _worse((v, j), (f"vals[{parent}]", f"idxs[{parent}]"),
                                              largest, fl))
            text = _HEAP.format(K=k, before_worst=_before(v, worst, largest, fl),
                                rise=indent(rise, 4), sink=indent(sink(v, j), 4))
        else:     # v rises while it comes before the entry ahead of it
            parent = "st[1] - T.int64(1)"
            rise = _rise(v, j, parent, _before(v, f"vals[{parent}]", largest, fl))
            text = _INSERT.format(K=k, K1=k - 1, before_worst=_before(v, worst, largest, fl),
                                  rise=indent(rise, 4))
        return indent(text, depth)

    if heap:
        last = f"vals[T.int64({k - 1}) - q]", f"idxs[T.int64({k - 1}) - q]"
        finish = _HEAP_FINISH.format(
            K=k, K1=k - 1, it=index_dtype,
            row_last=f"r // {ii}, T.int64({k - 1}) - q, r % {ii}",
            sink_last=indent(sink(*last), 8))
    else:
        finish = _INSERT_FINISH.format(K=k, it=index_dtype, row_q=f"r // {ii}, q, r % {ii}")
    lane = f"x[r // {ii}, jb * T.int64({BLOCK}) + l, r % {ii}]"
    body = _TEMPLATE.format(
        dt=dtype, K=k, B=BLOCK, O=o, N=n, I=ii,
        decls=indent(decls, 4), views=indent(views, 8),
        may_enter=_may_enter(lane, worst, largest, fl),
        step_block=step(f"jb * T.int64({BLOCK}) + l", 24),
        step_tail=step("j", 16), finish=indent(finish, 12))
    return kernel("var_x: T.handle, var_v: T.handle, var_i: T.handle", RULE, body)
