"""Small ONNX models and pass drivers shared by the fusion and numerics pass tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.frontend.importer import import_onnx
from compiler.frontend.loader import load_model
from passes import FoldConstants, PassContext
from passes.relax_util import op_counts

FLOAT = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def model(nodes, inputs: dict, outputs: dict, inits: dict | None = None, dtype=np.float32,
          opset: int = 17):
    """A model from ``nodes`` (helper.make_node), ``{name: shape}`` inputs and outputs and
    ``{name: array}`` initializers; tensors of ``dtype``."""
    et = FLOAT[dtype]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, et, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, et, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def node(op, inputs, output, **attrs):
    """A node named after its output tensor."""
    return helper.make_node(op, list(inputs), [output], name=output, **attrs)


def run_pass(p, onnx_model, symbolic: bool = False):
    """Import ``onnx_model`` (``symbolic``: its dim_params as symbolic dims), fold
    constants, run pass ``p``: (ops before, ops after, report)."""
    names = [n.name for n in onnx_model.graph.node]
    mod = PassContext(node_names=names).run(
        [FoldConstants()], import_onnx(load_model(onnx_model), symbolic=symbolic))
    ctx = PassContext(required=[p.name], node_names=names)   # opt-in passes run too
    after = ctx.run([p], mod)
    return op_counts(mod), op_counts(after), ctx.reports[-1]


def report(cm, name: str) -> dict:
    return next(p for p in cm.report["passes"] if p["name"] == name)


def compile_run(onnx_model, feeds: dict, **kw):
    """Compile (keywords as compiler.compile) and run once: (outputs, compiled model)."""
    cm = compiler.compile(onnx_model, **kw)
    return cm.session().run(None, feeds), cm


def symbolic_rows_run(onnx_model, pass_name: str, rule: str, shapes, seed: int = 0):
    """Mark the model's first input and output dims 0 and 1 symbolic (``batch``,
    ``seq``: a transformer exported with dynamic axes), compile once, check that pass
    ``pass_name`` applied ``rule`` once, and compare with onnxruntime at each of
    ``shapes``."""
    from tests.conftest import assert_close, ort_run

    for vi in (onnx_model.graph.input[0], onnx_model.graph.output[0]):
        dims = vi.type.tensor_type.shape.dim
        dims[0].dim_param, dims[1].dim_param = "batch", "seq"
    cm = compiler.compile(onnx_model, dims={"batch": (1, 4, 1), "seq": (1, 64, 5)})
    assert report(cm, pass_name)["rewrites"] == {rule: 1}, report(cm, pass_name)
    sess = cm.session()
    rng = np.random.default_rng(seed)
    for shape in shapes:
        feeds = {"x": (3 + 2 * rng.standard_normal(shape)).astype(np.float32)}
        assert_close(sess.run(None, feeds), ort_run(onnx_model, feeds))
