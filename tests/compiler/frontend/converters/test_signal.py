"""onnxc's converters in compiler/frontend/converters/signal.py (windows, MelWeightMatrix, DFT,
STFT) against onnx.reference on small models."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, TensorProto

from compiler.errors import UnsupportedError
from tests.compiler.frontend.converters.reference import (F, check_against_reference, initializer,
                                                          onnx_model, value_info)
from tests.compiler.onnx_check import check, run_onnxc


RNG = np.random.default_rng(0)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op", ["BlackmanWindow", "HammingWindow", "HannWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    check(op, {"size": np.array(9, np.int32)}, consts=("size",), opset=17, periodic=periodic)


def test_window_size_as_graph_input_and_double_output():
    check("HannWindow", {"size": np.array(6, np.int64)}, opset=17,
          output_datatype=TensorProto.DOUBLE)


def test_mel_weight_matrix():
    vals = {"bins": np.array(6, np.int32), "dft": np.array(32, np.int32),
            "rate": np.array(8000, np.int32), "low": np.array(100.0, np.float32),
            "high": np.array(3500.0, np.float32)}
    check("MelWeightMatrix", vals, consts=tuple(vals), opset=17)
    # all as graph inputs: bound to their values when run
    check("MelWeightMatrix", vals, opset=17)


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
