"""Session.run's static path (runtime/session.py ``_static_plan`` / ``_run_static``): the plan
is made once at load and reused, dropped outputs' memory is written again and held outputs'
never, inputs of IN_PLACE_MIN_BYTES or more are read in place when as aligned as the graph
says (their element size) and copied when not, smaller ones copied; results equal onnxruntime's; bad feeds still refused by name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from runtime.instruments import SessionOptions
from runtime.session import IN_PLACE_MIN_BYTES, _aligned_bytes
from tests.conftest import assert_close, ort_run

BIG, SMALL = (64, 256), (2, 256)  # 64 KiB and 2 KiB of float32


def _aligned(a, off=0):
    raw = _aligned_bytes(a.nbytes + 64)
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.fixture(scope="module")
def model():
    """y = Relu(x @ W) and z = Relu(s @ W): x above the in-place threshold, s below."""
    w = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
         helper.make_node("MatMul", ["s", "w"], ["k"]), helper.make_node("Relu", ["k"], ["z"])],
        "static", [vi("x", TensorProto.FLOAT, list(BIG)), vi("s", TensorProto.FLOAT, list(SMALL))],
        [vi("y", TensorProto.FLOAT, [BIG[0], 16]), vi("z", TensorProto.FLOAT, [SMALL[0], 16])],
        [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return m, compiler.compile(m, target="host")


def _feed(seed):
    rng = np.random.default_rng(seed)
    return {"x": _aligned(rng.standard_normal(BIG).astype(np.float32)),
            "s": _aligned(rng.standard_normal(SMALL).astype(np.float32))}


def _arena_input(sess, name):
    t = next(i["tensor"] for i in sess.graph["inputs"] if i["name"] == name)
    return sess._np[t]


def test_structure_plan_made_once_and_reused(model):
    _, cm = model
    sess = cm.session()
    assert sess._static is not None
    assert np.prod(BIG) * 4 >= IN_PLACE_MIN_BYTES > np.prod(SMALL) * 4
    feed = _feed(1)
    prepared = sess._first.prepared[()]
    for _ in range(6):
        outs = sess.run(None, feed)  # noqa: F841 - held until the next assignment, as callers do
    assert sess._first.prepared[()] is prepared and len(sess._first.prepared) == 1
    pools = sess._first.pools
    assert set(pools) == set(sess._direct_out.values())
    assert all(len(p.slots) == 2 and p.reused >= 3 for p in pools.values())
    assert len(sess._first.combos) == 2  # the two slot pairs the loop alternates between


def test_dropped_output_reused_held_output_never(model):
    m, cm = model
    sess = cm.session()
    feeds = [_feed(s) for s in (2, 3, 4)]
    want = [ort_run(m, f) for f in feeds]
    held = sess.run(None, feeds[0])
    kept = [a.copy() for a in held]
    addr = sess.run(None, feeds[1])[0].ctypes.data  # dropped at once
    again = sess.run(None, feeds[2])
    assert again[0].ctypes.data == addr  # the dropped memory, written again
    assert not any(np.shares_memory(h, a) for h in held for a in again)
    for h, k in zip(held, kept):
        np.testing.assert_array_equal(h, k)  # held results untouched by later runs
    assert_close(held, want[0])
    assert_close(again, want[2])


def test_reuse_off_gives_fresh_memory(model):
    _, cm = model
    sess = cm.session(SessionOptions(reuse_outputs=False))
    feed = _feed(5)
    for _ in range(3):
        sess.run(None, feed)  # dropped at once
    pools = sess._first.pools.values()
    assert pools and all(not p.slots and p.reused == 0 for p in pools)


def test_large_aligned_input_read_in_place_small_and_unaligned_copied(model):
    m, cm = model
    sess = cm.session()
    x_arena, s_arena = _arena_input(sess, "x"), _arena_input(sess, "s")
    feed = _feed(6)
    want = ort_run(m, feed)
    x_arena[...] = 7.0
    assert_close(sess.run(None, feed), want)
    assert (x_arena == 7.0).all()  # x read where the caller has it
    np.testing.assert_array_equal(s_arena, feed["s"])  # s (2 KiB) copied, though aligned
    # element-aligned (the kernels reading x are built for it: input_alignment.py): in place
    x_arena[...] = 7.0
    assert_close(sess.run(None, {"x": _aligned(feed["x"], off=4), "s": feed["s"]}), want)
    assert (x_arena == 7.0).all()
    # below float32's alignment; strided
    for x in (_aligned(feed["x"], off=2), feed["x"].copy(order="F")):
        x_arena[...] = 7.0
        assert_close(sess.run(None, {"x": x, "s": feed["s"]}), want)
        np.testing.assert_array_equal(x_arena, feed["x"])  # copied into the arena


def test_read_only_input_is_copied(model):
    m, cm = model
    sess = cm.session()
    feed = _feed(7)
    feed["x"].flags.writeable = False  # DLPack exports no read-only memory
    assert_close(sess.run(None, feed), ort_run(m, feed))
    np.testing.assert_array_equal(_arena_input(sess, "x"), feed["x"])


def test_subclass_feed_accepted_through_the_full_check(model):
    m, cm = model
    sess = cm.session()

    class Tagged(np.ndarray):
        pass

    feed = _feed(8)
    sub = {"x": feed["x"].view(Tagged), "s": feed["s"]}
    assert_close(sess.run(None, sub), ort_run(m, feed))


@pytest.mark.parametrize("feed,message", [
    ({"x": np.zeros(BIG, np.float64), "s": np.zeros(SMALL, np.float32)},
     "input 'x': expected dtype tensor(float), got tensor(double)"),
    ({"x": np.zeros((64, 255), np.float32), "s": np.zeros(SMALL, np.float32)},
     "input 'x': expected shape [64, 256], got [64, 255]"),
    ({"x": np.zeros(BIG, np.float32)}, "missing input 's'"),
    ({"x": np.zeros(BIG, np.float32), "s": np.zeros(SMALL, np.float32), "q": 1},
     "unknown input 'q'"),
    ({"x": np.zeros(BIG, np.float32).tolist(), "s": np.zeros(SMALL, np.float32)},
     "input 'x': expected a numpy array, got list"),
])
def test_bad_feeds_refused_by_name(model, feed, message):
    _, cm = model
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace("]", r"\]")):
        cm.session().run(None, feed)


def test_threads_keep_and_drop_results_never_overwritten(model):
    """Four threads on one session (arenas from the pool, each with its own output pools):
    every kept result still holds its run's values after all runs, dropped ones are reused."""
    import threading

    m, cm = model
    sess = cm.session()
    feeds = [_feed(20 + i) for i in range(4)]
    want = [ort_run(m, f) for f in feeds]
    kept, errors = [[] for _ in feeds], []

    def work(i):
        try:
            for r in range(12):
                outs = sess.run(None, feeds[i])
                if r % 3 == 0:
                    kept[i].append(outs)  # every third result held to the end
        except Exception as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    for i, results in enumerate(kept):
        assert len(results) == 4
        for outs in results:
            assert_close(outs, want[i])
