"""onnxc's integer / quantized converters (compiler/frontend/converters/quantization.py:
QLinearMatMul, QLinearConv, ConvInteger, BitCast, DynamicQuantizeLinear) against
onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, TensorProto

import compiler
from compiler.errors import CompileError, UnsupportedError
from tests.compiler.frontend.converters.reference import F, I64, RNG, value_info
from tests.compiler.onnx_check import check


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("scale_dt", [np.float32, np.float16])
def test_qlinear_matmul(dt, scale_dt):
    info = np.iinfo(dt)
    a = RNG.integers(info.min, info.max, (2, 3, 4)).astype(dt)
    b = RNG.integers(info.min, info.max, (2, 4, 5)).astype(dt)
    s = lambda v: np.array([v], scale_dt)  # noqa: E731
    z = lambda v: np.array([v], dt)  # noqa: E731
    inputs = {"a": a, "as": s(0.02), "az": z(3), "b": b, "bs": s(0.03), "bz": z(5),
              "ys": s(0.7), "yz": z(7)}
    if scale_dt == np.float32:
        check("QLinearMatMul", inputs, opset=21)
        return
    # float16 scales: onnxc computes the requantisation in float32 (passes/widen_half.py)
    # as onnxruntime does; onnx.reference rounds it in float16 and differs from both by
    # one step on some elements
    import onnxruntime as ort

    node = helper.make_node("QLinearMatMul", list(inputs), ["y"])
    elem = helper.np_dtype_to_tensor_dtype
    g = helper.make_graph([node], "g", [value_info(n, elem(v.dtype), list(v.shape))
                                        for n, v in inputs.items()],
                          [value_info("y", elem(np.dtype(dt)), [2, 3, 5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    want = ort.InferenceSession(m.SerializeToString()).run(None, inputs)[0]
    np.testing.assert_array_equal(compiler.compile(m).session().run(None, inputs)[0], want)


def test_qlinear_conv_per_channel_with_bias():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    check("QLinearConv", {"x": x, "xs": np.array(0.01, np.float32),
                           "xz": np.array(100, np.uint8), "w": w,
                           "ws": np.array([0.02, 0.03, 0.01], np.float32),
                           "wz": np.array([120, 128, 130], np.uint8),
                           "ys": np.array(0.5, np.float32), "yz": np.array(10, np.uint8),
                           "bias": RNG.integers(-500, 500, (3,)).astype(np.int32)},
           opset=10, pads=[1, 1, 1, 1])


def test_conv_integer_per_channel_zero_point():
    x = RNG.integers(0, 255, (1, 1, 4, 4)).astype(np.uint8)
    w = RNG.integers(0, 255, (2, 1, 2, 2)).astype(np.uint8)
    check("ConvInteger", {"x": x, "w": w, "xz": np.array(3, np.uint8),
                           "wz": np.array([1, 2], np.uint8)}, opset=10, strides=[2, 2])


@pytest.mark.parametrize("src,to", [(np.float32, TensorProto.INT32),
                                    (np.int64, TensorProto.DOUBLE),
                                    (np.int16, TensorProto.UINT16),
                                    (np.bool_, TensorProto.UINT8)])
def test_bitcast(src, to):
    x = (RNG.standard_normal((2, 3)) * 100).astype(src)
    x.flat[0] = -x.flat[0] if src != np.bool_ else x.flat[0]
    check("BitCast", {"x": x}, opset=26, to=to)


def test_bitcast_refuses_width_change():
    node = helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)
    g = helper.make_graph([node], "g", [value_info("x", F, [2])], [value_info("y", I64, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 26)])
    with pytest.raises((UnsupportedError, CompileError)):
        compiler.compile(m)


@pytest.mark.parametrize("shape,shift", [((4, 33), 0.3), ((2, 3, 40), -0.5), ((7,), 0.0),
                                         ((3, 16), 5.0)])
def test_dynamic_quantize_linear(shape, shift):
    # rank >= 2: max / min per row, then over the rows (rank 1 keeps TVM's converter);
    # all-positive inputs: the range is clamped to include 0
    x = (RNG.standard_normal(shape) + shift).astype(np.float32)
    check("DynamicQuantizeLinear", {"x": x}, n_out=3, opset=11)


def test_dynamic_quantize_linear_reductions_are_not_on_the_fallback():
    from onnx import helper as h

    g = h.make_graph([h.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                     [h.make_tensor_value_info("q", TensorProto.UINT8, [64, 256]),
                      h.make_tensor_value_info("s", TensorProto.FLOAT, []),
                      h.make_tensor_value_info("z", TensorProto.UINT8, [])])
    cm = compiler.compile(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    assert "fallback" not in cm.report["schedules"], cm.report["schedules"]


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_matmul_per_column_constant_b(dt):
    """QLinearMatMul with b's scale and zero point per column (onnxruntime's graph optimizer
    output of a per-channel QDQ MatMul) against onnxruntime: within one output step, and
    on the integer matmul kernel."""
    import onnxruntime as ort
    from onnx import numpy_helper

    info = np.iinfo(dt)
    k, n = 48, 40
    a = RNG.integers(info.min, info.max, (2, 5, k)).astype(dt)
    consts = {"as": np.array(0.02, np.float32), "az": np.array(3, dt),
              "b": RNG.integers(-127, 127, (k, n)).astype(np.int8),
              "bs": (RNG.random(n) * 0.01 + 0.002).astype(np.float32),
              "bz": np.zeros(n, np.int8), "ys": np.array(0.3, np.float32),
              "yz": np.array(5, dt)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    g = helper.make_graph([node], "g", [value_info("a", TensorProto.UINT8 if dt == np.uint8
                                                   else TensorProto.INT8, [2, 5, k])],
                          [value_info("y", TensorProto.UINT8 if dt == np.uint8
                                      else TensorProto.INT8, [2, 5, n])],
                          [numpy_helper.from_array(v, name) for name, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    cm = compiler.compile(model)
    got = cm.session().run(None, {"a": a})[0]
    assert np.abs(got.astype(np.int32) - want).max() <= 1
    assert (got == want).mean() > 0.95
    assert any(k["rule"] == "cpu.matmul_int8" for k in cm.report["kernel_table"])
