"""ONNX 1.0-1.4's experimental ops (compiler/frontend/converters/experimental.py) against
onnxruntime, which still runs them at opsets 1-9 (onnx.reference has none of them)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import compiler
from compiler.errors import UnsupportedError
from tests.compiler.frontend.converters.reference import F, RNG, onnx_model, value_info

_CASES = {
    # Tiny YOLOv2 (Model Zoo, opset 8) starts with ImageScaler
    "ImageScaler": (dict(scale=1 / 255, bias=[-0.5, 0.25, 1.0]), [1, 3, 5, 6], [1, 3, 5, 6]),
    "Crop": (dict(border=[1, 2, 0, 1]), [1, 2, 6, 7], [1, 2, 3, 6]),
    "Crop_with_scale": (dict(border=[1, 2, 3, 1], scale=[2, 3]), [1, 2, 6, 7], [1, 2, 2, 3]),
    "Affine": (dict(alpha=2.0, beta=0.5), [2, 3], [2, 3]),
    "Scale": (dict(scale=3.0), [2, 3], [2, 3]),
    "ScaledTanh": (dict(alpha=2.0, beta=0.5), [2, 3], [2, 3]),
    # beta * x up to ~100: exp(beta * x) alone would overflow
    "ParametricSoftplus": (dict(alpha=2.0, beta=30.0), [2, 3], [2, 3]),
}


def _model(op, attrs, shape, out_shape, opset=8):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    return onnx_model(node, [value_info("x", F, shape)], [value_info("y", F, out_shape)], opset)


@pytest.mark.parametrize("case", sorted(_CASES))
def test_experimental_op_matches_onnxruntime(case):
    # onnxc refused these ("no converter is registered"); onnxruntime runs them
    from tests.conftest import assert_close, ort_run

    attrs, shape, out_shape = _CASES[case]
    model = _model(case.split("_")[0], attrs, shape, out_shape)
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    assert_close(compiler.compile(model).session().run(None, {"x": x}), ort_run(model, {"x": x}))


def test_experimental_ops_refuse_what_onnxruntime_refuses():
    # ScaledTanh without alpha/beta, ImageScaler on a rank-3 input, and any of them at
    # opset 10, where onnxruntime no longer registers them
    for op, attrs, shape, opset, match in (
            ("ScaledTanh", {}, [2, 3], 8, "without its 'alpha' attribute"),
            ("ImageScaler", dict(bias=[1.0, 2.0]), [1, 2, 5], 8, "NCHW, one per channel"),
            ("ImageScaler", dict(bias=[1.0, 2.0]), [1, 2, 5, 5], 10, "ImageScaler")):
        with pytest.raises(UnsupportedError, match=match):
            compiler.compile(_model(op, attrs, shape, shape, opset))
