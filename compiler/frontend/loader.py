"""Load and validate an ONNX model before anything is converted.

Reads the file, runs ``onnx.checker`` and shape inference, and checks the opsets, so that
a broken model fails here with a message naming the file, the node or the tensor, rather
than deep inside TVM.

Strings first (:func:`check_text`): protobuf hands a field whose bytes are not UTF-8 back
as ``bytes``.  An identifier that is not UTF-8 (graph, node, tensor, input/output,
attribute or function name, op type, domain, string attribute value, metadata_props key)
is refused with a ``ModelError`` naming the field ("graph name", "node #12 (Add) name",
"input 0 name", "node 'r' (#2) attribute 'mode' value", "metadata_props #0 key"); free
text (``doc_string``, ``producer_name``, ``producer_version``, metadata_props values) is
decoded with backslash escapes and a warning names it.  Nothing after the loader sees
``bytes`` where ONNX declares a string.
"""

from __future__ import annotations

import logging
import os

import onnx
from onnx import TensorProto, shape_inference

from ..errors import ModelError, UnsupportedError
from . import lenient
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


def load_model(model, warnings: list | None = None,
               lenient_dims: list | None = None) -> onnx.ModelProto:
    """Return a checked, shape-inferred copy of ``model`` (a path or a ModelProto).

    Strings that are not UTF-8 follow :func:`check_text`: an identifier (a name, an op
    type, a string attribute...) is a ``ModelError`` naming the field; free text
    (``doc_string``, ``producer_name``, ``producer_version``, metadata_props values) is
    decoded with backslash escapes, with a warning appended to ``warnings`` (logged on
    the ``onnxc`` logger when ``warnings`` is None).  Every later stage sees ``str`` only.
    The names given to the inputs' ``-1`` dims (``lenient.Leniency.dims``) are appended to
    ``lenient_dims``.
    """
    where = "model"
    given = model  # never modified: the result is a copy, or a proto read here
    if isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        model = read_model(where)
    elif not isinstance(model, onnx.ModelProto):
        raise ModelError(f"expected a path or onnx.ModelProto, got {type(model).__name__}")
    model, text_warnings = check_text(model, where)  # first: later checks quote names
    model = _inlined(model, where)
    if warnings is not None:
        warnings.extend(text_warnings)
    for w in text_warnings if warnings is None else ():
        logging.getLogger("onnxc").warning("%s", w)
    if len(model.graph.node) == 0:
        raise ModelError(f"{where}: the graph has no nodes")
    model, contrib_warnings = _with_contrib_opset(model, where)
    if warnings is not None:
        warnings.extend(contrib_warnings)
    for w in contrib_warnings if warnings is None else ():
        logging.getLogger("onnxc").warning("%s", w)
    _check_opsets(model, where)
    model, leniency = lenient.prepare(model, where)  # what onnxruntime runs as it reads it
    for vi in model.graph.input:  # before shape inference: onnx's data propagation runs
        _check_size(vi, where)     # for ever on a 2^62-element input feeding Range (fuzzer)
    if leniency.shapeless:  # the checker wants every output declared: inference declares them
        lenient.declare_outputs(model, _inferred(without_large_initializers(model)[0], where),
                                leniency, where)
    light, large = without_large_initializers(model)
    try:
        onnx.checker.check_model(lenient.for_checker(light, leniency))
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{where}: invalid ONNX model: {_first_line(e)}") from None
    inferred = lenient.restore(with_initializers(_inferred(light, where), model, large,
                                                 reuse_model=model is not given), leniency)
    note = leniency.warning(where)
    if lenient_dims is not None:
        lenient_dims.extend(leniency.dims)
    if note and warnings is not None:
        warnings.append(note)
    elif note:
        logging.getLogger("onnxc").warning("%s", note)
    _check_inputs(inferred, where)
    _check_outputs(inferred, where)
    _check_types(inferred, where)
    _check_attributes(inferred.graph, where)
    _check_tensors(inferred, where)
    return inferred


# Initializers above this many bytes are not shown to onnx.checker and shape inference (they
# see a graph input of the same type and shape instead): both serialize the whole model, and
# for GPT-2's 500 MB that was most of the load (about 7 of 8 CPU seconds).  Shape inference
# reads constant values only for shape-like inputs (Reshape's shape, Slice's starts, Pad's
# pads...), which are far smaller; _check_tensors checks the data of every initializer.
LARGE_INITIALIZER_BYTES = 1 << 16


