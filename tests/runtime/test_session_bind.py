"""Session I/O binding (runtime/session.py ``direct_buffers``, ``SessionOptions.bind_io``):
kernels write requested outputs straight into the returned arrays and read an aligned input
in place; results stay correct, fresh and unaliased, and the caller's input untouched."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from runtime.instruments import SessionOptions
from runtime.session import _aligned_bytes, direct_buffers
from tests.conftest import assert_close, ort_run


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "bind", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    out = _aligned_bytes(a.nbytes).view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _misaligned_copy(a: np.ndarray) -> np.ndarray:
    raw = _aligned_bytes(a.nbytes + 64)
    out = raw[16:16 + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.fixture(scope="module")
def matmul_relu():
    """x [5, 48] @ W [48, 40] -> Relu: the input is only read (bindable in place)."""
    w = np.random.default_rng(0).standard_normal((48, 40)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Relu", ["h"], ["y"])],
               [_vi("x", [5, 48])], [_vi("y", [5, 40])], [numpy_helper.from_array(w, "w")])
    return m, compiler.compile(m, target="host")


@pytest.fixture(scope="module")
def relu_in_place():
    """y = Relu(x) with y planned in x's buffer, as artifacts built before the planner
    kept model inputs out of in-place outputs (and as a key/value cache appended in place
    still is): the kernel overwrites x's buffer, so x is copied, never bound."""
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [3, 64, 33])],
               [_vi("y", [3, 64, 33])])
    cm = compiler.compile(m, target="host")
    graph = cm.meta["graph"]
    x_t, y_t = graph["inputs"][0]["tensor"], graph["outputs"][0]["tensor"]
    assert graph["tensors"][y_t]["index"] != graph["tensors"][x_t]["index"]  # today's plan
    graph["tensors"][y_t]["index"] = graph["tensors"][x_t]["index"]
    graph["calls"][0]["inplace"] = [0]
    return m, cm


def test_structure_input_read_in_place_output_written_direct(matmul_relu):
    _, cm = matmul_relu
    direct_in, direct_out, uses = direct_buffers(cm.meta["graph"])
    assert set(direct_in) == {"x"} and set(direct_out) == {"y"}
    assert all(nbytes > 0 for nbytes, _ in uses.values())
    sess = cm.session()
    graph = cm.meta["graph"]
    out_t = graph["outputs"][0]["tensor"]
    sess._np[out_t][...] = 7.0  # the arena's copy of y: bound runs never write it
    x = _aligned_copy(np.ones((5, 48), np.float32))
    (y,) = sess.run(None, {"x": x})
    assert (sess._np[out_t] == 7.0).all() and not (y == 7.0).all()


def test_aligned_and_misaligned_inputs_match_onnxruntime(matmul_relu):
    model, cm = matmul_relu
    sess = cm.session()
    x = np.random.default_rng(1).standard_normal((5, 48)).astype(np.float32)
    want = ort_run(model, {"x": x})
    for feed in (_aligned_copy(x), _misaligned_copy(x), x):
        keep = feed.copy()
        assert_close(sess.run(None, {"x": feed}), want)
        np.testing.assert_array_equal(feed, keep)
    ro = _aligned_copy(x)
    ro.flags.writeable = False  # DLPack cannot export it: copied instead
    assert_close(sess.run(None, {"x": ro}), want)


def test_outputs_fresh_each_run_and_never_alias(matmul_relu):
    _, cm = matmul_relu
    sess = cm.session()
    rng = np.random.default_rng(2)
    x1, x2 = (_aligned_copy(rng.standard_normal((5, 48)).astype(np.float32)) for _ in range(2))
    (a,) = sess.run(None, {"x": x1})
    a_keep = a.copy()
    (b,) = sess.run(None, {"x": x2})
    np.testing.assert_array_equal(a, a_keep)  # the second run did not write the first result
    assert not np.shares_memory(a, b)
    assert not np.shares_memory(a, sess._arena) and not np.shares_memory(a, x1)
    y1, y2 = sess.run(["y", "y"], {"x": x1})  # the same output twice: two arrays
    np.testing.assert_array_equal(y1, a_keep)
    assert not np.shares_memory(y1, y2)


def test_in_place_kernel_on_input_buffer(relu_in_place):
    model, cm = relu_in_place
    direct_in, direct_out, _ = direct_buffers(cm.meta["graph"])
    assert "x" not in direct_in  # no kernel may write the caller's array
    sess = cm.session()
    x = _aligned_copy(np.random.default_rng(3).standard_normal((3, 64, 33)).astype(np.float32))
    keep = x.copy()
    (y1,) = sess.run(None, {"x": x})
    (y2,) = sess.run(None, {"x": -x})
    np.testing.assert_array_equal(x, keep)
    np.testing.assert_array_equal(y1, np.maximum(keep, 0))
    np.testing.assert_array_equal(y2, np.maximum(-keep, 0))


def test_outputs_sharing_a_buffer_are_copied():
    """y and its reshape z share one buffer: neither is bound, both come back right."""
    shape = onnx.numpy_helper.from_array(np.array([4, 16], np.int64), "s")
    m = _model([helper.make_node("Relu", ["x"], ["y"]),
                helper.make_node("Reshape", ["y", "s"], ["z"])],
               [_vi("x", [2, 32])], [_vi("y", [2, 32]), _vi("z", [4, 16])], [shape])
    cm = compiler.compile(m, target="host")
    x = np.random.default_rng(4).standard_normal((2, 32)).astype(np.float32)
    got = cm.session().run(None, {"x": _aligned_copy(x)})
    assert_close(got, ort_run(m, {"x": x}))
    assert not np.shares_memory(got[0], got[1])


def test_bind_off_keeps_outputs_in_the_arena(matmul_relu):
    model, cm = matmul_relu
    sess = cm.session(SessionOptions(bind_io=False))
    x = np.random.default_rng(5).standard_normal((5, 48)).astype(np.float32)
    (y,) = sess.run(None, {"x": _aligned_copy(x)})
    out_t = cm.meta["graph"]["outputs"][0]["tensor"]
    np.testing.assert_array_equal(sess._np[out_t], y)  # tools read it there
    assert_close([y], ort_run(model, {"x": x}))


def test_concurrent_runs_with_bound_io(matmul_relu):
    model, cm = matmul_relu
    sess = cm.session()
    rng = np.random.default_rng(6)
    cases = [_aligned_copy(rng.standard_normal((5, 48)).astype(np.float32)) for _ in range(6)]
    want = [ort_run(model, {"x": c}) for c in cases]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                assert_close(sess.run(None, {"x": cases[i]}), want[i])
        except Exception as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
