"""Arena memory planner for the graph runtime: one offset per intermediate tensor.

Every intermediate tensor gets a byte range in a single arena. A tensor has a byte
size and a lifetime ``[first_use, last_use]`` in execution steps, inclusive at both
ends: a tensor produced at step 3 and last read at step 7 is live at steps 3..7. Two
tensors whose lifetimes share at least one step must not share bytes; tensors whose
lifetimes are disjoint may.

Choosing offsets that minimise the arena is NP-hard (it is a dynamic storage
allocation / 2-D strip packing problem), so the planner runs two greedy heuristics
from Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net Inference"
(2020), and keeps whichever gives the smaller arena:

``greedy_by_size``
    TFLite micro's ``GreedyMemoryPlanner``. Buffers are taken by size, largest first
    (ties: earlier ``first_use``, then lower index). Each goes at the lowest aligned
    offset that collides with no already placed buffer whose lifetime intersects its
    own: those buffers are sorted by offset and the gaps between them scanned in order.

``greedy_by_breadth``
    The breadth of a step is the total size of the buffers live at it. Steps are taken
    in order of decreasing breadth (ties: earlier step); each step's still unplaced
    buffers are placed largest first, each into the *best-fitting* gap (the smallest
    gap between conflicting placed buffers that is large enough, lowest offset on a
    tie; past the highest one if no gap fits).

Sizes are rounded up to ``alignment`` before placement, so every offset is a
multiple of it. ``lower_bound_bytes`` is the largest breadth over all steps: the
bytes that are live at the same moment at the worst step. No placement can use less
arena than that, so ``arena_bytes / lower_bound_bytes`` bounds how far a plan is
from optimal (the bound itself is not always attainable). ``no_reuse_bytes`` is the
arena with every tensor in its own buffer.

Both heuristics and the overlap checker run in O(n log n + E log E) time, where E is
the number of pairs of buffers with intersecting lifetimes (small for real graphs:
each tensor meets only the few others live beside it).

This module is part of the runtime and imports only the standard library.

Examples
--------
>>> planner = MemoryPlanner(alignment=64)
>>> a = planner.add(1000, 0, 1, "a")
>>> b = planner.add(1000, 1, 2, "b")
>>> c = planner.add(1000, 2, 3, "c")
>>> plan = planner.plan()
>>> plan.offsets, plan.arena_bytes, plan.overlaps()
([0, 1024, 0], 2048, [])
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from typing import Any, Optional, Sequence

__all__ = ["MemoryPlanner", "MemoryPlan", "ALGORITHMS"]

#: Heuristics ``MemoryPlanner.plan`` can run, in the order tried (a tie keeps the first).
ALGORITHMS = ("greedy_by_size", "greedy_by_breadth")

_FORMAT_VERSION = 1


def _check_int(value: Any, what: str, label: str) -> None:
    # bool is an int subclass; True as a size is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label}: {what} must be an int, got {type(value).__name__} {value!r}")


def _check_buffer(size: Any, first_use: Any, last_use: Any, label: str) -> None:
    _check_int(size, "size", label)
    _check_int(first_use, "first_use", label)
    _check_int(last_use, "last_use", label)
    if size < 0:
        raise ValueError(f"{label}: size must be >= 0 bytes, got {size}")
    if first_use < 0:
        raise ValueError(f"{label}: first_use must be a step >= 0, got {first_use}")
    if last_use < first_use:
        raise ValueError(
            f"{label}: last_use ({last_use}) < first_use ({first_use}); a lifetime is "
            f"the inclusive step range [first_use, last_use], so pass last_use >= first_use"
        )


def _label(index: int, name: str) -> str:
    return f"buffer {index} ({name!r})" if name else f"buffer {index}"


def _align(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


class _Sweep:
    """One pass over the lifetimes: who conflicts with whom, and the live set per step.

    Buffers of size 0 occupy no bytes, conflict with nothing and are left out.
    ``order`` holds the other buffers sorted by ``first_use``. Buffer ``i``
    conflicts with (a) the buffers still live when it starts, kept in
    ``earlier[i]``, and (b) every buffer after it in ``order`` that starts no later
    than its ``last_use``, a contiguous slice of ``order``: so only (a) is stored.

    Only steps at which some buffer starts are recorded in ``steps``: between two
    such steps the live set only shrinks, so every other step's live set is a
    subset of an earlier recorded one, with no larger breadth.
    """

    def __init__(self, sizes: Sequence[int], first: Sequence[int], last: Sequence[int]):
        self.last = last
        self.order = sorted((i for i in range(len(sizes)) if sizes[i] > 0), key=lambda i: (first[i], i))
        self.starts = [first[i] for i in self.order]
        self.pos = {i: p for p, i in enumerate(self.order)}
        self.earlier: dict[int, list[int]] = {}
        self.steps: list[tuple[int, int, list[int]]] = []  # (step, breadth, live buffers)
        heap: list[tuple[int, int]] = []  # (last_use, index) of buffers started so far
        breadth = 0
        k, n = 0, len(self.order)
        while k < n:
            step = self.starts[k]
            while heap and heap[0][0] < step:
                breadth -= sizes[heapq.heappop(heap)[1]]
            live = [j for _, j in heap]
            k_end = bisect.bisect_right(self.starts, step, k)
            group = self.order[k:k_end]
            for g, i in enumerate(group):
                # Buffers starting at the same step conflict with each other too.
                self.earlier[i] = live + group[:g]
                heapq.heappush(heap, (last[i], i))
                breadth += sizes[i]
            self.steps.append((step, breadth, live + group))
            k = k_end

    def neighbours(self, i: int) -> list[int]:
        """Buffers whose lifetimes intersect that of buffer ``i`` (size > 0)."""
        p = self.pos[i]
        return self.earlier[i] + self.order[p + 1 : bisect.bisect_right(self.starts, self.last[i], p + 1)]


def _max_live(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> int:
    """Largest total size live at one step (the lower bound on any arena)."""
    events = sorted([(f, s) for f, s in zip(first, sizes)] + [(l + 1, -s) for l, s in zip(last, sizes)])
    best = live = 0
    for k, (step, delta) in enumerate(events):
        live += delta
        # Measure only once every event of this step has been applied.
        if (k + 1 == len(events) or events[k + 1][0] != step) and live > best:
            best = live
    return best


def _place(i: int, size: int, neighbours: list[int], offsets: list[int], ends: list[int], best_fit: bool) -> None:
    """Place buffer ``i`` against the already placed buffers among its ``neighbours``.

    Unplaced buffers have offset -1: they sort first and are skipped.
    """
    neighbours.sort(key=offsets.__getitem__)
    cursor = 0  # end of the highest range seen so far: a gap starts here
    best = -1
    best_gap = -1
    for j in neighbours:
        start = offsets[j]
        if start < 0:
            continue
        gap = start - cursor
        if gap >= size:
            if not best_fit:
                best = cursor
                break
            if best_gap < 0 or gap < best_gap:
                best, best_gap = cursor, gap
        if ends[j] > cursor:
            cursor = ends[j]
    offsets[i] = cursor if best < 0 else best
    ends[i] = offsets[i] + size


def _by_size(sizes: list[int], first: Sequence[int]) -> list[int]:
    """Buffer indices largest first; ties: earlier first_use, then lower index."""
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i], first[i], i))


def _greedy_by_size(sizes: list[int], first: Sequence[int], sweep: _Sweep) -> list[int]:
    n = len(sizes)
    offsets = [-1] * n
    ends = [0] * n
    for i in _by_size(sizes, first):
        if sizes[i] == 0:
            offsets[i] = 0
        else:
            _place(i, sizes[i], sweep.neighbours(i), offsets, ends, best_fit=False)
    return offsets


def _greedy_by_breadth(sizes: list[int], first: Sequence[int], sweep: _Sweep) -> list[int]:
    n = len(sizes)
    offsets = [-1] * n
    ends = [0] * n
    rank = [0] * n
    for r, i in enumerate(_by_size(sizes, first)):
        rank[i] = r
    for _, _, live in sorted(sweep.steps, key=lambda s: (-s[1], s[0])):
        for i in sorted(live, key=rank.__getitem__):
            if offsets[i] < 0:
                _place(i, sizes[i], sweep.neighbours(i), offsets, ends, best_fit=True)
    # Zero-size buffers are on no step's list; they take no bytes.
    return [0 if o < 0 else o for o in offsets]


_HEURISTICS = {"greedy_by_size": _greedy_by_size, "greedy_by_breadth": _greedy_by_breadth}


class MemoryPlanner:
    """Collects tensor sizes and lifetimes, then assigns arena offsets.

    Parameters
    ----------
    alignment : int
        Every offset is a multiple of this many bytes, and sizes are rounded up to it.
    """

    def __init__(self, alignment: int = 64):
        _check_int(alignment, "alignment", "MemoryPlanner")
        if alignment <= 0:
            raise ValueError(f"MemoryPlanner: alignment must be a positive number of bytes, got {alignment}")
        self.alignment = alignment
        self._sizes: list[int] = []
        self._first: list[int] = []
        self._last: list[int] = []
        self._names: list[str] = []

    def __len__(self) -> int:
        return len(self._sizes)

    def add(self, size: int, first_use: int, last_use: int, name: str = "") -> int:
        """Register a tensor of ``size`` bytes live at steps ``first_use..last_use``.

        Parameters
        ----------
        size : int
            Bytes, >= 0. A zero-size tensor gets offset 0 and takes no space.
        first_use, last_use : int
            First and last execution step at which the tensor is live, inclusive.
        name : str
            Shown by ``MemoryPlan.format`` and in error messages.

        Returns
        -------
        int
            The buffer index; ``MemoryPlan.offsets[index]`` is its offset.

        Raises
        ------
        ValueError
            Negative size or step, or ``last_use < first_use``.
        """
        _check_buffer(size, first_use, last_use, _label(len(self._sizes), name))
        self._sizes.append(size)
        self._first.append(first_use)
        self._last.append(last_use)
        self._names.append(str(name))
        return len(self._sizes) - 1

    def plan(self, reuse: bool = True, algorithms: Sequence[str] = ALGORITHMS) -> "MemoryPlan":
        """Assign an offset to every buffer added so far.

        Parameters
        ----------
        reuse : bool
            False places buffers back to back in index order (no sharing at all): the
            kill switch when a plan is suspected of corrupting data.
        algorithms : sequence of str
            Heuristics to run (see ``ALGORITHMS``); the smallest arena wins, a tie
            goes to the one listed first.

        Returns
        -------
        MemoryPlan
        """
        if isinstance(algorithms, str):
            algorithms = (algorithms,)
        unknown = [a for a in algorithms if a not in _HEURISTICS]
        if unknown or not algorithms:
            raise ValueError(f"unknown memory planning algorithm(s) {unknown}; choose from {list(ALGORITHMS)}")
        aligned = [_align(s, self.alignment) for s in self._sizes]
        if not reuse:
            offsets, total = [], 0
            for s in aligned:
                offsets.append(total)
                total += s
            return self._result(offsets, "no_reuse")
        sweep = _Sweep(aligned, self._first, self._last)
        best: Optional[tuple[int, str, list[int]]] = None
        for name in algorithms:
            offsets = _HEURISTICS[name](aligned, self._first, sweep)
            arena = max((o + s for o, s in zip(offsets, aligned)), default=0)
            if best is None or arena < best[0]:
                best = (arena, name, offsets)
        return self._result(best[2], best[1])

    def _result(self, offsets: list[int], algorithm: str) -> "MemoryPlan":
        return MemoryPlan.build(
            self._sizes, self._first, self._last, self._names, offsets, self.alignment, algorithm
        )


@dataclass(frozen=True)
class MemoryPlan:
    """Offsets for every buffer of a ``MemoryPlanner``; immutable, JSON round-trippable.

    Attributes
    ----------
    offsets : list of int
        Byte offset of each buffer in the arena, a multiple of ``alignment``.
    arena_bytes : int
        ``max(offset + aligned size)``: the arena to allocate.
    lower_bound_bytes : int
        Largest total aligned size live at any one step; no plan can be smaller.
    no_reuse_bytes : int
        Sum of aligned sizes: the arena if no two tensors shared memory.
    algorithm : str
        ``"greedy_by_size"``, ``"greedy_by_breadth"`` or ``"no_reuse"``.
    sizes, first_uses, last_uses, names : list
        The buffers as given to ``MemoryPlanner.add`` (sizes not rounded).
    alignment : int
    """

    offsets: list
    arena_bytes: int
    lower_bound_bytes: int
    no_reuse_bytes: int
    algorithm: str
    sizes: list
    first_uses: list
    last_uses: list
    names: list
    alignment: int

    @classmethod
    def build(cls, sizes, first_uses, last_uses, names, offsets, alignment, algorithm) -> "MemoryPlan":
        """Make a plan from buffers and offsets, computing the three totals."""
        aligned = [_align(s, alignment) for s in sizes]
        return cls(
            offsets=list(offsets),
            arena_bytes=max((o + s for o, s in zip(offsets, aligned)), default=0),
            lower_bound_bytes=_max_live(aligned, first_uses, last_uses),
            no_reuse_bytes=sum(aligned),
            algorithm=algorithm,
            sizes=list(sizes),
            first_uses=list(first_uses),
            last_uses=list(last_uses),
            names=list(names),
            alignment=alignment,
        )

    def __len__(self) -> int:
        return len(self.offsets)

    def overlaps(self) -> list[tuple[int, int]]:
        """Pairs ``(i, j)``, ``i < j``, live at a common step whose byte ranges intersect.

        Byte ranges are ``[offset, offset + size)`` with the unrounded size, so
        zero-size buffers never overlap anything. Empty for a valid plan.
        """
        sweep = _Sweep(self.sizes, self.first_uses, self.last_uses)
        offsets, sizes = self.offsets, self.sizes
        bad = []
        for i, others in sweep.earlier.items():
            lo, hi = offsets[i], offsets[i] + sizes[i]
            for j in others:
                if offsets[j] < hi and lo < offsets[j] + sizes[j]:
                    bad.append((min(i, j), max(i, j)))
        return sorted(bad)

    def format(self, names: Optional[Sequence[str]] = None, max_rows: Optional[int] = 64, width: int = 64) -> str:
        """Printable plan: a table, the totals, and an ASCII timeline.

        Parameters
        ----------
        names : sequence of str, optional
            Overrides the names given to ``add``; unnamed buffers show as ``%<index>``.
        max_rows : int or None
            Show at most this many buffers in table and timeline (None: all).
        width : int
            Most step columns in the timeline; longer schedules fold several steps
            into one column.
        """
        n = len(self.offsets)
        names = list(names) if names is not None else self.names
        if len(names) != n:
            raise ValueError(f"format: got {len(names)} names for {n} buffers")
        labels = [str(nm) if nm else f"%{i}" for i, nm in enumerate(names)]
        shown = n if max_rows is None else min(n, max_rows)
        more = f"... {n - shown} more buffers" if shown < n else None

        header = ("name", "bytes", "first", "last", "offset")
        rows = [
            (labels[i], str(self.sizes[i]), str(self.first_uses[i]), str(self.last_uses[i]), str(self.offsets[i]))
            for i in range(shown)
        ]
        widths = [max([len(h)] + [len(r[c]) for r in rows]) for c, h in enumerate(header)]
        lines = ["  ".join(h.ljust(w) if c == 0 else h.rjust(w) for c, (h, w) in enumerate(zip(header, widths)))]
        for r in rows:
            lines.append("  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths))))
        if more:
            lines.append(more)

        ratio = f" ({self.arena_bytes / self.lower_bound_bytes:.3f}x lower bound)" if self.lower_bound_bytes else ""
        lines += [
            "",
            f"algorithm:   {self.algorithm}, alignment {self.alignment}",
            f"arena:       {self.arena_bytes} bytes{_human(self.arena_bytes)}{ratio}",
            f"lower bound: {self.lower_bound_bytes} bytes{_human(self.lower_bound_bytes)}",
            f"no reuse:    {self.no_reuse_bytes} bytes{_human(self.no_reuse_bytes)}",
        ]
        if n:
            lines += ["", *self._timeline(labels[:shown], width)]
            if more:
                lines.append(more)
        return "\n".join(lines)

    def _timeline(self, labels: list[str], width: int) -> list[str]:
        # Rows are buffers, columns are steps: '#' where live, '.' where not.
        lo = min(self.first_uses)
        hi = max(self.last_uses)
        per_col = max(1, -(-(hi - lo + 1) // max(1, width)))
        cols = -(-(hi - lo + 1) // per_col)
        name_w = max(len(s) for s in labels)
        unit = f"1 column = {per_col} steps" if per_col > 1 else "1 column = 1 step"
        out = [f"timeline: steps {lo}..{hi}, {unit}"]
        for i, label in enumerate(labels):
            a = (self.first_uses[i] - lo) // per_col
            b = (self.last_uses[i] - lo) // per_col
            out.append(f"{label.ljust(name_w)} |{'.' * a}{'#' * (b - a + 1)}{'.' * (cols - b - 1)}|")
        return out

    def to_dict(self) -> dict:
        """JSON-serialisable form, as stored in the compiled artifact."""
        return {
            "version": _FORMAT_VERSION,
            "alignment": self.alignment,
            "algorithm": self.algorithm,
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "no_reuse_bytes": self.no_reuse_bytes,
            "buffers": [
                {"name": nm, "size": s, "first_use": f, "last_use": l, "offset": o}
                for nm, s, f, l, o in zip(self.names, self.sizes, self.first_uses, self.last_uses, self.offsets)
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryPlan":
        """Inverse of ``to_dict``; recomputes the totals and rejects a corrupt plan.

        Raises
        ------
        ValueError
            Unknown version, malformed buffer, misaligned offset, or stored totals that
            disagree with the buffers. Overlaps are not checked here: call ``overlaps``.
        """
        version = data.get("version")
        if version != _FORMAT_VERSION:
            raise ValueError(f"memory plan: format version {version!r} not supported (expected {_FORMAT_VERSION})")
        try:
            alignment = data["alignment"]
            buffers = data["buffers"]
            names = [str(b.get("name", "")) for b in buffers]
            sizes = [b["size"] for b in buffers]
            firsts = [b["first_use"] for b in buffers]
            lasts = [b["last_use"] for b in buffers]
            offsets = [b["offset"] for b in buffers]
            algorithm = data["algorithm"]
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"memory plan: malformed plan dict ({type(e).__name__}: {e})") from None
        _check_int(alignment, "alignment", "memory plan")
        if alignment <= 0:
            raise ValueError(f"memory plan: alignment must be positive, got {alignment}")
        for i, (s, f, l, o) in enumerate(zip(sizes, firsts, lasts, offsets)):
            label = _label(i, names[i])
            _check_buffer(s, f, l, label)
            _check_int(o, "offset", label)
            if o < 0 or o % alignment:
                raise ValueError(f"memory plan: {label}: offset {o} is not a non-negative multiple of {alignment}")
        plan = cls.build(sizes, firsts, lasts, names, offsets, alignment, algorithm)
        for key in ("arena_bytes", "lower_bound_bytes", "no_reuse_bytes"):
            if key in data and data[key] != getattr(plan, key):
                raise ValueError(
                    f"memory plan: stored {key}={data[key]} but the buffers give {getattr(plan, key)}; "
                    f"the plan is corrupt, recompile the model"
                )
        return plan


def _human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f" ({n / scale:.2f} {unit})"
    return ""
