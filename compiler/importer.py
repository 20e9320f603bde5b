"""ONNX -> Relax: the one import function of onnxc.

TVM 0.27's ONNX frontend converts the nodes for now; what it cannot convert is found
before conversion starts and reported in one error naming every such node.
"""

from __future__ import annotations

import warnings

import onnx
from onnx import helper

from .errors import CompileError, UnsupportedError


def graph_inputs(model: onnx.ModelProto) -> list:
    """The graph inputs that are not initializers (what the user feeds)."""
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def input_signature(model: onnx.ModelProto, where: str = "model") -> list[dict]:
    """[{name, shape, dtype}] of the user-fed inputs; refuses symbolic dimensions."""
    sig = []
    for vi in graph_inputs(model):
        tt = vi.type.tensor_type
        dims = []
        for i, d in enumerate(tt.shape.dim):
            if not d.HasField("dim_value"):
                name = d.dim_param or "?"
                raise UnsupportedError(
                    f"{where}: input {vi.name!r} has a symbolic dimension {name!r} at axis {i}; "
                    "this build compiles static shapes only: fix the dimension, e.g. with "
                    "onnx.tools.update_model_dims.update_inputs_outputs_dims")
            dims.append(d.dim_value)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        sig.append({"name": vi.name, "shape": dims, "dtype": dtype})
    return sig


def unsupported_nodes(model: onnx.ModelProto) -> list:
    """Nodes no converter handles, as (node name, op, domain)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = set(_get_convert_map()) | {"Constant", "If"}
    bad = []
    for i, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in known:
            bad.append((node.name or f"#{i}", node.op_type, node.domain or "ai.onnx"))
    return bad


def import_onnx(model: onnx.ModelProto, where: str = "model"):
    """Convert a validated model to a Relax IRModule whose ``main`` takes the graph inputs
    (in the model's order) and returns the graph outputs (a tuple when there are several)."""
    from tvm.relax.frontend.onnx import from_onnx

    bad = unsupported_nodes(model)
    if bad:
        lines = "\n".join(f"  node {n!r}: {op} (domain {d})" for n, op, d in bad)
        raise UnsupportedError(f"{where}: {len(bad)} node(s) use operators onnxc does not "
                               f"support:\n{lines}\nrun `onnxc ops` for the supported list")
    sig = input_signature(model, where)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return from_onnx(model, shape_dict={s["name"]: s["shape"] for s in sig},
                             dtype_dict={s["name"]: s["dtype"] for s in sig}, opset=opset,
                             keep_params_in_input=False)
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(f"{where}: import to Relax failed: "
                           f"{msg[-1] if msg else type(e).__name__}") from e
