"""compiler/lowering/layouts.py: the layout each tensor is in after convert_layout, and the
mapping back to the ONNX layout that ``onnxc debug`` compares in."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.driver import lower_to_kernels
from compiler.lowering.layouts import UNKNOWN, to_onnx_layout

HOST = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 2}


def _blocked(a: np.ndarray, b: int) -> np.ndarray:
    n, c, h, w = a.shape
    cp = -(-c // b) * b
    p = np.zeros((n, cp, h, w), a.dtype)
    p[:, :c] = a
    return p.reshape(n, cp // b, b, h, w).transpose(0, 1, 3, 4, 2).copy()


def test_to_onnx_layout_undoes_nchwc_and_nhwc():
    a = np.random.default_rng(0).standard_normal((1, 20, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(to_onnx_layout(_blocked(a, 8), "NCHW8c", a.shape), a)
    np.testing.assert_array_equal(to_onnx_layout(a.transpose(0, 2, 3, 1), "NHWC", a.shape), a)
    assert to_onnx_layout(a, None, a.shape) is a


def test_to_onnx_layout_refuses_what_does_not_fit():
    a = np.zeros((1, 2, 3, 5, 8), np.float32)
    assert to_onnx_layout(a, "NCHW16c", [1, 16, 3, 5]) is None   # block 8 != 16
    assert to_onnx_layout(a, "NCHW8c", [1, 32, 3, 5]) is None    # too few channels
    assert to_onnx_layout(a, UNKNOWN, [1, 16, 3, 5]) is None


def _conv_model(transpose=False):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="act"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2])]
    out_shape = [1, 16, 4, 4]
    if transpose:
        nodes.append(helper.make_node("Transpose", ["p"], ["y"], name="tr", perm=[0, 2, 3, 1]))
        out_shape = [1, 4, 4, 16]
    else:
        nodes.append(helper.make_node("Relu", ["p"], ["y"], name="act2"))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("layout,expected", [("NCHWc", "NCHW16c"), ("NHWC", "NHWC"),
                                             ("NCHW", None)])
def test_graph_records_each_tensors_layout(layout, expected):
    graph, _ = lower_to_kernels(_conv_model(), HOST, layout=layout)  # znver5: 16 lanes
    by_name = {t.name: t.layout for t in graph.tensors}
    conv_out = next(graph.tensors[c["args"][-1]] for c in graph.calls if "conv" in c["nodes"])
    assert conv_out.layout == expected
    assert by_name["n1"] == by_name["n3"] == expected  # the pool + relu keep it
    out = graph.tensors[graph.outputs[0][1]]
    assert out.layout is None  # model outputs are in the ONNX layout
    if expected:
        assert len(conv_out.shape) == (5 if expected.endswith("c") else 4)


def test_an_onnx_transpose_is_not_taken_for_a_layout_change():
    graph, _ = lower_to_kernels(_conv_model(transpose=True), HOST, layout="NCHW")
    assert all(t.layout is None for t in graph.tensors)
