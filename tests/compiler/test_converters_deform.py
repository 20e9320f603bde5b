"""onnxc's DeformConv converter (compiler/converters_deform.py) against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import UnsupportedError
from tests.compiler.onnx_check import check, run_onnxc

RNG = np.random.default_rng(0)


def _f(*shape, scale=1.0, dtype=np.float32):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def _out(size, k, pad, stride, dilation):
    return (size + 2 * pad - ((k - 1) * dilation + 1)) // stride + 1


@pytest.mark.parametrize("group,offset_group,pad,stride,dilation", [
    (1, 1, 0, 1, 1),
    (2, 1, 1, 1, 1),
    (1, 2, 1, 2, 1),
    (2, 2, 0, 1, 2),
])
def test_deform_conv(group, offset_group, pad, stride, dilation):
    n, c, h, w, oc, k = 2, 4, 5, 6, 4, 3
    oh, ow = _out(h, k, pad, stride, dilation), _out(w, k, pad, stride, dilation)
    # offsets of up to a few pixels: taps fall between pixels and outside the image
    inputs = {"x": _f(n, c, h, w), "w": _f(oc, c // group, k, k),
              "offset": _f(n, offset_group * k * k * 2, oh, ow, scale=1.5)}
    check("DeformConv", inputs, opset=19, rtol=1e-4, atol=1e-5, kernel_shape=[k, k],
          group=group, offset_group=offset_group, pads=[pad] * 4, strides=[stride] * 2,
          dilations=[dilation] * 2)


def test_deform_conv_mask_bias_rectangular_kernel():
    n, c, h, w, oc, kh, kw, og = 1, 2, 4, 5, 3, 2, 3, 2
    oh, ow = h - kh + 1 + 1, w - kw + 1   # pads top/bottom 1 and 0 (asymmetric)
    inputs = {"x": _f(n, c, h, w), "w": _f(oc, c, kh, kw),
              "offset": _f(n, og * kh * kw * 2, oh, ow),
              "b": _f(oc), "mask": RNG.uniform(0, 1, (n, og * kh * kw, oh, ow)).astype(
                  np.float32)}
    check("DeformConv", inputs, opset=19, offset_group=og, pads=[1, 0, 0, 0])


def test_deform_conv_zero_offsets_is_conv():
    """With zero offsets and no mask, DeformConv is a plain convolution: integer inputs
    make the comparison exact."""
    x = RNG.integers(-3, 4, (1, 2, 4, 4)).astype(np.float32)
    w = RNG.integers(-2, 3, (3, 2, 2, 2)).astype(np.float32)
    (got,) = check("DeformConv", {"x": x, "w": w, "offset": np.zeros((1, 8, 3, 3), np.float32)},
                   opset=19)
    want = np.zeros((1, 3, 3, 3), np.float32)
    for i in range(3):
        for j in range(3):
            want[0, :, i, j] = np.tensordot(w, x[0, :, i:i + 2, j:j + 2], axes=3)
    np.testing.assert_array_equal(got, want)


def test_deform_conv_double():
    inputs = {"x": _f(1, 1, 3, 4, dtype=np.float64), "w": _f(2, 1, 2, 2, dtype=np.float64),
              "offset": _f(1, 8, 2, 3, dtype=np.float64)}
    check("DeformConv", inputs, opset=19, rtol=1e-6)


def test_deform_conv_float16_near_exact():
    """float16: compared with the reference evaluated in float64 on the same values (the
    float16 reference rounds each step; see the converter's docstring)."""
    inputs = {"x": _f(1, 2, 5, 5, dtype=np.float16), "w": _f(2, 2, 3, 3, dtype=np.float16),
              "offset": _f(1, 18, 3, 3, dtype=np.float16)}
    (exact,) = check("DeformConv", {k: v.astype(np.float64) for k, v in inputs.items()},
                     opset=19, rtol=1e-6)
    (got,) = run_onnxc("DeformConv", inputs, opset=19, out_dtype=np.float16,
                       out_shape=(1, 2, 3, 3))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2e-3, atol=2e-3)


def test_deform_conv_refuses_1d():
    inputs = {"x": _f(1, 2, 5), "w": _f(2, 2, 3), "offset": _f(1, 6, 3)}
    with pytest.raises(UnsupportedError, match="only 2-D"):
        run_onnxc("DeformConv", inputs, opset=19, out_shape=(1, 2, 3))


def test_deform_conv_refuses_inconsistent_offset():
    inputs = {"x": _f(1, 1, 4, 4), "w": _f(1, 1, 2, 2), "offset": _f(1, 8, 2, 2)}
    with pytest.raises(UnsupportedError, match="offset of shape"):
        run_onnxc("DeformConv", inputs, opset=19, out_shape=(1, 1, 3, 3))
