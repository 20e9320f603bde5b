"""onnxc's FlexAttention converter (compiler/frontend/converters/contrib.py, ai.onnx.preview)
against onnx.reference, with score_mod / prob_mod subgraphs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from compiler.errors import UnsupportedError
from tests.compiler.onnx_check import check, run_onnxc

RNG = np.random.default_rng(0)
PREVIEW = {"domain": "ai.onnx.preview", "extra_opsets": {"ai.onnx.preview": 1}, "opset": 26}


def _qkv(b=1, hq=2, hkv=2, length=4, s=5, e=8, ev=8, dtype=np.float32):
    return {"q": RNG.standard_normal((b, hq, length, e)).astype(dtype),
            "k": RNG.standard_normal((b, hkv, s, e)).astype(dtype),
            "v": RNG.standard_normal((b, hkv, s, ev)).astype(dtype)}


def _graph(name, nodes, inits=(), dtype=TensorProto.FLOAT, out="y"):
    """A modifier subgraph: input ``x`` (B, H, L, S), output ``out``."""
    dims = ["B", "H", "L", "S"]
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", dtype, dims)],
                             [helper.make_tensor_value_info(out, dtype, None)], list(inits))


def _causal(dtype=TensorProto.FLOAT):
    """score_mod: where(q_idx >= k_idx, x, -inf), the indices from Shape/Range of x."""
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i2"], ["l"], axis=0),
             helper.make_node("Gather", ["sh", "i3"], ["s"], axis=0),
             helper.make_node("Range", ["zero", "l", "one"], ["qr"]),
             helper.make_node("Reshape", ["qr", "qs"], ["qi"]),
             helper.make_node("Range", ["zero", "s", "one"], ["kr"]),
             helper.make_node("Reshape", ["kr", "ks"], ["ki"]),
             helper.make_node("GreaterOrEqual", ["qi", "ki"], ["m"]),
             helper.make_node("Where", ["m", "x", "ninf"], ["y"])]
    inits = [helper.make_tensor("zero", i64, [], [0]), helper.make_tensor("one", i64, [], [1]),
             helper.make_tensor("i2", i64, [], [2]), helper.make_tensor("i3", i64, [], [3]),
             helper.make_tensor("qs", i64, [4], [1, 1, -1, 1]),
             helper.make_tensor("ks", i64, [4], [1, 1, 1, -1]),
             helper.make_tensor("ninf", dtype, [], [float("-inf")])]
    return _graph("causal", nodes, inits, dtype)


def _soft_cap(cap=2.0):
    nodes = [helper.make_node("Div", ["x", "cap"], ["t"]), helper.make_node("Tanh", ["t"], ["u"]),
             helper.make_node("Mul", ["u", "cap"], ["y"])]
    return _graph("soft_cap", nodes, [helper.make_tensor("cap", TensorProto.FLOAT, [], [cap])])


def _scale_probs(value=0.5):
    return _graph("scale", [helper.make_node("Mul", ["x", "c"], ["y"])],
                  [helper.make_tensor("c", TensorProto.FLOAT, [], [value])])


def test_flexattention_default_scale():
    check("FlexAttention", _qkv(b=2), **PREVIEW)


def test_flexattention_gqa_scale_and_head_sizes():
    check("FlexAttention", _qkv(hq=6, hkv=2, e=4, ev=6), scale=0.3, **PREVIEW)


def test_flexattention_double():
    check("FlexAttention", _qkv(dtype=np.float64), rtol=1e-10, atol=1e-12, **PREVIEW)


@pytest.mark.parametrize("precision", [None, TensorProto.FLOAT])
def test_flexattention_fp16(precision):
    extra = {} if precision is None else {"softmax_precision": precision}
    check("FlexAttention", _qkv(dtype=np.float16), rtol=1e-3, atol=1e-3, **extra, **PREVIEW)


def test_flexattention_float_inputs_double_softmax():
    check("FlexAttention", _qkv(), softmax_precision=TensorProto.DOUBLE, **PREVIEW)


def test_flexattention_causal_score_mod():
    (got,) = check("FlexAttention", _qkv(length=4, s=4), score_mod=_causal(), **PREVIEW)
    assert np.isfinite(got).all()


def test_flexattention_soft_cap_and_prob_mod():
    check("FlexAttention", _qkv(), score_mod=_soft_cap(), prob_mod=_scale_probs(), **PREVIEW)


def test_flexattention_identity_modifier():
    ident = helper.make_graph([], "ident",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)])
    check("FlexAttention", _qkv(), prob_mod=ident, **PREVIEW)


def test_flexattention_refuses_fp16_softmax():
    with pytest.raises(UnsupportedError, match="softmax_precision=10"):
        run_onnxc("FlexAttention", _qkv(dtype=np.float16), opset=26, domain="ai.onnx.preview",
                  softmax_precision=TensorProto.FLOAT16, out_dtype=np.float16,
                  out_shape=(1, 2, 4, 8))


def test_flexattention_refuses_shape_changing_modifier():
    reduce = _graph("reduce", [helper.make_node("ReduceMax", ["x", "ax"], ["y"], keepdims=1)],
                    [helper.make_tensor("ax", TensorProto.INT64, [1], [3])])
    with pytest.raises(UnsupportedError, match="score_mod output of shape"):
        run_onnxc("FlexAttention", _qkv(), opset=26, domain="ai.onnx.preview",
                  score_mod=reduce, out_shape=(1, 2, 4, 8))
