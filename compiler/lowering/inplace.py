"""Which kernel outputs may overwrite which inputs: the in-place analysis of the planner.

An output may take an input's storage when the input dies at this kernel and writing the
output cannot clobber an input element that is still to be read.  We accept only the
shape that guarantees it whatever the schedule does later: every block that reads the
input writes the output, reads the input at exactly the indices it writes (so element i
is read only to compute element i), and is not a reduction (whose init would overwrite
before the read); the input is never written and the output never read.  Elementwise ops
and the residual ``Add`` at the end of a fused conv pass; softmax, transposes and
broadcasts do not.
"""

from __future__ import annotations

import tvm
from tvm_ffi import structural_equal
from tvm import s_tir


def _blocks(sch, rv):
    for child in sch.get_child_blocks(rv):
        yield sch.get(child)
        yield from _blocks(sch, child)


def inplace_candidates(func, num_inputs: int) -> list[tuple[int, int]]:
    """(input index, output index) pairs that may share storage, for a PrimFunc in
    destination-passing style (inputs first, then outputs)."""
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
    for o_idx, out in enumerate(outs):
        if any(touches(b.reads, out) for b in blocks):
            continue
        for i_idx, inp in enumerate(ins):
            if (inp.dtype != out.dtype or len(inp.shape) != len(out.shape)
                    or not all(structural_equal(a, b) for a, b in zip(inp.shape, out.shape))):
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
