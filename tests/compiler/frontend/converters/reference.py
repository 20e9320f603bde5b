"""Helpers of the converter tests: small one-node ONNX models checked against
onnx.reference.ReferenceEvaluator."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper, TensorProto
from onnx.reference import ReferenceEvaluator

import compiler


F, F16, I32, I64, B = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32,
                       TensorProto.INT64, TensorProto.BOOL)
RTOL, ATOL = 1e-4, 1e-5
RNG = np.random.default_rng(0)


def randn(*shape, scale=1.0, dtype=np.float32):
    """Standard-normal values of ``shape`` (times ``scale``) from the shared ``RNG``."""
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def onnx_model(node, inputs, outputs, opset, inits=()):
    g = helper.make_graph([node], "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def value_info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def untyped_output(name):
    """An output typed later from the reference's result (see ``typed``)."""
    return helper.make_empty_tensor_value_info(name)


def initializer(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def typed(model, feeds):
    """``model`` with its untyped outputs typed as the reference computes them, and the
    reference's outputs."""
    want = [np.asarray(w) for w in ReferenceEvaluator(model).run(None, feeds)]
    for vi, w in zip(model.graph.output, want):
        if not vi.type.HasField("tensor_type"):
            vi.CopyFrom(helper.make_tensor_value_info(
                vi.name, helper.np_dtype_to_tensor_dtype(w.dtype), list(w.shape)))
    return model, want


def check_against_reference(model, feeds, rtol=RTOL, atol=ATOL):
    model, want = typed(model, feeds)
    got = compiler.compile(model).session().run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got
