"""Load and validate an ONNX model before anything is converted.

Reads the file, runs ``onnx.checker`` and shape inference, and checks the opsets, so that
a broken model fails here with a message naming the file, the node or the tensor, rather
than deep inside TVM.
"""

from __future__ import annotations

import os

import onnx
from onnx import TensorProto, shape_inference

from .errors import ModelError, UnsupportedError

# The default ONNX domain's opsets this importer handles: TVM 0.27's converters pick the
# newest implementation <= the model's opset; ops re-versioned after that mostly added
# element types, which the dtype check below refuses where the runtime cannot hold them.
MIN_OPSET, MAX_OPSET = 7, onnx.defs.onnx_opset_version()

# Element types the runtime holds (numpy dtypes through DLPack).
SUPPORTED_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
                   TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                   TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
                   TensorProto.UINT64, TensorProto.BOOL}


def load_model(model) -> onnx.ModelProto:
    """Return a checked, shape-inferred copy of ``model`` (a path or a ModelProto)."""
    where = "model"
    if isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        model = _read(where)
    elif not isinstance(model, onnx.ModelProto):
        raise ModelError(f"expected a path or onnx.ModelProto, got {type(model).__name__}")
    if len(model.graph.node) == 0:
        raise ModelError(f"{where}: the graph has no nodes")
    _check_opsets(model, where)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{where}: invalid ONNX model: {_first_line(e)}") from None
    try:
        inferred = shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                data_prop=True)
    except Exception as e:  # onnx raises InferenceError/ValidationError/RuntimeError
        raise ModelError(f"{where}: shape inference failed: {_first_line(e)}") from None
    _check_inputs(inferred, where)
    _check_types(inferred, where)
    return inferred


def _read(path: str) -> onnx.ModelProto:
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelError(f"{path}: is a directory, not an ONNX model")
    try:
        return onnx.load(path)
    except Exception as e:  # protobuf DecodeError, or a missing external-data file
        raise ModelError(f"{path}: not a readable ONNX model ({_first_line(e)}); "
                         "is the file complete?") from None


def _check_opsets(model: onnx.ModelProto, where: str) -> None:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and not MIN_OPSET <= op.version <= MAX_OPSET:
            raise UnsupportedError(
                f"{where}: default-domain opset {op.version} is outside the supported range "
                f"{MIN_OPSET}..{MAX_OPSET}; convert the model with "
                "onnx.version_converter.convert_version(model, 17)")


def _check_inputs(model: onnx.ModelProto, where: str) -> None:
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type
        if not t.HasField("tensor_type"):
            raise UnsupportedError(f"{where}: input {vi.name!r} is not a tensor "
                                   f"({t.WhichOneof('value')}); only tensor inputs are supported")
        for d in t.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                raise ModelError(f"{where}: input {vi.name!r} has a negative dimension "
                                 f"{d.dim_value}")


def _check_types(model: onnx.ModelProto, where: str) -> None:
    """Refuse element types the runtime cannot hold (bfloat16, float8, int4, string...)."""
    def check(kind, name, elem_type):
        if elem_type and elem_type not in SUPPORTED_TYPES:
            tname = TensorProto.DataType.Name(elem_type).lower()
            raise UnsupportedError(f"{where}: {kind} {name!r} has element type {tname}, which "
                                   "onnxc does not support (float, double, float16, bool and "
                                   "integer types are)")

    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            check("graph input/output", vi.name, vi.type.tensor_type.elem_type)
    for t in model.graph.initializer:
        check("initializer", t.name, t.data_type)
    for vi in model.graph.value_info:
        if vi.type.HasField("tensor_type"):
            check("tensor", vi.name, vi.type.tensor_type.elem_type)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
