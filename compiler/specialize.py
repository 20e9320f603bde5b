"""Dynamic shapes: specialise on the concrete input shapes (and shape-determining values).

Our runtime runs static graphs: every tensor has a planned offset.  A model with symbolic
input dimensions, or whose small inputs determine shapes or axes (the inputs, of any dtype,
that ``_shape_value_inputs`` traces to a shape-determining slot: ``Reshape``'s shape,
``ReduceSum``'s axes, ``Resize``'s sizes, Range's float bounds, OneHot's depth, an If's or
Compress's bool condition, a Loop's trip count...; no other input is ever bound, so
kernels, not onnx.reference at compile time, compute on the data), is compiled
when it is run: the session compiles one variant per distinct key, as XLA and
torch.compile do, and keeps the most recent ``max_variants`` (LRU).  The key holds every
input's shape and dtype, plus the values of those small inputs only when the shapes alone
do not compile.  Values are never guessed: a variant is compiled from what was fed.

``compiler.compile(..., input_shapes=..., input_values=...)`` fixes them up front instead, which
is what exporting one artifact needs.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import driver
from .errors import CompileError, DimRangeError, ModelError
from .frontend.importer import graph_inputs, refuse_unsupported

# Integer inputs up to this many elements may be bound as values (shapes, axes, pads).
MAX_VALUE_ELEMENTS = 64


def specialize_model(model: onnx.ModelProto, shapes=None, values=None) -> onnx.ModelProto:
    """A copy of ``model`` with input dims fixed (``shapes``) and inputs bound to
    constants (``values``: they become initializers and leave the signature)."""
    shapes, values = dict(shapes or {}), dict(values or {})
    m = onnx.ModelProto()
    m.CopyFrom(model)
    known = {vi.name for vi in graph_inputs(m)}
    for name in list(shapes) + list(values):
        if name not in known:
            raise ValueError(f"unknown input {name!r}; the model's inputs are {sorted(known)}")
    keep = []
    for vi in m.graph.input:
        if vi.name in values:
            arr = np.asarray(values[vi.name])
            want = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            m.graph.initializer.append(numpy_helper.from_array(arr.astype(want), vi.name))
            continue
        if vi.name in shapes:
            dims = [int(d) for d in shapes[vi.name]]
            shape = vi.type.tensor_type.shape
            if len(shape.dim) != len(dims):
                raise ValueError(f"input {vi.name!r}: shape {dims} has rank {len(dims)}, the "
                                 f"model's input has rank {len(shape.dim)}")
            for d, v in zip(shape.dim, dims):
                if d.HasField("dim_value") and d.dim_value != v:
                    raise ValueError(f"input {vi.name!r}: dimension {d.dim_value} is fixed by "
                                     f"the model, got {v}")
                d.Clear()
                d.dim_value = v
        keep.append(vi)
    del m.graph.input[:]
    m.graph.input.extend(keep)
    # stale intermediate shapes from the symbolic model would contradict the new ones
    del m.graph.value_info[:]
    return m


def _declared(vi) -> tuple[list, str]:
    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tt.shape.dim]
    return dims, helper.tensor_dtype_to_np_dtype(tt.elem_type).name


def _node_arg(vi):
    """A session's NodeArg for a declared input / output; narrow types by their ONNX name
    (``tensor(float8e4m3fn)``, as the compiled session reports them)."""
    from runtime.session import NodeArg

    from .frontend.narrow_types import fmt_of

    fmt = fmt_of(vi.type.tensor_type.elem_type)
    return NodeArg(vi.name, *_declared(vi), fmt.name if fmt else None)


# Float inputs that determine output shapes, or (Resize's roi) the sampling grid that the
# Resize converter computes at compile time: (op_type, input index).
_SHAPE_FLOAT_SLOTS = {("Resize", 1), ("Resize", 2), ("Upsample", 1),
                      ("MelWeightMatrix", 3), ("MelWeightMatrix", 4)}  # mel: a constant output


def _shape_float_inputs(model) -> set:
    """Graph inputs used as Resize/Upsample ``scales``: their values fix output shapes."""
    return {name for node in model.graph.node if node.domain in ("", "ai.onnx")
            for k, name in enumerate(node.input) if (node.op_type, k) in _SHAPE_FLOAT_SLOTS}


# Input slots whose values the importer needs as constants: they fix output shapes, axes
# or counts, or which branch / how often control flow runs: op_type -> input indices (None:
# every input, the ops whose output shape depends on the data itself; Pad's constant_value
# because TVM's converter bakes it into the kernel).  Graph inputs these read, directly or
# through the nodes that compute them, are "shape-determining": the only inputs bound as
# values.  Any other input stays an input, computed on by kernels (an integer CumSum's
# data is not bound, so a kernel computes it rather than onnx.reference at compile time).
_REDUCE_AXES = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
_SHAPE_VALUE_SLOTS = {
    "Range": (0, 1, 2), "OneHot": (1,), "TopK": (1,), "Pad": (1, 2, 3), "Compress": (1,),
    "If": (0,), "Loop": (0, 1), "NonZero": None, "Unique": None, "NonMaxSuppression": None,
    "Dropout": (1, 2),  # ratio, training_mode: deterministic (identity) or random (refused)
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2),
    "MaxUnpool": (2,), "AffineGrid": (1,), "Trilu": (1,), "CumSum": (1,), "CumProd": (1,),
    "BlackmanWindow": (0,), "HammingWindow": (0,), "HannWindow": (0,), "MelWeightMatrix": None,
    "DFT": (1, 2), "STFT": (1, 3), **{op: (1,) for op in _REDUCE_AXES},
}


def _shape_value_inputs(model) -> set:
    """Graph inputs whose values determine shapes: Resize/Upsample's float ones, and those
    that reach a ``_SHAPE_VALUE_SLOTS`` input, through the nodes computing it (a Loop's
    trip count computed from Range's float start/limit/delta) and from inside subgraphs."""
    wanted = set()

    def slots(graph):
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and node.op_type in _SHAPE_VALUE_SLOTS:
                which = _SHAPE_VALUE_SLOTS[node.op_type]
                wanted.update(n for k, n in enumerate(node.input)
                              if n and (which is None or k in which))
            for a in node.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    slots(g)

    slots(model.graph)

    def producers(graph):  # subgraphs included: a branch computes a slot from outer values
        for n in graph.node:
            yield from ((o, n) for o in n.output if o)
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from producers(g)

    producer = dict(producers(model.graph))
    seen, todo = set(), list(wanted)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in ("Shape", "Size"):  # those read shapes only
            todo.extend(i for i in node.input if i)
            for a in node.attribute:  # an If's outputs: what its branches read and return
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    todo.extend(o.name for o in g.output)
                    todo.extend(i for n in g.node for i in n.input if i)
    fed = {vi.name for vi in graph_inputs(model)}
    return _shape_float_inputs(model) | (seen & fed)


def _is_value_input(dims, name, shape_values) -> bool:
    """A small input that reaches a shape-determining slot (``_shape_value_inputs``)."""
    small = all(isinstance(d, int) for d in dims) and int(np.prod(dims)) <= MAX_VALUE_ELEMENTS
    return small and name in shape_values


def _tensor_inputs(model) -> bool:
    """Every graph input is a tensor of a known element type (a sequence input, or an
    element type 0, fails at load whatever it is fed)."""
    return all(vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type
               in helper.get_all_tensor_dtypes() for vi in graph_inputs(model))


def _has_symbolic_or_value_inputs(model) -> bool:
    shape_values = _shape_value_inputs(model)
    for vi in graph_inputs(model):
        dims, _ = _declared(vi)
        if any(not isinstance(d, int) for d in dims):
            return True
        if _is_value_input(dims, vi.name, shape_values):
            return True
    return False


def compile_in_process(model, target="host", *, input_shapes=None, input_values=None,
                       max_variants: int = 8, **kwargs):
    """``compiler.compile`` in this process; see ``driver.compile_static`` for the other
    keywords.

    Returns a :class:`driver.CompiledModel`, or a :class:`DynamicModel` when the model
    needs the shapes or values it will be fed (symbolic dimensions, shape-determining
    inputs) and ``input_shapes`` / ``input_values`` do not fix them.
    """
    notes: list = []  # what the -1 dimensions of a specialised model were read as
    if input_shapes or input_values:
        proto = _load(model, notes)
        model = specialize_model(proto, input_shapes, input_values)
    try:
        cm = driver.compile_static(model, target, **kwargs)
        cm.report["warnings"] = notes + cm.report["warnings"]
        return cm
    except (ModelError, DimRangeError, TypeError, ValueError):
        raise
    except CompileError as e:
        notes = []
        proto = _load(model, notes)
        where = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "model"
        refuse_unsupported(proto, where)  # unsupported operators are never deferred
        if not _tensor_inputs(proto) or not _has_symbolic_or_value_inputs(proto):
            raise  # nothing a concrete shape or value could fix
        return DynamicModel(proto, target, kwargs, max_variants, reason=str(e), warnings=notes)


def _load(model, warnings: list | None = None) -> onnx.ModelProto:
    """``model`` (a path or a ModelProto) parsed, its identifiers checked to be UTF-8
    (``loader.check_text``: a ModelError naming the field) before specialisation reads
    its input names; free text stays as it is for ``load_model`` to decode and report,
    and a ``-1`` dimension reads as ``load_model`` reads it (``lenient.read_declarations``;
    its warning appended to ``warnings``)."""
    from .frontend.lenient import Leniency, read_declarations
    from .frontend.loader import check_text, read_model

    where = "model"
    if not isinstance(model, onnx.ModelProto):
        where = os.fspath(model)
        model = read_model(where)
    check_text(model, where)
    leniency = Leniency()
    model = read_declarations(model, leniency)  # -1 input dimensions: symbolic, as load_model
    if warnings is not None and leniency.notes:
        warnings.append(leniency.warning(where))
    return model


class DynamicModel:
    """A model compiled per input key when it runs (see the module docstring)."""

    def __init__(self, proto, target, kwargs: dict, max_variants: int, reason: str,
                 warnings: list | None = None):
        if max_variants < 1:
            raise ValueError(f"max_variants must be >= 1, got {max_variants}")
        self.proto, self.target, self.kwargs = proto, target, kwargs
        self.max_variants, self.reason = max_variants, reason
        self.inputs = [(vi.name, *_declared(vi)) for vi in graph_inputs(proto)]
        self.shape_values = _shape_value_inputs(proto)  # the inputs that may be bound
        self.report = {"dynamic": True, "why": reason.splitlines()[0],
                       "inputs": [{"name": n, "shape": s, "dtype": d} for n, s, d in self.inputs],
                       "max_variants": max_variants, "warnings": list(warnings or [])}

    def export(self, path):
        raise CompileError(
            f"cannot export one artifact: the model needs concrete input shapes or values "
            f"({self.report['why']}); compile with input_shapes={{...}} and, for inputs that "
            "determine shapes, input_values={...}" + self._range_hint())

    def _range_hint(self) -> str:
        """A hint naming the symbolic dims compiled at the default range: a model whose
        shapes hold only over some values (a wav2vec2 needs 400+ samples for one frame)
        fails over 1..128 and may compile over the range it runs at."""
        from .lowering.symbolic import DEFAULT_MAX, DEFAULT_MIN

        declared = set(self.kwargs.get("dims") or {})
        undeclared = sorted({d for _, dims, _ in self.inputs for d in dims
                             if isinstance(d, str) and d not in declared})
        if not undeclared:
            return ""
        flags = " ".join(f"--dim {d}=MIN..MAX" for d in undeclared)
        return (f"; or declare the range of each symbolic dim ({flags}; API dims=): "
                f"{', '.join(undeclared)} were compiled over the default "
                f"{DEFAULT_MIN}..{DEFAULT_MAX}, which may hold values the model does not "
                "support")

    def session(self, options=None) -> "SpecializingSession":
        return SpecializingSession(self, options)


class SpecializingSession:
    """onnxruntime-shaped session that compiles a variant per distinct input key."""

    def __init__(self, model: DynamicModel, options=None):
        self.model, self.options = model, options
        self._variants: OrderedDict = OrderedDict()   # key -> (session, bound input names)
        self._needs_values: dict = {}                 # shape key -> bool
        self._lock = threading.Lock()
        self.compiles = 0
        self.evictions = 0
        self.reports: list = []  # the compile report of every variant compiled, in order

    def get_inputs(self):
        return [_node_arg(vi) for vi in graph_inputs(self.model.proto)]

    def get_outputs(self):
        return [_node_arg(vi) for vi in self.model.proto.graph.output]

    def _check(self, feed: dict) -> None:
        names = [n for n, _, _ in self.model.inputs]
        for k in feed:
            if k not in names:
                raise ValueError(f"unknown input {k!r}; the model's inputs are {names}")
        for name, dims, dtype in self.model.inputs:
            if name not in feed:
                raise ValueError(f"missing input {name!r}; the model's inputs are {names}")
            a = feed[name]
            if not isinstance(a, np.ndarray):
                raise ValueError(f"input {name!r}: expected a numpy array, got "
                                 f"{type(a).__name__}")
            if a.dtype != np.dtype(dtype):
                raise ValueError(f"input {name!r}: expected dtype {dtype}, got {a.dtype}")
            if a.ndim != len(dims) or any(isinstance(d, int) and d != s
                                          for d, s in zip(dims, a.shape)):
                raise ValueError(f"input {name!r}: expected shape {dims}, got {list(a.shape)}")

    def run(self, output_names, input_feed: dict) -> list:
        self._check(input_feed)
        shape_key = tuple((n, input_feed[n].shape) for n, _, _ in self.model.inputs)
        with self._lock:
            sess, bound = self._variant(shape_key, input_feed)
        return sess.run(output_names, {k: v for k, v in input_feed.items() if k not in bound})

    def _value_inputs(self, feed) -> list:
        """The fed inputs to bind: small ones that reach a shape-determining slot."""
        return [n for n, _, _ in self.model.inputs
                if feed[n].size <= MAX_VALUE_ELEMENTS and n in self.model.shape_values]

    def _variant(self, shape_key, feed):
        needs_values = self._needs_values.get(shape_key)
        bound = self._value_inputs(feed) if needs_values else []
        key = shape_key + tuple((n, feed[n].tobytes()) for n in bound)
        if key in self._variants:
            self._variants.move_to_end(key)
            return self._variants[key]
        shapes = {n: list(s) for n, s in shape_key}
        cm = None
        if needs_values is None:  # first time these shapes are seen: do they suffice?
            try:
                cm = self._compile(shapes, {})
                self._needs_values[shape_key] = False
            except CompileError:
                bound = self._value_inputs(feed)
                if not bound:
                    raise
                self._needs_values[shape_key] = True
                key = shape_key + tuple((n, feed[n].tobytes()) for n in bound)
        if cm is None:
            cm = self._compile({n: s for n, s in shapes.items() if n not in bound},
                               {n: feed[n] for n in bound})
        entry = (cm.session(self.options), set(bound))
        self._variants[key] = entry
        if len(self._variants) > self.model.max_variants:
            self._variants.popitem(last=False)
            self.evictions += 1
        return entry

    def _compile(self, shapes, values):
        self.compiles += 1
        proto = specialize_model(self.model.proto, shapes, values)
        # every input dim is fixed now: the symbolic dims' ranges have nothing to apply to
        kwargs = {k: v for k, v in self.model.kwargs.items() if k != "dims"}
        # a variant compiles while its first run waits: no extra builds to measure the
        # bf16 error (its report's precision entry says it was not measured)
        kwargs["precision_check"] = False
        cm = driver.compile_static(proto, self.model.target, **kwargs)
        self.reports.append(cm.report)
        return cm
