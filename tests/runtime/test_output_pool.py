"""runtime/output_pool.py: a slot is taken again only when nothing outside the pool reaches
its memory (the returned array, a view, a slice, a memoryview, a DLPack export all hold
it), at most ``depth`` slots are pooled, depth 0 never pools."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.output_pool import OutputPool

MEMBERS = [(0, (4, 8), np.dtype(np.float32)), (1, (32,), np.dtype(np.float32))]


def _pool(depth=2):
    return OutputPool(4 * 32, MEMBERS, depth)


def test_structure_slot_views_and_tensors_share_aligned_memory():
    slot = _pool().take()
    assert slot.raw.ctypes.data % 64 == 0 and slot.key == 0
    assert slot.views[0].shape == (4, 8) and slot.views[1].shape == (32,)
    assert np.shares_memory(slot.views[0], slot.views[1])
    assert all(tuple(slot.tensors[t].shape) == slot.views[t].shape for t in (0, 1))
    out = slot.give(0)
    assert out is not slot.views[0] and np.shares_memory(out, slot.raw)


def test_dropped_result_is_taken_again():
    pool = _pool()
    first = pool.take()
    out = first.give(0)
    del out
    assert pool.take() is first and pool.reused == 1


@pytest.mark.parametrize("keep", [
    lambda a: a,                    # the array itself
    lambda a: a[1:, ::2],           # a slice
    lambda a: a.reshape(-1),        # a reshaped view
    lambda a: memoryview(a),        # a buffer export
    lambda a: a.__dlpack__(),       # a DLPack capsule
    lambda a: [a],                  # held in a container
])
def test_held_result_is_never_taken(keep):
    pool = _pool()
    first = pool.take()
    held = keep(first.give(0))
    second = pool.take()
    assert second is not first and not np.shares_memory(second.raw, first.raw)
    del held
    assert pool.take() is first  # released: reusable again


def test_beyond_depth_fresh_memory_outside_the_pool():
    pool = _pool(depth=2)
    held = [pool.take().give(0) for _ in range(2)]
    extra = pool.take()
    assert extra.key is None and len(pool.slots) == 2
    assert not any(np.shares_memory(extra.raw, h) for h in held)


def test_depth_zero_never_pools():
    pool = _pool(depth=0)
    a = pool.take()
    del a
    b = pool.take()
    assert b.key is None and not pool.slots and pool.reused == 0
