"""Load and validate an ONNX model before anything is converted.

Reads the file, runs ``onnx.checker`` and shape inference, and checks the opsets, so that
a broken model fails here with a message naming the file, the node or the tensor, rather
than deep inside TVM.
"""

from __future__ import annotations

import os

import onnx
from onnx import TensorProto, shape_inference

from ..errors import ModelError, UnsupportedError
from .narrow_types import FORMATS as NARROW_FORMATS

# The default ONNX domain's opsets this importer handles: TVM 0.27's converters pick the
# newest implementation <= the model's opset; ops re-versioned after that mostly added
# element types, which the dtype check below refuses where the runtime cannot hold them.
MIN_OPSET, MAX_OPSET = 7, onnx.defs.onnx_opset_version()

# Element types the runtime holds (numpy dtypes through DLPack); the narrow ones (bfloat16,
# float8, float4, int4/int2) as their bit codes in uint8 / uint16 (compiler/frontend/narrow_types.py).
SUPPORTED_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
                   TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                   TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
                   TensorProto.UINT64, TensorProto.BOOL, *NARROW_FORMATS}


def load_model(model) -> onnx.ModelProto:
    """Return a checked, shape-inferred copy of ``model`` (a path or a ModelProto)."""
    where = "model"
    if isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        model = read_model(where)
    elif not isinstance(model, onnx.ModelProto):
        raise ModelError(f"expected a path or onnx.ModelProto, got {type(model).__name__}")
    _check_strings(model, where)
    if len(model.graph.node) == 0:
        raise ModelError(f"{where}: the graph has no nodes")
    _check_opsets(model, where)
    for vi in model.graph.input:  # before shape inference: onnx's data propagation runs
        _check_size(vi, where)     # for ever on a 2^62-element input feeding Range (fuzzer)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{where}: invalid ONNX model: {_first_line(e)}") from None
    except UnicodeDecodeError:  # the checker's message quotes a corrupted (non-UTF-8) name
        raise ModelError(f"{where}: invalid ONNX model: a name in it is not valid UTF-8; "
                         "the file is corrupted") from None
    try:
        inferred = _infer_shapes(model)
    except Exception as e:  # onnx raises InferenceError/ValidationError/RuntimeError
        raise ModelError(f"{where}: shape inference failed: {_first_line(e)}") from None
    _check_inputs(inferred, where)
    _check_types(inferred, where)
    _check_attributes(inferred.graph, where)
    _check_tensors(inferred, where)
    return inferred


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Strict shape inference; if it fails, once more with the schema's default values
    written into the nodes of function ops: onnx infers a function body whose Constant
    reads an omitted attribute (``MeanVarianceNormalization``'s ``axes``) as having no
    value at all, and fails."""
    def infer(m):
        return shape_inference.infer_shapes(m, check_type=True, strict_mode=True,
                                            data_prop=True)

    model = _with_stft_onesided(model)
    try:
        return infer(model)
    except Exception:
        filled = onnx.ModelProto()
        filled.CopyFrom(model)
        if not _fill_function_defaults(filled):
            raise
        return infer(filled)


def _with_stft_onesided(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy whose STFT nodes that omit ``onesided`` state the schema's
    default (1): onnx's STFT shape inference reads an omitted ``onesided`` as 0, and with
    constant frame_step/frame_length infers a two-sided output shape that contradicts the
    declared one-sided output (onnx 1.23)."""
    def missing(graph):
        for node in graph.node:
            if node.op_type == "STFT" and node.domain in ("", "ai.onnx") and \
                    not any(a.name == "onesided" for a in node.attribute):
                yield node
            for a in node.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from missing(g)

    if next(missing(model.graph), None) is None:
        return model
    filled = onnx.ModelProto()
    filled.CopyFrom(model)
    for node in list(missing(filled.graph)):
        node.attribute.append(onnx.helper.make_attribute("onesided", 1))
    return filled


def _fill_function_defaults(model: onnx.ModelProto) -> bool:
    """Write default attribute values into default-domain nodes of ops defined by a
    function body; whether any node changed."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                 MAX_OPSET)
    changed = False
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
        except onnx.defs.SchemaError:
            continue
        if not (schema.has_function or schema.has_context_dependent_function):
            continue
        present = {a.name for a in node.attribute}
        for name, attr in schema.attributes.items():
            default = attr.default_value
            if name not in present and default is not None and default.type:
                a = node.attribute.add()
                a.CopyFrom(default)
                a.name = name
                changed = True
    return changed


def read_model(path: str) -> onnx.ModelProto:
    """Parse the ONNX file at ``path`` (no checks), or raise ``ModelError`` saying why not."""
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
        if op.domain in ("", "ai.onnx") and op.version < MIN_OPSET and \
                not _changed_since(model, op.version):
            continue  # every op of the graph reads the same at this opset as at MIN_OPSET
        if op.domain in ("", "ai.onnx") and not MIN_OPSET <= op.version <= MAX_OPSET:
            raise UnsupportedError(
                f"{where}: default-domain opset {op.version} is outside the supported range "
                f"{MIN_OPSET}..{MAX_OPSET}; convert the model with "
                "onnx.version_converter.convert_version(model, 17)"
                + (f" (node(s) defined differently before opset {MIN_OPSET}: "
                   f"{', '.join(_changed_since(model, op.version))})"
                   if op.version < MIN_OPSET else ""))


def _changed_since(model: onnx.ModelProto, opset: int) -> list[str]:
    """Default-domain op types of the graph whose definition at ``opset`` is not the one at
    MIN_OPSET (a new version in between, or none yet): the range check is per operator,
    so that a model of an older opset whose ops all kept their definition (``Not`` is
    unchanged since opset 1) is accepted."""
    changed = []
    for op_type in sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}):
        try:
            old = onnx.defs.get_schema(op_type, opset).since_version
            new = onnx.defs.get_schema(op_type, MIN_OPSET).since_version
        except onnx.defs.SchemaError:
            changed.append(op_type)
            continue
        if old != new:
            changed.append(op_type)
    return changed


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
                                   "onnxc does not support (float, double, float16, bool, "
                                   "integer types, bfloat16, float8, float4 and int4/int2 "
                                   "are)")

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


# -- hardening: what onnx.checker lets through but would fail deep inside TVM or numpy ----
# (the fuzzer, scripts/fuzz_models.py, finds these)

# Largest tensor (elements) we accept anywhere in the graph: past this, shapes overflow
# TVM's index arithmetic and no host could hold the tensor anyway.
MAX_TENSOR_ELEMENTS = 2 ** 40


def _check_strings(model: onnx.ModelProto, where: str) -> None:
    """Every text field must be valid UTF-8 (protobuf decodes lazily; a bit flip in a name
    otherwise surfaces as a UnicodeDecodeError somewhere later)."""
    from google.protobuf.descriptor import FieldDescriptor

    def walk(msg, path):
        if isinstance(msg, TensorProto):  # do not copy the data out: only its text fields
            msg.name, msg.doc_string  # noqa: B018  (decoding is the check)
            for e in msg.external_data:
                e.key, e.value  # noqa: B018
            return
        for field, value in msg.ListFields():
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                items = value if _repeated(field) else [value]
                for i, item in enumerate(items):
                    walk(item, f"{path}.{field.name}[{i}]")
            elif field.type == FieldDescriptor.TYPE_STRING and _repeated(field):
                list(value)  # elements decode when read; a scalar did in ListFields()

    try:
        walk(model, "model")
    except UnicodeDecodeError as e:
        raise ModelError(f"{where}: a name or text field is not valid UTF-8 ({e.reason} at "
                         f"byte {e.start}); the file is corrupted") from None


def _repeated(field) -> bool:
    rep = getattr(field, "is_repeated", None)  # protobuf >= 6; older ones have .label
    return bool(rep) if rep is not None else field.label == field.LABEL_REPEATED


# attribute type -> the field that must be present for a single value
_SCALAR_FIELDS = {onnx.AttributeProto.INT: "i", onnx.AttributeProto.FLOAT: "f",
                  onnx.AttributeProto.STRING: "s", onnx.AttributeProto.TENSOR: "t",
                  onnx.AttributeProto.GRAPH: "g",
                  onnx.AttributeProto.SPARSE_TENSOR: "sparse_tensor",
                  onnx.AttributeProto.TYPE_PROTO: "tp"}


def _check_attributes(graph, where: str) -> None:
    """Each attribute's value must be present and of its declared type (the checker accepts
    ``type: INT`` with no ``i``); recursive into subgraphs."""
    for k, node in enumerate(graph.node):
        name = node.name or f"#{k}"
        for a in node.attribute:
            if a.ref_attr_name:
                continue
            want = _SCALAR_FIELDS.get(a.type)
            if want is not None and not a.HasField(want):
                raise ModelError(f"{where}: node {name!r} ({node.op_type}): attribute "
                                 f"{a.name!r} is declared "
                                 f"{onnx.AttributeProto.AttributeType.Name(a.type)} but has no "
                                 "value; the model is corrupted")
            if a.type == onnx.AttributeProto.TENSOR:
                _check_tensor(a.t, f"node {name!r} ({node.op_type}) attribute {a.name!r}",
                              where)
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _check_attributes(g, where)


# element type -> (typed field holding the values, values per element)
_TYPED_FIELDS = {
    TensorProto.FLOAT: ("float_data", 1), TensorProto.DOUBLE: ("double_data", 1),
    TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
    **{t: ("int32_data", 1) for t in (TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                                      TensorProto.UINT16, TensorProto.UINT8, TensorProto.BOOL,
                                      TensorProto.FLOAT16)},
}
_ITEMSIZE = {TensorProto.FLOAT: 4, TensorProto.DOUBLE: 8, TensorProto.INT64: 8,
             TensorProto.UINT64: 8, TensorProto.UINT32: 4, TensorProto.INT32: 4,
             TensorProto.INT16: 2, TensorProto.UINT16: 2, TensorProto.FLOAT16: 2,
             TensorProto.INT8: 1, TensorProto.UINT8: 1, TensorProto.BOOL: 1}


def _check_tensor(t, what: str, where: str) -> None:
    """A tensor's data must hold exactly prod(dims) elements."""
    if t.data_location == TensorProto.EXTERNAL or t.data_type not in _ITEMSIZE:
        return
    count = 1
    for d in t.dims:
        if d < 0:
            raise ModelError(f"{where}: {what} has a negative dimension {d}")
        count *= d
    if count > MAX_TENSOR_ELEMENTS:
        raise ModelError(f"{where}: {what} declares {count} elements (dims {list(t.dims)}), "
                         f"more than onnxc handles ({MAX_TENSOR_ELEMENTS})")
    if t.HasField("raw_data"):
        have, unit = len(t.raw_data), _ITEMSIZE[t.data_type]
        if have != count * unit:
            raise ModelError(f"{where}: {what} has {have} bytes of data, its dims "
                             f"{list(t.dims)} and type need {count * unit}; the model is "
                             "corrupted")
        return
    field, per = _TYPED_FIELDS[t.data_type]
    have = len(getattr(t, field))
    if have != count * per:
        raise ModelError(f"{where}: {what} has {have} values, its dims {list(t.dims)} need "
                         f"{count * per}; the model is corrupted")


def _check_tensors(model: onnx.ModelProto, where: str) -> None:
    """Initializer data matches its dims; no tensor of the graph is absurdly large."""
    for t in model.graph.initializer:
        _check_tensor(t, f"initializer {t.name!r}", where)
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        _check_size(vi, where)


def _check_size(vi, where: str) -> None:
    """A declared tensor (value_info) has no negative dimension and at most
    MAX_TENSOR_ELEMENTS elements."""
    if vi.type.HasField("tensor_type"):
        count = 1
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                if d.dim_value < 0:
                    raise ModelError(f"{where}: tensor {vi.name!r} has a negative dimension "
                                     f"{d.dim_value}")
                count *= d.dim_value
        if count > MAX_TENSOR_ELEMENTS:
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param
                    for d in vi.type.tensor_type.shape.dim]
            raise ModelError(f"{where}: tensor {vi.name!r} has shape {dims} "
                             f"({count} elements), more than onnxc handles "
                             f"({MAX_TENSOR_ELEMENTS}); check the model's shapes")
