"""Output memory a session hands back to the caller and takes again once the caller let go.

``run()`` returns fresh arrays the caller owns (onnxruntime's contract), and the kernels
write them directly (``SessionOptions.bind_io``).  Allocating that memory anew each run costs
twice: a TVM tensor has to be made over it (DLPack, ~1.5 us a tensor) and the kernel call
tuples patched, and an allocation above glibc's mmap threshold (at most 32 MiB) comes back
from the kernel as untouched pages, so every run page-faults its whole output in (a 64 MB
output: 41 ms of kernel, 56 ms of ``run()``).

An :class:`OutputPool` keeps, per arena buffer that an output is written in, up to
``depth`` slots of aligned memory with their TVM tensors made once.  A slot is taken again
only when the caller holds nothing that reaches its memory: every numpy array over it (the
returned array, any view or slice of it, a ``memoryview``, a DLPack export) references the
slot's owning array, so its reference count is back at the count the pool itself holds
exactly when numpy would have freed the memory.  Reusing it then is what ``free`` followed
by ``malloc`` of the same size could do, minus the page faults.  A caller who keeps every
result (a list of outputs) holds all slots: each further run gets fresh memory, as before.

Not thread-safe by itself: each arena has its own pools, and an arena serves one run at a
time (``Session._acquire``).
"""

from __future__ import annotations

import math
import sys

import numpy as np

__all__ = ["OutputPool", "Slot", "DEFAULT_DEPTH", "aligned_bytes"]

# Slots per output buffer.  Two serve the usual loop ``outs = sess.run(...)``: while run
# n + 1 executes the caller still holds run n's arrays (the assignment happens after).
DEFAULT_DEPTH = 2


def aligned_bytes(nbytes: int, alignment: int = 64) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data pointer is ``alignment``-aligned."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes]


class Slot:
    """One piece of output memory: the numpy views of the buffer's tensors over it and the
    TVM tensors the kernels take.  ``key`` is its place in the pool (None: not pooled)."""

    __slots__ = ("raw", "owner", "views", "tensors", "key", "_refs")

    def __init__(self, nbytes: int, members, key):
        import tvm

        self.raw = aligned_bytes(nbytes)
        self.owner = self.raw.base  # the array that owns the memory: every view's .base
        self.views, self.tensors = {}, {}
        for t, shape, dtype in members:
            v = self.raw[:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
            self.views[t] = v
            self.tensors[t] = tvm.runtime.from_dlpack(v) if v.size else None
        self.key = key
        self._refs = sys.getrefcount(self.owner)  # the pool's own references, all made above

    def free(self) -> bool:
        """True when nothing outside the pool reaches this memory."""
        return sys.getrefcount(self.owner) == self._refs

    def give(self, t: int) -> np.ndarray:
        """Tensor ``t``'s array for the caller: a new view (the caller's, not the pool's)."""
        return self.views[t].view()


class OutputPool:
    """Up to ``depth`` reusable slots for one arena buffer of ``nbytes``.

    Parameters
    ----------
    nbytes : int
        Bytes of the buffer (the largest of its tensors).
    members : list of (tensor id, shape, numpy dtype)
        The tensors stored in the buffer: the output and any tensor written in place
        before it (or a model input it overwrites), each viewed from the buffer's start.
    depth : int
        Slots kept; 0 disables reuse (every ``take`` gives fresh memory).
    """

    def __init__(self, nbytes: int, members, depth: int = DEFAULT_DEPTH):
        self.nbytes, self.members, self.depth = nbytes, list(members), depth
        self.slots: list[Slot] = []
        self.reused = 0  # runs served by a slot taken again (tests and benchmarks read it)

    def take(self) -> Slot:
        """A slot nobody else holds: a pooled one when free, a new pooled one while fewer
        than ``depth`` exist, else fresh memory outside the pool."""
        for slot in self.slots:
            if slot.free():
                self.reused += 1
                return slot
        if len(self.slots) < self.depth:
            slot = Slot(self.nbytes, self.members, len(self.slots))
            self.slots.append(slot)
            return slot
        return Slot(self.nbytes, self.members, None)
