"""The onnxruntime-shaped Session API: signature, refusals, no aliasing, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime
from tests.conftest import assert_close, compiled, ort_run, zoo, zoo_model


@pytest.fixture(scope="module")
def sess(cnn_so):
    return runtime.load(str(cnn_so))


def test_get_inputs_outputs_like_onnxruntime(sess):
    import onnxruntime as ort

    ref = ort.InferenceSession(zoo_model("cnn").SerializeToString(),
                               providers=["CPUExecutionProvider"])
    for ours, theirs in [(sess.get_inputs(), ref.get_inputs()),
                         (sess.get_outputs(), ref.get_outputs())]:
        assert [(a.name, a.shape, a.type) for a in ours] == \
               [(b.name, b.shape, b.type) for b in theirs]
    assert sess.get_inputs()[0].type == "tensor(float)"


def test_unknown_input(sess):
    x = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(ValueError, match=r"unknown input 'image'.*inputs are \['input'\]"):
        sess.run(None, {"input": x, "image": x})


def test_missing_input(sess):
    with pytest.raises(ValueError, match=r"missing input 'input'"):
        sess.run(None, {})


def test_wrong_shape(sess):
    with pytest.raises(ValueError, match=r"input 'input': expected shape \[1, 3, 32, 32\], "
                                         r"got \[1, 3, 32, 31\]"):
        sess.run(None, {"input": np.zeros((1, 3, 32, 31), np.float32)})


def test_wrong_dtype(sess):
    with pytest.raises(ValueError, match=r"input 'input': expected dtype tensor\(float\), "
                                         r"got tensor\(double\)"):
        sess.run(None, {"input": np.zeros((1, 3, 32, 32), np.float64)})


def test_not_an_array(sess):
    with pytest.raises(ValueError, match=r"input 'input': expected a numpy array, got list"):
        sess.run(None, {"input": [[0.0]]})


def test_unknown_output_name(sess):
    x = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(ValueError, match=r"unknown output 'prob'.*\['logits'\]"):
        sess.run(["prob"], {"input": x})


def test_inputs_never_modified_outputs_never_alias(sess):
    feeds = zoo.random_inputs(zoo_model("cnn"), seed=5)
    x = feeds["input"]
    keep = x.copy()
    (a,) = sess.run(None, feeds)
    np.testing.assert_array_equal(x, keep)
    assert not np.shares_memory(a, sess._arena)
    a_copy = a.copy()
    a[...] = np.nan  # scribbling on a result must not reach the session
    (b,) = sess.run(["logits"], feeds)
    np.testing.assert_array_equal(b, a_copy)


def test_in_place_kernels_do_not_touch_caller_input():
    """dwsep's residual Add runs in place, on the arena copy of the input only."""
    model = zoo_model("dwsep")
    sess = compiled("dwsep").session()
    feeds = zoo.random_inputs(model, seed=6)
    keep = {k: v.copy() for k, v in feeds.items()}
    out1 = sess.run(None, feeds)
    out2 = sess.run(None, feeds)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], keep[k])
    assert_close(out1, ort_run(model, keep))
    np.testing.assert_array_equal(out1[0], out2[0])


def test_concurrent_runs_are_correct(sess):
    model = zoo_model("cnn")
    cases = [zoo.random_inputs(model, seed=s) for s in range(8)]
    expected = [ort_run(model, f) for f in cases]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                assert_close(sess.run(None, cases[i]), expected[i])
        except Exception as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
