"""onnxc's converters in compiler/converters_misc.py (Celu, Elu, Swish, SwiGLU,
LpNormalization, CenterCropPad, ReverseSequence, TensorScatter, Det, Col2Im) against
onnx.reference on small random models."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import CompileError, UnsupportedError
from tests.compiler.onnx_check import check, run_onnxc

RNG = np.random.default_rng(0)


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_celu(alpha):
    check("Celu", {"x": _f(3, 4)}, opset=12, alpha=alpha)


def test_celu_and_elu_float16():
    check("Celu", {"x": _f(8, dtype=np.float16)}, opset=28, rtol=2e-3, atol=1e-3, alpha=2.0)
    check("Elu", {"x": _f(8, dtype=np.float16)}, opset=28, rtol=2e-3, atol=1e-3, alpha=0.7)


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_swish_and_swiglu(alpha):
    check("Swish", {"x": _f(2, 5)}, opset=24, alpha=alpha)
    check("SwiGLU", {"a": _f(2, 5), "b": _f(2, 5)}, opset=28, alpha=alpha)


@pytest.mark.parametrize("p,axis", [(1, 0), (2, -1), (2, 1)])
def test_lp_normalization(p, axis):
    x = np.abs(_f(2, 3, 4)) + 0.1
    x[0, 0, :] = 0  # a zero norm along the last axis gives zeros
    check("LpNormalization", {"x": x}, opset=22, p=p, axis=axis)


def test_lp_normalization_refuses_p3():
    with pytest.raises(UnsupportedError, match="p=3"):
        run_onnxc("LpNormalization", {"x": _f(2, 3)}, opset=22, out_shape=[2, 3], p=3)


@pytest.mark.parametrize("shape,target,axes", [
    ((9, 6, 3), [4, 10, 3], None),          # crop (odd difference) and pad (even)
    ((5, 8, 2), [7, 5], [0, 1]),             # pad odd, crop odd
    ((2, 7, 8), [3, 8], [-2, -1]),           # negative axes
])
def test_center_crop_pad(shape, target, axes):
    attrs = {} if axes is None else {"axes": axes}
    check("CenterCropPad", {"x": _f(*shape), "shape": np.array(target, np.int64)},
          consts=("shape",), opset=18, **attrs)


def test_center_crop_pad_shape_as_graph_input_is_bound_when_run():
    # the shape arrives as a small integer graph input: specialised on its value
    check("CenterCropPad", {"x": _f(6, 5), "shape": np.array([3, 8], np.int64)}, opset=18)


@pytest.mark.parametrize("batch_axis,time_axis,lens", [(1, 0, [4, 3, 1, 5]),
                                                      (0, 1, [0, 2, 5, 1])])
def test_reverse_sequence(batch_axis, time_axis, lens):
    x = _f(5, 4, 2) if time_axis == 0 else _f(4, 5, 2)
    check("ReverseSequence", {"x": x, "lens": np.array(lens, np.int64)}, opset=10,
          batch_axis=batch_axis, time_axis=time_axis)


@pytest.mark.parametrize("mode,idx,upd", [("linear", [0, 2], 2), ("circular", [3, 1], 3)])
def test_tensor_scatter(mode, idx, upd):
    check("TensorScatter", {"past": _f(2, 3, 5, 4), "update": _f(2, 3, upd, 4),
                            "w": np.array(idx, np.int64)}, opset=24, mode=mode)


def test_tensor_scatter_axis_and_no_indices():
    check("TensorScatter", {"past": _f(2, 6, 3), "update": _f(2, 2, 3)}, opset=24, axis=1)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_det(n):
    check("Det", {"x": _f(3, n, n)}, opset=22, rtol=1e-4, atol=1e-4)


def test_det_refuses_large_matrices():
    with pytest.raises(UnsupportedError, match="size 7"):
        run_onnxc("Det", {"x": _f(7, 7)}, opset=22)


@pytest.mark.parametrize("image,block,attrs", [
    ([5, 5], [2, 3], {}),
    ([6, 7], [3, 2], {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
    ([3, 4, 5], [1, 2, 2], {}),
])
def test_col2im(image, block, attrs):
    nd = len(image)
    strides = attrs.get("strides", [1] * nd)
    dil = attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * 2 * nd)
    blocks = [(image[i] + pads[i] + pads[i + nd] - dil[i] * (block[i] - 1) - 1) // strides[i]
              + 1 for i in range(nd)]
    x = _f(2, 2 * int(np.prod(block)), int(np.prod(blocks)))
    check("Col2Im", {"x": x, "image": np.array(image, np.int64),
                     "block": np.array(block, np.int64)}, consts=("image", "block"),
          opset=18, **attrs)


def test_col2im_refuses_a_wrong_block_count():
    with pytest.raises(CompileError, match="blocks"):
        run_onnxc("Col2Im", {"x": _f(1, 4, 7), "image": np.array([4, 4], np.int64),
                             "block": np.array([2, 2], np.int64)}, consts=("image", "block"),
                  opset=18, out_shape=[1, 1, 4, 4])
