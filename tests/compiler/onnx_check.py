"""Test helper: build a one-node ONNX model, run it through onnxc and compare every output
with ``onnx.reference.ReferenceEvaluator`` (used by the converter tests)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import compiler


def _vi(name, arr_or_dtype, shape):
    dtype = np.dtype(arr_or_dtype)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), shape)


def check(op, inputs: dict, *, consts=(), n_out: int = 1, opset: int = 22,
          domain: str = "", extra_opsets: dict | None = None, rtol: float = 1e-4,
          atol: float = 1e-5, **attrs):
    """Compare onnxc with the reference on a one-node model.

    ``inputs``: the node's inputs in order (name -> array; a name starting with '-' for an
    omitted optional input); ``consts``: the names among them given as initializers, the
    others are graph inputs.  Returns onnxc's outputs.
    """
    names = ["" if n.startswith("-") else n for n in inputs]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    vis = [_vi(n, a.dtype, list(np.shape(a))) for n, a in inputs.items()
           if n and not n.startswith("-") and n not in consts]
    inits = [numpy_helper.from_array(np.asarray(inputs[n]), n) for n in consts]
    opsets = [helper.make_opsetid("", opset)]
    for d, v in (extra_opsets or {}).items():
        opsets.append(helper.make_opsetid(d, v))
    g = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info(o)
                                             for o in outs], inits)
    model = helper.make_model(g, opset_imports=opsets)
    feeds = {n: a for n, a in inputs.items() if not n.startswith("-") and n not in consts}
    want = [np.asarray(w) for w in ReferenceEvaluator(model).run(None, feeds)]
    del model.graph.output[:]
    model.graph.output.extend(_vi(o, w.dtype, list(w.shape)) for o, w in zip(outs, want))
    got = compiler.compile(model).session().run(None, feeds)
    for g_, w in zip(got, want):
        assert g_.shape == w.shape and g_.dtype == w.dtype, (g_.shape, g_.dtype, w.shape,
                                                             w.dtype)
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g_, w)
        else:
            np.testing.assert_allclose(g_, w, rtol=rtol, atol=atol)
    return got


def run_onnxc(op, inputs: dict, *, consts=(), opset: int = 22, domain: str = "",
              domain_opset: int = 1, out_dtype=np.float32, out_shape=(), **attrs):
    """Compile and run a one-node model through onnxc only (for cases the reference
    rejects, and for refusals)."""
    names = ["" if n.startswith("-") else n for n in inputs]
    node = helper.make_node(op, names, ["y0"], domain=domain, **attrs)
    vis = [_vi(n, a.dtype, list(np.shape(a))) for n, a in inputs.items()
           if n and not n.startswith("-") and n not in consts]
    inits = [numpy_helper.from_array(np.asarray(inputs[n]), n) for n in consts]
    g = helper.make_graph([node], "g", vis, [_vi("y0", out_dtype, list(out_shape))], inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, domain_opset)]
                                                 if domain else [])
    model = helper.make_model(g, opset_imports=opsets)
    feeds = {n: a for n, a in inputs.items() if not n.startswith("-") and n not in consts}
    return compiler.compile(model).session().run(None, feeds)
