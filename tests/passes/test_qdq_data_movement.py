"""qdq_data_movement: Q(op(DQ(q))) with one scale and zero point => op(q) for data movement,
concat and max pooling: rewrite counts, the bytes moved (no float kernel left), exact
agreement with onnxruntime, and what it must leave alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import compiler
from passes.qdq_data_movement import RULE


def _qdq(x, tag, scale="s", zero="z"):
    """Q -> DQ of tensor ``x`` (onnxruntime's quantizer after every op), named ``tag``."""
    return ([helper.make_node("QuantizeLinear", [x, scale, zero], [f"{tag}_q"]),
             helper.make_node("DequantizeLinear", [f"{tag}_q", scale, zero], [f"{tag}_d"])],
            f"{tag}_d")


def _model(nodes, out, out_shape, extra=(), dtype=TP.UINT8):
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             helper.make_tensor("z", dtype, [], [120 if dtype == TP.UINT8 else -5]),
             numpy_helper.from_array(np.array(0.07, np.float32), "s2"),
             helper.make_tensor("z2", dtype, [], [100 if dtype == TP.UINT8 else 3]),
             *extra]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT,
                                                                     [1, 8, 6, 6])],
                          [helper.make_tensor_value_info(out, TP.FLOAT, out_shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _shape(name, dims):
    return numpy_helper.from_array(np.array(dims, np.int64), name)


def channel_shuffle(dtype=TP.UINT8):
    """ShuffleNet's split / concat / reshape / transpose / reshape, each between DQ and Q."""
    n0, x0 = _qdq("x", "in")
    nodes = n0 + [helper.make_node("Split", [x0, "halves"], ["a", "b"], axis=1)]
    na, a = _qdq("a", "a")
    nb, b = _qdq("b", "b")
    nodes += na + nb + [helper.make_node("Concat", [b, a], ["c"], axis=1)]
    nc, c = _qdq("c", "c")
    nodes += nc + [helper.make_node("Reshape", [c, "grouped"], ["r"])]
    nr, r = _qdq("r", "r")
    nodes += nr + [helper.make_node("Transpose", [r], ["t"], perm=[0, 2, 1, 3, 4])]
    nt, t = _qdq("t", "t")
    nodes += nt + [helper.make_node("Reshape", [t, "flat"], ["f"])]
    nf, f = _qdq("f", "f")
    nodes += nf + [helper.make_node("MaxPool", [f], ["p"], kernel_shape=[3, 3],
                                    strides=[2, 2], pads=[1, 1, 1, 1])]
    np_, p = _qdq("p", "p")
    return _model(nodes + np_, p, [1, 8, 3, 3], [
        _shape("halves", [4, 4]), _shape("grouped", [1, 2, 4, 6, 6]),
        _shape("flat", [1, 8, 6, 6])], dtype)


def _rewrites(cm) -> int:
    report = next(p for p in cm.report["passes"] if p["name"] == "qdq_data_movement")
    return report["rewrites"].get(RULE, 0)


def _run(model):
    x = (np.random.default_rng(0).standard_normal((1, 8, 6, 6)) * 3).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cm = compiler.compile(model)
    return cm, cm.session().run(None, {"x": x})[0], want


@pytest.mark.parametrize("dtype", [TP.UINT8, TP.INT8])
def test_channel_shuffle_moves_bytes(dtype):
    cm, got, want = _run(channel_shuffle(dtype))
    # the split's two halves (strided slices), concat, reshape, transpose, reshape, max pool
    assert _rewrites(cm) == 7
    np.testing.assert_array_equal(got, want)
    # what is left of the requantisations: the input's quantize and the output's dequantize
    names = [k["kernel"] for k in cm.report["kernel_table"]]
    assert sum(n.count("quantize") for n in names) == 2, names


def test_other_parameters_left_alone():
    """A Q with another scale than the DQ before its op, and a concat whose inputs were
    dequantized with different parameters, keep their requantisation (and match
    onnxruntime)."""
    n0, x0 = _qdq("x", "in")
    nodes = n0 + [helper.make_node("Transpose", [x0], ["t"], perm=[0, 1, 3, 2])]
    nt, t = _qdq("t", "t", "s2", "z2")
    nodes += nt + [helper.make_node("Concat", [t, x0], ["c"], axis=1)]
    nc, c = _qdq("c", "c", "s2", "z2")
    cm, got, want = _run(_model(nodes + nc, c, [1, 16, 6, 6]))
    assert _rewrites(cm) == 0
    np.testing.assert_array_equal(got, want)