def without_large_initializers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list]:
    """(a copy of ``model`` whose main-graph initializers above LARGE_INITIALIZER_BYTES are
    graph inputs of the same type and shape, the names of those initializers); ``model``
    itself and ``[]`` when it has none."""
    large = [t for t in model.graph.initializer
             if t.data_type in _ITEMSIZE and _declared_bytes(t) > LARGE_INITIALIZER_BYTES]
    if not large:
        return model, []
    names = {t.name for t in large}
    light = onnx.ModelProto()
    _copy_fields(model, light, skip=("graph",))
    _copy_fields(model.graph, light.graph, skip=("initializer",))
    light.graph.initializer.extend(t for t in model.graph.initializer if t.name not in names)
    declared = {vi.name for vi in model.graph.input}
    light.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in large if t.name not in declared)
    return light, [t.name for t in large]


def with_initializers(inferred: onnx.ModelProto, model: onnx.ModelProto,
                      large: list, reuse_model: bool = False) -> onnx.ModelProto:
    """``inferred`` (shape inference's result on ``without_large_initializers(model)``) with
    ``model``'s initializers back in their order and the stand-in inputs dropped.

    ``reuse_model`` (``model`` is the caller's own, to be replaced by the result): where
    inference changed only what it infers (the graph's value_info, inputs and outputs),
    those are moved into ``model`` and ``model`` is returned: the same message, without
    copying the initializers (GPT-2's 500 MB: about 1.1 CPU s per copy)."""
    if not large:
        return inferred
    declared = {vi.name for vi in model.graph.input}
    stand_ins = set(large) - declared
    inputs = [vi for vi in inferred.graph.input if vi.name not in stand_ins]
    if reuse_model and _only_inferred_fields_differ(inferred, model, large):
        for field, values in (("value_info", inferred.graph.value_info), ("input", inputs),
                              ("output", inferred.graph.output)):
            del getattr(model.graph, field)[:]
            getattr(model.graph, field).extend(values)
        return model
    del inferred.graph.input[:]
    inferred.graph.input.extend(inputs)
    del inferred.graph.initializer[:]
    inferred.graph.initializer.extend(model.graph.initializer)
    return inferred


# the graph fields shape inference fills in (with_initializers moves them into the model)
_INFERRED_GRAPH_FIELDS = ("value_info", "input", "output", "initializer")


def _only_inferred_fields_differ(inferred, model, large: list) -> bool:
    """Whether ``inferred`` equals ``model`` but for the graph's value_info, inputs,
    outputs and its large initializers (``without_large_initializers``' stand-ins)."""
    for field, value in inferred.ListFields():
        if field.name != "graph" and value != getattr(model, field.name):
            return False
    if {f.name for f, _ in model.ListFields()} != {f.name for f, _ in inferred.ListFields()}:
        return False
    if {f.name for f, _ in inferred.graph.ListFields()} - set(_INFERRED_GRAPH_FIELDS) != \
            {f.name for f, _ in model.graph.ListFields()} - set(_INFERRED_GRAPH_FIELDS):
        return False
    for field, value in inferred.graph.ListFields():
        if field.name not in _INFERRED_GRAPH_FIELDS and value != getattr(model.graph,
                                                                          field.name):
            return False
    names = set(large)
    return list(inferred.graph.initializer) == \
        [t for t in model.graph.initializer if t.name not in names]


def _copy_fields(src, dst, skip=()) -> None:
    """Every set field of protobuf message ``src`` but ``skip`` into ``dst`` (same type)."""
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _declared_bytes(t) -> int:
    count = 1
    for d in t.dims:
        count *= max(d, 0)
    return count * _ITEMSIZE[t.data_type]


