"""Which kernel outputs may overwrite which inputs: the in-place analysis of the planner.

An output may take an input's storage when the input dies at this kernel and writing the
output cannot clobber an input element that is still to be read.  We accept only the
shape that guarantees it whatever the schedule does later: every block that reads the
input writes the output, reads the input at exactly the indices it writes (so element i
is read only to compute element i), and is not a reduction (whose init would overwrite
before the read); the input is never written and the output never read.  Elementwise ops
and the residual ``Add`` at the end of a fused conv pass; transposes and broadcasts do
not.

Softmax is the one reduction accepted (:func:`_softmax_rows`), where the caller vouches
for the schedule (``rows_once``: a rule of :data:`ROWS_ONCE` scheduled the kernel): output
row r depends on input row r alone, and every read of ``x[r, j]`` happens in the row's
max or in the exp of element j, the one that writes ``y[r, j]`` (or its scratch, before
the row's sum and normalisation).  That holds when the row's max is computed once, before
the row's exps, as cpu.row_reduction does (and an unscheduled kernel: the checked
variants); a schedule that recomputes the max per element (a tuned compute location may)
would read elements already overwritten, so tuned and other rules' kernels are refused.
In place, the scores of Whisper's [8, 1500, 1500] attention use one 72 MB buffer instead
of two, and the softmax writes lines it has just read (no fetch of the output line from
DRAM): 12-35 -> 6-9 ms at 2 threads (emeraldrapids; onnxruntime 4.3).
"""

from __future__ import annotations

import tvm
from tvm_ffi import structural_equal
from tvm import s_tir


def _blocks(sch, rv):
    for child in sch.get_child_blocks(rv):
        yield sch.get(child)
        yield from _blocks(sch, child)


# the rules that compute each row's reductions once, before the row's elementwise blocks
ROWS_ONCE = ("cpu.row_reduction",)


def inplace_candidates(func, num_inputs: int, rows_once: bool = False
                       ) -> list[tuple[int, int]]:
    """(input index, output index) pairs that may share storage, for a PrimFunc in
    destination-passing style (inputs first, then outputs); ``rows_once``: the kernel is
    scheduled by a rule of :data:`ROWS_ONCE` (a softmax may then run in place)."""
    # In TVM 0.27 a PrimFunc's params are the buffers themselves (Vars of BufferType).
    buffers = list(func.params)
    ins, outs = buffers[:num_inputs], buffers[num_inputs:]
    try:
        sch = s_tir.Schedule(func)
        blocks = list(_blocks(sch, sch.get_sblock("root")))
    except Exception:  # not a block-form function: no claim
        return []

    def touches(regions, buf):
        return [r for r in regions if r.source.same_as(buf) or r.source.same_as(buf.data)]

    pairs = []
    if rows_once and len(outs) == 1 and _softmax_rows(blocks, ins, outs[0], touches):
        return [(i, 0) for i, inp in enumerate(ins) if _same_type(inp, outs[0])]
    for o_idx, out in enumerate(outs):
        if any(touches(b.reads, out) for b in blocks):
            continue
        for i_idx, inp in enumerate(ins):
            if not _same_type(inp, out):
                continue
            if any(touches(b.writes, inp) for b in blocks):
                continue
            ok, seen = True, False
            for b in blocks:
                reads = touches(b.reads, inp)
                if not reads:
                    continue
                seen = True
                writes = touches(b.writes, out)
                if b.init is not None or len(b.writes) != 1 or len(writes) != 1 or not all(
                        _same_point(r.region, writes[0].region) for r in reads):
                    ok = False
                    break
            if ok and seen:
                pairs.append((i_idx, o_idx))
    return pairs


def _same_type(a, b) -> bool:
    return (a.dtype == b.dtype and len(a.shape) == len(b.shape)
            and all(structural_equal(x, y) for x, y in zip(a.shape, b.shape)))


# softmax blocks as TVM's topi and onnxc's legalization name them (onnxc's adds ``_tail`` /
# ``_row`` reductions): those that may read the output (cpu.row_reduction stores the exps
# there), and below, those that may read the input
_SOFTMAX_OUT_READERS = ("T_softmax_expsum", "T_softmax_norm")


def _softmax_row_reader(name: str) -> bool:
    """The row's max (any of its reductions) or the exp: the blocks that may read x."""
    return name.startswith("T_softmax_maxelem") or name == "T_softmax_exp"


def _softmax_rows(blocks, ins, out, touches) -> bool:
    """Whether the kernel is a softmax whose output only its normalisation writes (and
    only its sum and normalisation read: cpu.row_reduction stores the exps there), and
    whose inputs only the softmax's max and exp read (or, first, elementwise ops reading
    them at the point they write: a fused scale or mask add, itself read only by them)."""
    names = {b.name_hint for b in blocks}
    if "T_softmax_norm" not in names or not any(n.startswith("T_softmax_maxelem")
                                                for n in names):
        return False
    # the inputs that may share the output's storage, and the elementwise results computed
    # from them (other inputs, a broadcast mask, are never overwritten: read as they like)
    derived = [i for i in ins if _same_type(i, out)]
    for b in blocks:
        if any(touches(b.writes, i) for i in ins):
            return False
        if touches(b.reads, out) and not b.name_hint.startswith(_SOFTMAX_OUT_READERS):
            return False
        if touches(b.writes, out) and b.name_hint != "T_softmax_norm":
            return False
        reads = [r for d in derived for r in touches(b.reads, d)]
        if not reads or _softmax_row_reader(b.name_hint):
            continue
        if b.name_hint.startswith("T_softmax"):
            return False  # the sum or the normalisation reading an input: not this shape
        # an elementwise op before the softmax: reads at the point it writes, one result
        if (b.init is not None or len(b.writes) != 1
                or not all(_same_point(r.region, b.writes[0].region) for r in reads)):
            return False
        derived.append(b.writes[0].source)
    return True


def _same_point(read_region, write_region) -> bool:
    if len(read_region) != len(write_region):
        return False
    for r, w in zip(read_region, write_region):
        if not (_is_one(r.extent) and _is_one(w.extent)
                and structural_equal(r.min, w.min)):
            return False
    return True


def _is_one(e) -> bool:
    return isinstance(e, tvm.tirx.IntImm) and e.value == 1
