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