def _inferred(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """Strict shape inference (``_infer_shapes``), a failure as a ModelError."""
    try:
        return _infer_shapes(model)
    except Exception as e:  # onnx raises InferenceError/ValidationError/RuntimeError
        raise ModelError(f"{where}: shape inference failed: {_first_line(e)}") from None


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


# Domains onnxruntime runs at version 1 when a model uses them without importing an opset
# (onnxruntime.transformers.optimizer writes com.microsoft nodes without the import).
LENIENT_DOMAINS = ("com.microsoft",)


def _with_contrib_opset(model: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto, list]:
    """``model``, or a copy importing opset 1 of each lenient domain its nodes use without
    importing it (as onnxruntime runs them), and a warning naming what was assumed."""
    imported = {o.domain for o in model.opset_import}
    used: dict = {}
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain in LENIENT_DOMAINS and node.domain not in imported:
                used.setdefault(node.domain, set()).add(node.op_type)
    if not used:
        return model, []
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    warnings = []
    for domain, ops in sorted(used.items()):
        fixed.opset_import.append(onnx.helper.make_opsetid(domain, 1))
        warnings.append(f"{where}: node(s) of domain {domain!r} ({', '.join(sorted(ops))}) but "
                        f"no opset import for it: read as {domain} version 1, as onnxruntime "
                        "does (lenient)")
    return fixed, warnings


def _graphs(graph):
    """``graph`` and every subgraph of its nodes' attributes."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graphs(g)


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


def _inlined(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """``model`` with its model-local functions inlined (torch.onnx's dynamo exports call
    onnxscript's ``torch_lib`` functions; onnxruntime inlines them too): the registry
    converts ONNX ops, and a call of a local function is none.  Calls inside subgraphs
    are inlined as well."""
    if not model.functions:
        return model
    from onnx import inliner

    try:
        return inliner.inline_local_functions(model)
    except Exception as e:  # noqa: BLE001 - onnx's C++ inliner raises plain errors
        raise ModelError(f"{where}: could not inline the model's local functions "
                         f"({', '.join(f.domain + '.' + f.name for f in model.functions)}): "
                         f"{_first_line(e)}") from None


def _check_outputs(model: onnx.ModelProto, where: str) -> None:
    """Refuse a graph output declared as a sequence or map (an optional of one included)
    before conversion: the runtime returns tensors only, and a control-flow node that
    yields one (an If whose branch returns an empty optional sequence) would otherwise fail
    inside the converter with a bare Python error."""
    for vi in model.graph.output:
        t, optional = vi.type, vi.type.HasField("optional_type")
        if optional:
            t = t.optional_type.elem_type
        kind = t.WhichOneof("value")
        if kind in ("sequence_type", "map_type"):
            noun = "ONNX sequence" if kind == "sequence_type" else "ONNX map"
            raise UnsupportedError(
                f"{where}: graph output {vi.name!r} is an {'optional ' if optional else ''}"
                f"{noun}; onnxc's runtime returns tensors only" + (
                    ". Return its tensors as separate outputs (SequenceAt) or one "
                    "(ConcatFromSequence)" if kind == "sequence_type" else ""))


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


def _repeated(field) -> bool:
    rep = getattr(field, "is_repeated", None)  # protobuf >= 6; older ones have .label
    return bool(rep) if rep is not None else field.label == field.LABEL_REPEATED


# -- text: every string of the model is UTF-8 before any later stage reads it -------------
#
# protobuf (upb) does not validate proto2 strings: a field whose bytes are not UTF-8 comes
# back as ``bytes`` and would reach the manifest (JSON), reports, traces, error messages
# and file names as such.  The rule (also in docs/security.md):
#
# * identifiers -- graph, node, tensor, input/output, attribute and function names, op
#   types, domains, string attribute values, metadata_props keys, dim_params: every
#   string not listed below -- are refused with a ModelError naming the field;
# * free text nothing computes with -- ``doc_string`` of any message, ``producer_name``,
#   ``producer_version`` and metadata_props values -- is decoded with backslash escapes
#   (``b'a\xedb'`` reads ``'a\\xedb'``) and one warning names the fields.

FREE_TEXT_FIELDS = frozenset({"doc_string", "producer_name", "producer_version"})


def check_text(model: onnx.ModelProto, where: str = "model") -> tuple[onnx.ModelProto, list]:
    """Apply the UTF-8 rule above to every string of ``model`` (subgraphs, functions,
    initializers, sparse initializers, value_info and training info included).

    Returns ``(model, warnings)``: ``model`` itself when every string is UTF-8, else a copy
    whose free-text fields are decoded with escapes, and one warning naming them.  Raises
    ``ModelError`` naming the first identifier that is not UTF-8 (and how many more).
    """
    found: list = []
    _walk_text(model, None, found)
    if not found:
        return model, []
    bad_ids = [f for f in found if not _free_text(f[0], f[2], f[3])]
    if bad_ids:
        path, msg, field, index, raw = bad_ids[0]
        label = _label(path, msg, field, index)
        more = f" (and {len(bad_ids) - 1} more field(s))" if len(bad_ids) > 1 else ""
        raise ModelError(f"{where}: {label} is not valid UTF-8 ({_show(raw)}){more}; names "
                         "and other identifiers of an ONNX model must be UTF-8 text: the file "
                         "is corrupted or its exporter is broken; re-export the model or set "
                         "the field to UTF-8 text")
    labels = [_label(path, msg, field, index) for path, msg, field, index, _ in found]
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    found = []
    _walk_text(fixed, None, found)
    for _, msg, field, _, raw in found:  # free text only, as in ``model``
        setattr(msg, field, text(raw))
    shown = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
    return fixed, [f"{where}: {len(labels)} free-text field(s) not valid UTF-8, read with "
                   f"backslash escapes: {shown}"]


def text(value) -> str:
    """A string field's value for a message: bytes (not UTF-8) decoded with escapes."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _show(raw: bytes) -> str:
    """``raw`` as escaped text and the first byte that breaks UTF-8."""
    try:
        raw.decode("utf-8")
        return f"'{text(raw)}'"
    except UnicodeDecodeError as e:
        return f"'{text(raw)}': byte 0x{raw[e.start]:02x} at offset {e.start}"


def _named(msg, index: int, kind: str) -> str:
    """``kind 'name' (#index)``, or ``kind #index (op)`` when the name is empty or not text."""
    name = getattr(msg, "name", "")
    if isinstance(name, str) and name:
        return f"{kind} {name!r} (#{index})"
    op = getattr(msg, "op_type", "")
    return f"{kind} #{index}" + (f" ({op})" if isinstance(op, str) and op else "")


_PARTS = {"node": "node", "initializer": "initializer", "sparse_initializer":
          "sparse initializer", "value_info": "value_info", "functions": "function"}


def _part(parent, field: str, index, child) -> str:
    """How ``parent.field[index]`` (a message) is named in a message."""
    if field in ("input", "output") and child.DESCRIPTOR.name == "ValueInfoProto":
        return f"{field} {index}"
    if field in _PARTS and index is not None:
        return _named(child, index, _PARTS[field])
    if field == "attribute" and parent.DESCRIPTOR.name == "NodeProto":
        return _named(child, index, "attribute").replace(f" (#{index})", "")
    if field in ("g", "graphs") and parent.DESCRIPTOR.name == "AttributeProto":
        return "subgraph" if index is None else f"subgraph {index}"
    return field if index is None else f"{field} #{index}"


def _walk_text(msg, path, found: list) -> None:
    """Append (path, message, field, index, bytes) for every string of ``msg`` that is not
    UTF-8.  ``path``: how ``msg`` was reached, (parent path, parent, field, index, msg), or
    None for the model; labels are made from it only for what is found (the walk is the
    hot part: a model has tens of thousands of strings).  Reads only string and message
    fields, never a tensor's data."""
    strings, messages = _plan(msg.DESCRIPTOR)
    for name, repeated, attr_value in strings:
        values = enumerate(getattr(msg, name)) if repeated else ((None, getattr(msg, name)),)
        for index, value in values:
            if not isinstance(value, bytes):
                continue
            if attr_value:  # declared bytes, UTF-8 text by the spec
                try:
                    value.decode("utf-8")
                    continue
                except UnicodeDecodeError:
                    pass
            found.append((path, msg, name, index, value))
    for name, repeated in messages:
        if repeated:
            for index, child in enumerate(getattr(msg, name)):
                _walk_text(child, (path, msg, name, index, child), found)
        elif msg.HasField(name):
            child = getattr(msg, name)
            _walk_text(child, (path, msg, name, None, child), found)


_PLANS: dict = {}


def _plan(descriptor) -> tuple:
    """(string fields [(name, repeated, is a string attribute value)], message fields
    [(name, repeated)]) of a message type, computed once per type."""
    plan = _PLANS.get(descriptor.full_name)
    if plan is None:
        from google.protobuf.descriptor import FieldDescriptor as FD

        strings, messages = [], []
        for field in descriptor.fields:
            attr_value = descriptor.name == "AttributeProto" and field.name in ("s", "strings")
            if field.type == FD.TYPE_STRING or attr_value:
                strings.append((field.name, _repeated(field), attr_value))
            elif field.type == FD.TYPE_MESSAGE:
                messages.append((field.name, _repeated(field)))
        plan = _PLANS[descriptor.full_name] = (strings, messages)
    return plan


def _context(path) -> str:
    """How the message reached through ``path`` is named ("" for the model and the main
    graph: their own fields read "model ...", "graph ...")."""
    if path is None:
        return ""
    parent_path, parent, field, index, child = path
    outer = _context(parent_path)
    kind = parent.DESCRIPTOR.name
    part = "" if kind == "ModelProto" and field == "graph" else _part(parent, field, index, child)
    # the parts of a subgraph or function read "<where it is> > node 'x' (#3)"
    sep = " > " if outer and kind in ("GraphProto", "FunctionProto") else " "
    return sep.join(p for p in (outer, part) if p).strip()


def _label(path, msg, field: str, index) -> str:
    """The name of string ``field`` (element ``index``) of ``msg`` in a message."""
    kind = msg.DESCRIPTOR.name
    if kind == "AttributeProto" and field in ("s", "strings"):
        what = "value" if index is None else f"value {index}"
    else:
        what = field if index is None else f"{field} {index}" if kind in (
            "NodeProto", "FunctionProto") else f"{field} #{index}"
    own = _context(path) or {"ModelProto": "model", "GraphProto": "graph"}.get(kind, "")
    return f"{own} {what}".strip()


def _free_text(path, field: str, index) -> bool:
    """Is this string free text (decoded with escapes) rather than an identifier?"""
    if index is not None:
        return False
    return field in FREE_TEXT_FIELDS or (field == "value" and path is not None
                                         and path[2] == "metadata_props")


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
