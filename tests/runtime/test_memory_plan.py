"""Tests for runtime/memory_plan.py: hand-computed plans, random lifetimes, round trip."""

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.memory_plan import ALGORITHMS, MemoryPlan, MemoryPlanner


def make(buffers, alignment=64):
    """Planner holding ``buffers`` as (size, first_use, last_use[, name]) tuples."""
    planner = MemoryPlanner(alignment=alignment)
    for b in buffers:
        planner.add(*b)
    return planner


def brute_force_overlaps(buffers, offsets):
    """Every pair live at a common step whose [offset, offset + size) ranges intersect."""
    bad = []
    for i, (si, fi, li, *_) in enumerate(buffers):
        for j in range(i + 1, len(buffers)):
            sj, fj, lj, *_ = buffers[j]
            live_together = any(fi <= t <= li for t in range(fj, lj + 1))
            bytes_shared = offsets[i] < offsets[j] + sj and offsets[j] < offsets[i] + si
            if live_together and bytes_shared:
                bad.append((i, j))
    return bad


def brute_force_lower_bound(buffers, alignment):
    aligned = [-(-b[0] // alignment) * alignment for b in buffers]
    steps = range(max((b[2] for b in buffers), default=-1) + 1)
    return max((sum(a for a, b in zip(aligned, buffers) if b[1] <= t <= b[2]) for t in steps), default=0)


# --- hand-computed plans ---------------------------------------------------------------


def test_chain_reuses_first_buffer_for_third():
    # a -> b -> c: a (steps 0..1) and c (steps 2..3) never meet, b meets both.
    plan = make([(1000, 0, 1, "a"), (1000, 1, 2, "b"), (1000, 2, 3, "c")]).plan()
    assert plan.offsets == [0, 1024, 0]
    assert plan.arena_bytes == 2048
    assert plan.lower_bound_bytes == 2048
    assert plan.no_reuse_bytes == 3072
    assert plan.algorithm == "greedy_by_size"  # both give 2048; the tie keeps the first
    assert plan.overlaps() == []


def test_lifetimes_touching_at_one_step_conflict():
    # Inclusive ends: a ends at step 2, b starts at step 2, so they must not share.
    plan = make([(64, 0, 2), (64, 2, 4)]).plan()
    assert plan.offsets == [0, 64]
    plan = make([(64, 0, 2), (64, 3, 4)]).plan()
    assert plan.offsets == [0, 0]


def test_three_mutually_live_buffers_stack_largest_first():
    plan = make([(100, 0, 5), (300, 1, 5), (200, 2, 5)], alignment=1).plan()
    # Largest first: 300 at 0, 200 at 300, 100 at 500.
    assert plan.offsets == [500, 0, 300]
    assert plan.arena_bytes == plan.lower_bound_bytes == plan.no_reuse_bytes == 600


def test_alignment_rounds_sizes_and_offsets():
    plan = make([(100, 0, 1), (1, 0, 1), (65, 0, 1)], alignment=64).plan()
    # Aligned sizes 128, 64, 128: size order 100, 65, 1.
    assert plan.offsets == [0, 256, 128]
    assert plan.arena_bytes == 320
    assert plan.lower_bound_bytes == 320
    assert plan.no_reuse_bytes == 320
    plan = make([(100, 0, 1), (1, 0, 1)], alignment=1).plan()
    assert plan.offsets == [0, 100]
    assert plan.arena_bytes == 101


def test_zero_size_buffers_take_no_space():
    plan = make([(0, 0, 9, "empty"), (128, 0, 9), (0, 3, 4), (128, 2, 5)]).plan()
    assert plan.offsets[0] == 0 and plan.offsets[2] == 0
    assert sorted([plan.offsets[1], plan.offsets[3]]) == [0, 128]
    assert plan.arena_bytes == plan.lower_bound_bytes == 256
    assert plan.overlaps() == []
    only_empty = make([(0, 0, 1), (0, 0, 1)]).plan()
    assert only_empty.offsets == [0, 0] and only_empty.arena_bytes == 0


def test_empty_planner():
    plan = MemoryPlanner().plan()
    assert plan.offsets == [] and plan.arena_bytes == plan.lower_bound_bytes == plan.no_reuse_bytes == 0
    assert plan.overlaps() == []
    assert "arena" in plan.format()


# Sizes with alignment 1: a (2, steps 2..4), b (2, step 3), c (3, steps 4..5), d (2, step 3).
# Lower bound 6 at step 3 (a, b, d).
BREADTH_WINS = [(2, 2, 4, "a"), (2, 3, 3, "b"), (3, 4, 5, "c"), (2, 3, 3, "d")]


def test_greedy_by_size_lowest_offset():
    plan = make(BREADTH_WINS, alignment=1).plan(algorithms=["greedy_by_size"])
    # c at 0; a (meets c) at 3; b (meets a) in the gap [0, 3) at 0; d (meets a, b):
    # gap [2, 3) too small, so past a at 5.
    assert plan.offsets == [3, 0, 0, 5]
    assert plan.arena_bytes == 7
    assert plan.algorithm == "greedy_by_size"


def test_greedy_by_breadth_widest_step_first():
    plan = make(BREADTH_WINS, alignment=1).plan(algorithms=["greedy_by_breadth"])
    # Step 3 (breadth 6): a 0, b 2, d 4. Step 4 (5): c meets only a, so 2. Step 2: done.
    assert plan.offsets == [0, 2, 2, 4]
    assert plan.arena_bytes == 6 == plan.lower_bound_bytes
    assert plan.algorithm == "greedy_by_breadth"


def test_plan_keeps_smaller_arena():
    plan = make(BREADTH_WINS, alignment=1).plan()
    assert plan.algorithm == "greedy_by_breadth"
    assert plan.arena_bytes == 6
    assert set(ALGORITHMS) == {"greedy_by_size", "greedy_by_breadth"}


def test_gap_rules_first_fit_versus_best_fit():
    # Step 0 stacks a..e as 0/4/7/9/10. At step 1 only a, c, e are still live, leaving
    # gaps [4, 7) and [9, 10) for w (1 byte): greedy_by_size takes the lowest (4),
    # greedy_by_breadth the tightest (9).
    buffers = [(4, 0, 1, "a"), (3, 0, 0, "b"), (2, 0, 1, "c"), (1, 0, 0, "d"), (1, 0, 1, "e"), (1, 1, 1, "w")]
    by_size = make(buffers, alignment=1).plan(algorithms=["greedy_by_size"])
    by_breadth = make(buffers, alignment=1).plan(algorithms=["greedy_by_breadth"])
    assert by_size.offsets == [0, 4, 7, 9, 10, 4]
    assert by_breadth.offsets == [0, 4, 7, 9, 10, 9]
    assert by_size.arena_bytes == by_breadth.arena_bytes == 11


# --- no reuse --------------------------------------------------------------------------


def test_no_reuse_places_back_to_back():
    buffers = [(100, 0, 1), (0, 1, 2), (64, 2, 3), (1, 0, 0)]
    plan = make(buffers).plan(reuse=False)
    assert plan.offsets == [0, 128, 128, 192]
    assert plan.arena_bytes == plan.no_reuse_bytes == 256
    assert plan.lower_bound_bytes == 192
    assert plan.algorithm == "no_reuse"
    assert plan.overlaps() == []


# --- bad arguments ---------------------------------------------------------------------


def test_negative_size_rejected():
    planner = MemoryPlanner()
    planner.add(8, 0, 1)
    with pytest.raises(ValueError, match=r"^buffer 1 \('conv1_out'\): size must be >= 0 bytes, got -5$"):
        planner.add(-5, 0, 1, "conv1_out")
    assert len(planner) == 1  # the bad buffer was not added


def test_last_use_before_first_use_rejected():
    with pytest.raises(ValueError, match=r"^buffer 0: last_use \(2\) < first_use \(5\); a lifetime is the inclusive"):
        MemoryPlanner().add(8, 5, 2)


def test_negative_step_rejected():
    with pytest.raises(ValueError, match=r"first_use must be a step >= 0, got -1"):
        MemoryPlanner().add(8, -1, 2)


def test_bad_alignment_and_types_rejected():
    with pytest.raises(ValueError, match=r"alignment must be a positive number of bytes, got 0"):
        MemoryPlanner(alignment=0)
    with pytest.raises(TypeError, match=r"size must be an int, got float 1.5"):
        MemoryPlanner().add(1.5, 0, 1)
    with pytest.raises(TypeError, match=r"size must be an int, got bool"):
        MemoryPlanner().add(True, 0, 1)


def test_unknown_algorithm_rejected():
    with pytest.raises(ValueError, match=r"unknown memory planning algorithm\(s\) \['tetris'\]"):
        make([(8, 0, 1)]).plan(algorithms=["tetris"])


# --- random lifetimes ------------------------------------------------------------------

buffer_st = st.tuples(
    st.integers(0, 5000),  # size
    st.integers(0, 20),  # first_use
    st.integers(0, 6),  # lifetime length - 1
).map(lambda t: (t[0], t[1], t[1] + t[2]))


@settings(max_examples=300, deadline=None)
@given(
    buffers=st.lists(buffer_st, max_size=30),
    alignment=st.sampled_from([1, 7, 64, 256]),
    algorithm=st.sampled_from([ALGORITHMS, ("greedy_by_size",), ("greedy_by_breadth",)]),
)
def test_random_plans_are_valid(buffers, alignment, algorithm):
    plan = make(buffers, alignment).plan(algorithms=algorithm)
    assert plan.overlaps() == []
    assert brute_force_overlaps(buffers, plan.offsets) == []
    assert all(o % alignment == 0 and o >= 0 for o in plan.offsets)
    assert plan.lower_bound_bytes == brute_force_lower_bound(buffers, alignment)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.no_reuse_bytes
    assert plan.arena_bytes == max((o + -(-b[0] // alignment) * alignment for o, b in zip(plan.offsets, buffers)), default=0)


@settings(max_examples=100, deadline=None)
@given(buffers=st.lists(buffer_st, max_size=30), alignment=st.sampled_from([1, 64]))
def test_no_reuse_random(buffers, alignment):
    plan = make(buffers, alignment).plan(reuse=False)
    expected, total = [], 0
    for size, *_ in buffers:
        expected.append(total)
        total += -(-size // alignment) * alignment
    assert plan.offsets == expected
    assert plan.arena_bytes == plan.no_reuse_bytes == total


@settings(max_examples=100, deadline=None)
@given(buffers=st.lists(buffer_st, min_size=2, max_size=12), data=st.data())
def test_overlap_checker_finds_planted_collision(buffers, data):
    # Force every buffer to offset 0: the checker must report exactly the pairs
    # with nonzero sizes and intersecting lifetimes.
    plan = make(buffers, alignment=1).plan()
    forced = MemoryPlan.build(
        plan.sizes, plan.first_uses, plan.last_uses, plan.names, [0] * len(buffers), 1, "forced"
    )
    assert forced.overlaps() == brute_force_overlaps(buffers, [0] * len(buffers))


# --- serialisation and printing --------------------------------------------------------


def test_to_dict_from_dict_round_trip():
    plan = make([(1000, 0, 1, "a"), (1000, 1, 2, "b"), (0, 0, 0, ""), (1000, 2, 3, "c")]).plan()
    data = json.loads(json.dumps(plan.to_dict()))
    assert MemoryPlan.from_dict(data) == plan
    assert data["buffers"][1] == {"name": "b", "size": 1000, "first_use": 1, "last_use": 2, "offset": 1024}


def test_from_dict_rejects_corrupt_plans():
    data = make([(1000, 0, 1, "a"), (1000, 1, 2, "b")]).plan().to_dict()
    with pytest.raises(ValueError, match=r"stored arena_bytes=1 but the buffers give 2048"):
        MemoryPlan.from_dict({**data, "arena_bytes": 1})
    bad_offset = json.loads(json.dumps(data))
    bad_offset["buffers"][1]["offset"] = 100
    with pytest.raises(ValueError, match=r"buffer 1 \('b'\): offset 100 is not a non-negative multiple of 64"):
        MemoryPlan.from_dict(bad_offset)
    with pytest.raises(ValueError, match=r"format version 99 not supported"):
        MemoryPlan.from_dict({**data, "version": 99})
    with pytest.raises(ValueError, match=r"malformed plan dict"):
        MemoryPlan.from_dict({"version": 1, "alignment": 64})


def test_format_shows_names_totals_and_timeline():
    plan = make([(1000, 0, 1, "conv1"), (1000, 1, 2, "relu1"), (1000, 2, 3, "")]).plan()
    text = plan.format()
    for needle in ("conv1", "relu1", "%2", "2048", "3072", "arena", "lower bound", "no reuse", "greedy_by_size"):
        assert needle in text
    assert "conv1 |##..|" in text
    assert "%2    |..##|" in text
    renamed = plan.format(names=["x", "y", "z"])
    assert "x |##..|" in renamed and "conv1" not in renamed
    with pytest.raises(ValueError, match="got 1 names for 3 buffers"):
        plan.format(names=["x"])


def test_format_stays_small_for_large_plans():
    rng = random.Random(0)
    planner = MemoryPlanner()
    for i in range(500):
        planner.add(rng.randint(1, 10000), i, i + rng.randint(1, 3))
    text = planner.plan().format(max_rows=20, width=50)
    assert "... 480 more buffers" in text
    assert max(len(line) for line in text.splitlines()) < 100
    assert len(text.splitlines()) < 60


# --- performance sanity ----------------------------------------------------------------


def test_five_thousand_buffers_complete():
    rng = random.Random(0)
    planner = MemoryPlanner()
    for i in range(5000):
        size = int(math.exp(rng.uniform(math.log(1 << 10), math.log(4 << 20))))
        # Mostly short chain lifetimes, some skip connections, a few long-lived tensors.
        r = rng.random()
        length = rng.randint(1, 3) if r < 0.85 else rng.randint(4, 60) if r < 0.98 else rng.randint(100, 2000)
        planner.add(size, i, i + length)
    plan = planner.plan()
    assert plan.overlaps() == []
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.no_reuse_bytes
