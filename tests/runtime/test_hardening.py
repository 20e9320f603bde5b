"""Hardening of sessions: concurrent runs, huge inputs refused before allocation."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
import runtime
from tests.conftest import compiled, zoo, zoo_model


def test_eight_threads_on_one_session_are_correct():
    cm = compiled("cnn")
    sess = cm.session()
    feeds = [zoo.random_inputs(zoo_model("cnn"), seed=i) for i in range(8)]
    expected = [sess.run(None, f) for f in feeds]
    copies = [{k: v.copy() for k, v in f.items()} for f in feeds]
    errors, outs = [], [[] for _ in feeds]
    barrier = threading.Barrier(8)

    def work(i):
        try:
            barrier.wait()
            for _ in range(15):
                outs[i].append(sess.run(None, feeds[i]))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for i, runs in enumerate(outs):
        for got in runs:
            for g, w in zip(got, expected[i]):
                np.testing.assert_array_equal(g, w)
    for f, c in zip(feeds, copies):  # inputs never modified
        for k in f:
            np.testing.assert_array_equal(f[k], c[k])
    all_outs = [o for runs in outs for got in runs for o in got]  # outputs never alias
    for a in all_outs[:40]:
        assert a.flags.owndata or a.base is None or not any(
            np.shares_memory(a, b) for b in all_outs[:40] if b is not a)
    assert 1 <= sess._arenas <= sess.max_arenas


def test_single_arena_session_is_still_correct_under_threads():
    sess = compiled("mlp").session()
    sess.max_arenas = 1
    feed = zoo.random_inputs(zoo_model("mlp"), seed=1)
    want = sess.run(None, feed)
    res = []
    ts = [threading.Thread(target=lambda: res.append(sess.run(None, feed))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(res) == 8 and sess._arenas == 1
    for r in res:
        np.testing.assert_array_equal(r[0], want[0])


def test_instrumented_sessions_keep_one_arena():
    sess = compiled("mlp").session(runtime.SessionOptions(check_nan=True))
    assert sess.max_arenas == 1


def _gram():
    """x[n, 4] -> x @ x^T: an [n, n] output from a small input."""
    g = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["xt"], name="t", perm=[1, 0]),
         helper.make_node("MatMul", ["x", "xt"], ["y"], name="gram")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "n"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_huge_shape_is_refused_before_allocation():
    """A symbolic dim is served within its range (the arena planned for its maximum): a
    huge one is refused by the range, before anything is allocated."""
    sess = compiler.compile(_gram()).session()
    small = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": small})[0], small @ small.T)
    n = 1_000_000  # a 16 MB input whose [n, n] output would need 4 TB
    with pytest.raises(ValueError, match=r"input 'x': axis 0 is dim 'n' = 1000000, outside "
                                         r"the range 1\.\.128"):
        sess.run(None, {"x": np.zeros((n, 4), np.float32)})


def test_memory_limit_env_override(monkeypatch):
    """The plan for the dims' maxima is checked when the session is made."""
    cm = compiler.compile(_gram(), dims={"n": (1, 1000)})
    monkeypatch.setenv("ONNXC_MEMORY_LIMIT", str(1 << 20))
    with pytest.raises(runtime.MemoryLimitError,
                       match=r"largest tensor: .*float32\['n', 'n'\]"):
        cm.session()  # y at n = 1000: 4 MB > 1 MiB
