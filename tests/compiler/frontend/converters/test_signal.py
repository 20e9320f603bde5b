"""onnxc's converters in compiler/frontend/converters/signal.py (windows, MelWeightMatrix, DFT,
STFT) on small models: DFT/STFT against onnx.reference; windows and the mel matrix (whose
values are constants) consumed by a kernel on a graph input, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, TensorProto

import compiler
from compiler.errors import UnsupportedError
from tests.compiler.frontend.converters.reference import (F, check_against_reference, initializer,
                                                          onnx_model, value_info)
from tests.compiler.onnx_check import check, run_onnxc


RNG = np.random.default_rng(0)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _consumed(nodes, feeds: dict, consts: dict, out_shape):
    """A model whose output ``y`` a kernel computes from graph input ``x`` and the signal
    op's constant result (``nodes``); its inputs ``feeds`` (graph inputs) and ``consts``
    (initializers)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                         list(a.shape)) for n, a in feeds.items()]
    inits = [initializer(n, a) for n, a in consts.items()]
    dtype = helper.np_dtype_to_tensor_dtype(feeds["x"].dtype)
    g = helper.make_graph(nodes, "g", vis, [helper.make_tensor_value_info("y", dtype,
                                                                          out_shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _check_kernel_against_onnxruntime(model, feeds, rtol=1e-5, atol=1e-6):
    """onnxc against onnxruntime (not onnx.reference, which folding may have used), and
    proof that a kernel, not compile-time folding, computed the output."""
    from tests.conftest import ort_run

    cm = compiler.compile(model)
    sess = cm.session()
    got = sess.run(None, feeds)
    np.testing.assert_allclose(got[0], ort_run(model, feeds)[0], rtol=rtol, atol=atol)
    reports = getattr(sess, "reports", None) or [cm.report]
    for r in reports:
        assert r["constant_outputs"] == [] and r["kernels"] >= 1
        assert r["onnx_nodes_folded"] == 0  # the signal op was our converter's, not folded
    return got


@pytest.mark.parametrize("op", ["BlackmanWindow", "HammingWindow", "HannWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_weigh_a_signal(op, periodic):
    x = _f(3, 9)
    model = _consumed([helper.make_node(op, ["size"], ["w"], periodic=periodic),
                       helper.make_node("Mul", ["x", "w"], ["y"])],
                      {"x": x}, {"size": np.array(9, np.int32)}, [3, 9])
    _check_kernel_against_onnxruntime(model, {"x": x})


def test_window_size_as_graph_input_and_double_output():
    # the size is bound as a value (it fixes the shape); x stays an input for the kernel
    x = RNG.standard_normal((2, 6))
    model = _consumed([helper.make_node("HannWindow", ["size"], ["w"],
                                        output_datatype=TensorProto.DOUBLE),
                       helper.make_node("Mul", ["x", "w"], ["y"])],
                      {"x": x, "size": np.array(6, np.int64)}, {}, [2, 6])
    _check_kernel_against_onnxruntime(model, {"x": x, "size": np.array(6, np.int64)})


@pytest.mark.parametrize("as_inputs", [False, True])
def test_mel_weight_matrix_maps_a_spectrogram(as_inputs):
    vals = {"bins": np.array(6, np.int32), "dft": np.array(32, np.int32),
            "rate": np.array(8000, np.int32), "low": np.array(100.0, np.float32),
            "high": np.array(3500.0, np.float32)}
    spec = np.abs(_f(4, 17))  # |STFT| frames x (dft / 2 + 1) bins
    nodes = [helper.make_node("MelWeightMatrix", list(vals), ["mel"]),
             helper.make_node("MatMul", ["x", "mel"], ["y"])]
    feeds = {"x": spec, **(vals if as_inputs else {})}
    model = _consumed(nodes, feeds, {} if as_inputs else vals, [4, 6])
    _check_kernel_against_onnxruntime(model, feeds)


@pytest.mark.parametrize("last,attrs,length", [
    (1, {}, None),                                  # real forward
    (2, {}, None),                                  # complex forward
    (1, {"onesided": 1}, None),                     # rfft
    (2, {"inverse": 1}, None),                      # inverse
    (2, {"inverse": 1, "onesided": 1}, None),       # irfft, even length
    (2, {"inverse": 1, "onesided": 1}, 9),          # irfft, odd length
    (1, {}, 12),                                    # zero-padded
    (1, {"onesided": 1}, 5),                        # truncated
])
@pytest.mark.parametrize("opset", [19, 20])
def test_dft(last, attrs, length, opset):
    x = _f(2, 7, 3, last)
    inputs = {"x": x}
    consts = []
    if length is not None or opset >= 20:
        inputs["dft_length" if length is not None else "-len"] = np.array(length or 0, np.int64)
        if length is not None:
            consts.append("dft_length")
    if opset >= 20:
        inputs["axis"] = np.array(1, np.int64)
        consts.append("axis")
    else:
        attrs = dict(attrs, axis=1)
    check("DFT", inputs, consts=tuple(consts), opset=opset, atol=1e-4, **attrs)


def test_dft_axis_as_graph_input_opset20():
    check("DFT", {"x": _f(2, 5, 4, 1), "-len": np.array(0, np.int64),
                  "axis": np.array(-2, np.int64)}, opset=20, atol=1e-4)


def test_dft_refuses_integer_length_below_one():
    with pytest.raises(UnsupportedError, match="dft_length=0"):
        run_onnxc("DFT", {"x": _f(2, 4, 1), "n": np.array(0, np.int64)}, consts=("n",),
                  opset=19, out_shape=[2, 0, 2], axis=1)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft(onesided):
    # onesided is set explicitly: onnx 1.23's STFT shape inference takes 0 when it is absent
    check("STFT", {"x": _f(2, 40, 1), "step": np.array(6, np.int64), "-w": np.zeros(0),
                   "len": np.array(8, np.int64)}, consts=("step", "len"), opset=17,
          atol=1e-4, onesided=onesided)


def test_stft_with_window_and_complex_signal():
    check("STFT", {"x": _f(1, 30, 2), "step": np.array(4, np.int64),
                   "w": np.hanning(10).astype(np.float32)}, consts=("step",), opset=17,
          atol=1e-4, onesided=0)


@pytest.mark.parametrize("window", [False, True])
def test_stft_omitted_onesided_with_constant_frames(window):
    x = RNG.standard_normal((1, 64, 1)).astype(np.float32)
    inits = [initializer("step", np.int64(8)), initializer("length", np.int64(16))]
    if window:
        inits.append(initializer("w", np.hanning(16).astype(np.float32)))
    node = helper.make_node("STFT", ["x", "step", "w" if window else "", "length"], ["y"])
    model = onnx_model(node, [value_info("x", F, [1, 64, 1])], [value_info("y", F, [1, 7, 9, 2])], 17, inits)
    got = check_against_reference(model, {"x": x})[0]
    assert got.shape == (1, 7, 9, 2)
    assert not any(a.name == "onesided" for a in model.graph.node[0].attribute)  # not mutated
