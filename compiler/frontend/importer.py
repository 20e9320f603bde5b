"""ONNX -> Relax: the one import function of onnxc, driven by our operator registry.

Every node is checked against ``compiler.registry`` before anything is converted (all
unsupported nodes in one error).  Nodes are then converted in order by their registry
entry (TVM's frontend converters for the default domain, ours and custom ones on top).
Each node's output is bound to a Relax variable named after the node's index
(``n<k>``), and bindings a converter emits on the way get the same tag, so that later
stages can say which ONNX nodes every kernel computes (``compiler/lowering/provenance.py``).
"""

from __future__ import annotations

import warnings

import onnx
from onnx import helper

from ..errors import CompileError, ModelError, UnsupportedError
from .narrow_import import narrow_converter, storage_model
from ..lowering.provenance import node_of_binding, rename_bindings
from .registry import REGISTRY, ConvertContext, node_opset

def graph_inputs(model: onnx.ModelProto) -> list:
    """The graph inputs that are not initializers (what the user feeds)."""
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def input_signature(model: onnx.ModelProto, where: str = "model", shapes=None,
                    symbolic: bool = False, per_shape=()) -> list[dict]:
    """[{name, shape, dtype}] of the user-fed inputs.

    ``shapes`` ({name: [dims]}) fixes symbolic dimensions; a symbolic dimension left open
    is refused with the input's name, unless ``symbolic``: then it stays its ``dim_param``
    name (a str in ``shape``; an unnamed one is refused, it cannot be bound or ranged, and
    so is a name in ``per_shape``: the loader's name for a ``-1`` dim without a range).
    """
    shapes = shapes or {}
    sig = []
    for vi in graph_inputs(model):
        tt = vi.type.tensor_type
        dims = []
        for i, d in enumerate(tt.shape.dim):
            if vi.name in shapes:
                dims = [int(x) for x in shapes[vi.name]]
                break
            if not d.HasField("dim_value") and d.dim_param in per_shape:
                raise UnsupportedError(
                    f"{where}: input {vi.name!r} declares dimension -1 at axis {i} (read as "
                    f"{d.dim_param!r}): compiled per shape; give it a range "
                    f"(dims={{{d.dim_param!r}: (min, max)}}, --dim {d.dim_param}=MIN..MAX) to "
                    "keep it symbolic, or its shape (input_shapes=)")
            if not d.HasField("dim_value") and symbolic and d.dim_param:
                dims.append(d.dim_param)
                continue
            if not d.HasField("dim_value"):
                raise UnsupportedError(
                    f"{where}: input {vi.name!r} has a symbolic dimension "
                    f"{d.dim_param or '?'!r} at axis {i}; give its shape at compile time "
                    f"(input_shapes={{{vi.name!r}: [...]}}) or run it through a session that "
                    "specialises on the shapes it is fed")
            dims.append(d.dim_value)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        sig.append({"name": vi.name, "shape": dims, "dtype": dtype})
    return sig


# Ops whose indices (input 1) select along the axes of their data (input 0)
_INDEXING = {"Gather", "GatherElements", "ScatterElements", "GatherND", "ScatterND"}
_INT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
              onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
              onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}
# contrib ops whose inputs index the rows of a table input: {op: [(index input, table input)]}
# (onnxruntime's EmbedLayerNormalization refuses ids past its tables: "input index out of
# range"; our converter clamps them)
_TABLE_INDEXING = {"EmbedLayerNormalization": [(0, 2), (1, 4)],
                   "QEmbedLayerNormalization": [(0, 2), (1, 4)]}


def index_bounds(model: onnx.ModelProto) -> list[dict]:
    """Ranges that user-fed inputs used as indices must respect (token ids into an
    embedding table, GatherND / ScatterND coordinates): the session checks them, because
    the kernels do not (out of range, they read or write outside the table).

    Each entry: the input, the node, its op, and ``size`` / ``low`` / ``high`` (one axis:
    Gather, GatherElements, ScatterElements) or ``sizes`` (GatherND / ScatterND: the
    axes the indices' last dimension addresses, one per column, ``low`` / ``high`` of
    each ``-size`` / ``size - 1``)."""
    from .fold_onnx import static_shapes

    # integer inputs the caller feeds (indices are integers), and casts of them: their root
    fed = {vi.name: vi.name for vi in graph_inputs(model)
           if vi.type.tensor_type.elem_type in _INT_TYPES}
    shapes = static_shapes(model)
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    bounds = []
    for i, node in enumerate(model.graph.node):
        if node.op_type == "Cast" and node.input and node.input[0] in fed:
            fed[node.output[0]] = fed[node.input[0]]  # ids cast to int32 before the op
        for k, table in _TABLE_INDEXING.get(node.op_type, ()):
            rows = (shapes.get(node.input[table]) or [None])[0] \
                if len(node.input) > table else None
            if len(node.input) > k and node.input[k] in fed and isinstance(rows, int):
                bounds.append({"input": fed[node.input[k]], "node": node.name or f"#{i}",
                               "op": node.op_type, "size": rows, "low": 0, "high": rows - 1})
        if node.op_type not in _INDEXING or len(node.input) < 2 or node.input[1] not in fed:
            continue
        data = shapes.get(node.input[0])
        if not data or any(not isinstance(d, int) or d < 0 for d in data):
            continue
        name = node.name or f"#{i}"
        if node.op_type in ("GatherND", "ScatterND"):
            batch = next((a.i for a in node.attribute if a.name == "batch_dims"), 0)
            cols = (shapes.get(node.input[1]) or [None])[-1]
            if not isinstance(cols, int) or not 0 < cols <= len(data) - batch:
                continue  # the converter refuses it, or the width is symbolic
            sizes = list(data[batch:batch + cols])
            bounds.append({"input": fed[node.input[1]], "node": name, "op": node.op_type,
                           "sizes": sizes, "low": [-n for n in sizes],
                           "high": [n - 1 for n in sizes]})
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if not -len(data) <= axis < len(data):  # TVM's converter does not refuse it
            raise ModelError(f"node {name!r} ({node.op_type}): axis {axis} is out of range "
                             f"for its data input {node.input[0]!r} of rank {len(data)}")
        size = data[axis + len(data) if axis < 0 else axis]
        bounds.append({"input": fed[node.input[1]], "node": name, "op": node.op_type,
                       "size": size, "low": -size, "high": size - 1})
    return bounds


def unsupported_nodes(model: onnx.ModelProto, target_arch: str | None = None) -> list[dict]:
    """Nodes no registry entry supports (see ``OperatorRegistry.check``)."""
    return REGISTRY.check(model, target_arch)


def refuse_unsupported(model, where: str, target_arch: str | None = None) -> None:
    """Raise UnsupportedError listing every node no registry entry supports."""
    bad = unsupported_nodes(model, target_arch)
    if not bad:
        return
    lines = "\n".join(
        f"  node {b['node']!r}: {b['op']} (domain {b['domain']}, model opset {b['opset']}, "
        f"supported opsets: {', '.join(b['supported']) or 'none'}): {b['why']}" for b in bad)
    hint = next((DOMAIN_HINTS[b["domain"]] for b in bad if b["domain"] in DOMAIN_HINTS), "")
    raise UnsupportedError(
        f"{where}: {len(bad)} node(s) cannot be converted:\n{lines}\n{hint}"
        "run `onnxc ops` for the supported operators; register a converter for a custom "
        "operator with compiler.registry.register_op(domain, op_type)")


# Domains whose ops onnxc refuses by design, with what to do instead.
DOMAIN_HINTS = {
    "com.microsoft.nchwc": (
        "com.microsoft.nchwc ops are what onnxruntime's ORT_ENABLE_ALL optimizer saves: "
        "weights reordered for the block size of the CPU that saved the model, which the "
        "file does not record (onnxruntime documents such files as tied to that machine). "
        "Give onnxc the original model, or one saved at ORT_ENABLE_EXTENDED.\n"),
}


def import_onnx(model: onnx.ModelProto, where: str = "model", target_arch: str | None = None,
                shapes=None, symbolic: bool = False, per_shape=()):
    """Convert a validated model to a Relax IRModule whose ``main`` takes the graph inputs
    (in the model's order) and returns the graph outputs (a tuple when there are several).

    ``symbolic``: a symbolic input dimension becomes a ``tirx.Var`` (int64) named after its
    ``dim_param``, one Var per name shared by every input that uses it, except the
    ``per_shape`` names (refused: see :func:`input_signature`).
    """
    from tvm import tirx

    refuse_unsupported(model, where, target_arch)
    model, elem_types = storage_model(model)  # narrow types as codes (narrow_import.py)
    sig = input_signature(model, where, shapes, symbolic, per_shape)
    dim_vars: dict = {}
    for s in sig:
        s["shape"] = [dim_vars.setdefault(d, tirx.Var(d, "int64")) if isinstance(d, str)
                      else d for d in s["shape"]]
    importer = _Importer({s["name"]: s["shape"] for s in sig},
                         {s["name"]: s["dtype"] for s in sig})
    importer.where = where
    importer.elem_types = elem_types
    importer.domain_opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    opset = importer.domain_opsets.get("ai.onnx", 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importer.from_onnx(model.graph, opset)
    except CompileError:
        raise
    except Exception as e:
        raise CompileError(f"{where}: import to Relax failed: {_last_line(e)}") from e
    _check_outputs(mod, model, where)
    return _tag_bindings(mod)


def _last_line(e: Exception) -> str:
    """The last line of an exception's message (TVM's checks end with the reason)."""
    msg = str(e).strip().splitlines()
    return msg[-1] if msg else type(e).__name__


def _check_outputs(mod, model: onnx.ModelProto, where: str) -> None:
    """Refuse a conversion whose outputs differ in dtype or static shape from what the
    model declares: better an error than a silently wrong result."""
    from tvm import relax, tirx

    ret = mod["main"].ret_type if hasattr(mod["main"], "ret_type") else None
    ret = ret if ret is not None else mod["main"].body.body.ty
    got = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    declared = list(model.graph.output)
    if len(got) != len(declared):
        raise UnsupportedError(f"{where}: the converted graph has {len(got)} outputs, the model "
                               f"declares {len(declared)}")
    for vi, t in zip(declared, got):
        tt = vi.type.tensor_type
        if not isinstance(t, relax.TensorType):
            raise UnsupportedError(f"{where}: output {vi.name!r} does not convert to a tensor")
        if tt.elem_type:
            want = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
            if str(t.dtype) != want:
                raise UnsupportedError(f"{where}: output {vi.name!r} would be {t.dtype}, the "
                                       f"model declares {want}; refusing a wrong result")
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        shape = getattr(t, "shape", None)
        values = getattr(shape, "values", None)
        if tt.HasField("shape") and values is not None and None not in dims and all(
                isinstance(v, tirx.IntImm) for v in values):
            ours = [int(v.value) for v in values]
            if ours != dims:
                raise UnsupportedError(f"{where}: output {vi.name!r} would have shape {ours}, "
                                       f"the model declares {dims}; refusing a wrong result")


def _importer_base():
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    return ONNXGraphImporter


def _read_names(graph) -> set:
    """Names read by ``graph``'s nodes, its subgraphs' nodes, or returned by ``graph``."""
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(node.input)
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                read |= _read_names(g)
    return read


class _Importer(_importer_base()):
    """TVM's graph importer with the node loop replaced: registry dispatch, per-node
    error context and per-node binding tags."""

    where = "model"
    domain_opsets: dict = {}
    elem_types: dict = {}   # tensor name -> narrow_types.Format of its codes

    def _check_for_unsupported_ops(self, graph):
        pass  # done by the registry before conversion (import_onnx)

    def convert_subgraph(self, graph, names: dict, scope: str) -> None:
        """Convert a control-flow subgraph's nodes into the function being built.

        ``names`` ({ONNX tensor name: Relax expression}) is what the subgraph sees: the
        outer scope, its initializers and inputs; its nodes' outputs are added to it.  The
        importer's own tensor map is left as it was.  ``scope`` names the parent node in
        errors (``parent > child``), and the bindings take the parent node's tag.
        """
        outer = self._nodes
        self._nodes = names
        try:
            self._construct_nodes(graph, scope=scope)
        finally:
            self._nodes = outer

    def is_read(self, name: str) -> bool:
        """Whether tensor ``name`` is read by a node (in any subgraph too) or is a graph
        output: exporters name optional outputs that nothing reads (onnxscript's fusions
        name SkipSimplifiedLayerNormalization's ``mean``)."""
        read = getattr(self, "_read", None)
        return read is None or name in read

    def declared_dtype(self, name: str | None) -> str | None:
        """The numpy dtype name of tensor ``name``'s declared element type, else None."""
        import numpy as np
        from onnx import helper

        vi = getattr(self, "_declared_vis", {}).get(name)
        if vi is None or not vi.type.tensor_type.elem_type:
            return None
        try:
            return str(np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)))
        except (KeyError, TypeError):
            return None

    def declared_dims(self, name: str) -> list | None:
        """The model's declared shape of tensor ``name`` (ints and dim_param names, None
        for an unnamed unknown dim), or None when it declares none."""
        vi = getattr(self, "_declared_vis", {}).get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in vi.type.tensor_type.shape.dim]

    def _construct_nodes(self, graph, scope: str | None = None):
        """Convert ``graph``'s nodes in order.  ``scope`` is set for a control-flow
        subgraph (``compiler/frontend/control_flow.py``): it prefixes every error's node label, and
        the bindings go untagged, so they take the parent node's tag (``_tag_bindings``)."""
        from tvm import relax
        from tvm.relax.frontend.onnx.onnx_frontend import onnx_input

        if scope is None:  # the main graph's declared tensors, for declared_dims()
            self._declared_vis = {vi.name: vi for vi in list(graph.value_info)
                                  + list(graph.output)}
            self._read = _read_names(graph)
        for idx, node in enumerate(graph.node):
            self._tag = "sub" if scope else f"n{idx}"
            attr = self._parse_attr(node.attribute)
            inputs = onnx_input()
            for name in node.input:
                inputs.append(self._nodes[name] if name else None)
            attr["tvm_custom"] = {"name": node.name, "num_outputs": len(node.output)}
            domain = node.domain or "ai.onnx"
            opset = node_opset(domain, node.op_type, self.domain_opsets.get(domain, 1))
            entry = REGISTRY.lookup(domain, node.op_type, opset)
            label = f"node {node.name or '#' + str(idx)!r} ({node.op_type}, domain {domain}, " \
                    f"opset {opset})"
            if scope:
                label = f"{scope} > {label}"
            if entry is None:  # checked before conversion; guard against registry changes
                raise UnsupportedError(f"{self.where}: {label}: no converter registered")
            if self._shape_arithmetic(node, inputs, opset, label):
                continue
            if not (entry.implementation == "tvm" and node.op_type in _SHAPE_OK) or (
                    node.op_type == "Concat" and _mixes_shapes_and_tensors(inputs)):
                inputs = self._shape_values_as_tensors(inputs, label, node.input)
            convert = narrow_converter(entry, node, self.elem_types, f"{self.where}: {label}")
            ctx = ConvertContext(node=node, opset=opset, tensors=self._nodes, params=self._params,
                                importer=self, label=label)
            try:
                out = convert(self.bb, inputs, attr, ctx)
                if isinstance(out, relax.Expr):
                    if node.op_type == "Slice":
                        from . import shape_arith

                        out = shape_arith.check_slice_bounds(out, f"{self.where}: {label}")
                    out = _fold_shape_arithmetic(self.bb.normalize(out), self.bb)
                    out = _proved_broadcast(self.bb, out)
            except CompileError as e:
                if "node " in str(e):
                    raise
                # a converter helper's refusal that cannot know the node
                # (common.static_shape's "input shape is not known at compile time")
                raise type(e)(f"{self.where}: {label}: {e}") from e
            except Exception as e:
                raise CompileError(f"{self.where}: {label}: conversion failed: "
                                   f"{_last_line(e)}") from e
            if self._makes_sequence(node):
                # one output holding the whole sequence, as TVM's importer keeps it (its
                # "return_tuple_ops"): the sequence converters take a relax.Tuple of it
                self._nodes[node.output[0]] = self._as_sequence(
                    out, "sub" if scope else f"n{idx}")
                self._sequences.add(node.output[0])
                continue
            outs = self._bind_outputs(out, len(node.output), "sub" if scope else f"n{idx}",
                                     label)
            for name, value in zip(node.output, outs):
                if name:
                    self._nodes[name] = value
        # a graph output that is a shape value (e.g. Shape's) is returned as an int64 tensor
        for vi in graph.output:
            value = self._nodes.get(vi.name)
            if scope is None and (vi.name in self._sequences
                                  or not isinstance(value, (relax.Expr, type(None)))):
                what = ("an ONNX sequence" if vi.name in self._sequences
                        else "an empty ONNX optional")
                raise UnsupportedError(
                    f"{self.where}: graph output {vi.name!r} is {what}; onnxc's runtime "
                    "returns tensors only" + (". Return its tensors as separate outputs "
                    "(SequenceAt) or one (ConcatFromSequence)" if vi.name in self._sequences
                    else ""))
            if value is not None and isinstance(value.ty, relax.ShapeType):
                (self._nodes[vi.name],) = self._shape_values_as_tensors([value], vi.name)

    def _shape_arithmetic(self, node, inputs, opset: int, label: str) -> bool:
        """Evaluate ``node`` on symbolic known values (``shape_arith.py``); True when it
        was (its output is bound), False to convert it as usual."""
        from . import shape_arith

        known = getattr(self, "_known", None)
        if known is None:
            known = self._known = {}
        vals = [None if x is None else known.get(name, shape_arith.known_of(x))
                for name, x in zip(node.input, inputs)]
        try:
            if node.op_type == "Range" and len(vals) == 3 and all(
                    v is not None and v.ndim == 0 for v in vals) and any(
                    shape_arith.symbolic(v) for v in vals):
                dtype = str(inputs[0].ty.dtype) if hasattr(inputs[0].ty, "dtype") else "int64"
                out = shape_arith.arange(self.bb, *(v.item() for v in vals),
                                         dtype if dtype in ("int32", "int64") else "int64")
                if out is None:
                    return False
                (self._nodes[node.output[0]],) = self._bind_outputs(out, 1, self._tag, label)
                return True
            shaped = shape_arith.shaped_by(self.bb, node, inputs, vals)
            if shaped is not None:
                (self._nodes[node.output[0]],) = self._bind_outputs(
                    self.bb.normalize(shaped), 1, self._tag, label)
                return True
            value = shape_arith.evaluate(node, inputs, vals, opset)
        except CompileError:
            raise
        except Exception as e:
            raise CompileError(f"{self.where}: {label}: shape arithmetic failed: "
                               f"{_last_line(e)}") from e
        # taken when it holds dims, or was computed from some (Equal(shape, -1) is known)
        from_dims = any(v is not None and shape_arith.symbolic(v) for v in vals)
        if value is None or value.size > shape_arith.MAX_ELEMENTS or not (
                shape_arith.symbolic(value) or from_dims):
            return False
        known[node.output[0]] = value
        self._nodes[node.output[0]] = shape_arith.to_relax(
            self.bb, value, shape_arith.output_dtype(node, inputs))
        return True

    def _shape_values_as_tensors(self, inputs, label: str, names=()):
        """Shape values (from Shape, or shape arithmetic) fed to ops that take tensors: a
        static shape becomes an int64 constant, so the arithmetic on it folds at import; a
        symbolic one (or a symbolic scalar) a small kernel computing it
        (``shape_arith.materialize``)."""
        import numpy as np
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx.onnx_frontend import onnx_input

        from . import shape_arith

        out = onnx_input()
        for i, x in enumerate(inputs):
            # (getattr: an empty optional is TVM's marker object, with no type)
            if isinstance(getattr(x, "ty", None), (relax.ShapeType, tvm.ir.PrimType)):
                value = getattr(self, "_known", {}).get(names[i] if i < len(names) else None)
                value = shape_arith.known_of(x) if value is None else value
                if value is None and isinstance(x.ty, tvm.ir.PrimType):
                    # a scalar of TVM's own shape handling: a constant one (EnCodec's
                    # ceil((len - k) / stride + 1), folded to T.float64(24000.0)) as a 0-D
                    # tensor of the tensor's ONNX type, for converters that take tensors
                    # (relax.ceil); a symbolic one as it was
                    imm = (tvm.tirx.IntImm, tvm.tirx.FloatImm)
                    c = x if isinstance(x, imm) else getattr(x, "value", None)
                    if isinstance(c, imm):
                        name = names[i] if i < len(names) else None
                        dtype = self.declared_dtype(name) or str(c.ty.dtype)
                        x = relax.const(np.array(c.value, dtype), dtype)
                    out.append(x)
                    continue
                if value is None:
                    raise UnsupportedError(f"{self.where}: {label}: input {i} is a shape that "
                                           "is not known at compile time")
                if shape_arith.symbolic(value):
                    x = shape_arith.materialize(self.bb, value)
                else:
                    x = relax.const(np.array(value.tolist(), np.int64), "int64")
            out.append(x)
        return out

    @property
    def _sequences(self) -> set:
        """The names of the tensors that hold ONNX sequences (relax.Tuple values)."""
        if not hasattr(self, "_sequence_names"):
            self._sequence_names = set()
        return self._sequence_names

    def _makes_sequence(self, node) -> bool:
        """``node``'s one output is an ONNX sequence: a sequence op's, or an Optional /
        OptionalGetElement / Identity passing one through."""
        if node.op_type in _SEQUENCE_OPS:
            return True
        return (node.op_type in ("Optional", "OptionalGetElement", "Identity")
                and len(node.input) > 0 and node.input[0] in self._sequences)

    def _as_sequence(self, out, tag: str):
        """A sequence converter's result as a relax.Tuple of bound tensors (each element
        computed once however many nodes read it); an empty optional stays TVM's marker."""
        from tvm import relax

        if not isinstance(out, relax.Expr):
            return out  # onnx_frontend._EmptyOptional
        if isinstance(out, relax.Tuple):
            items = list(out.fields)
        else:  # a call returning a tuple (SplitToSequence's split)
            whole = self.bb.emit(out, name_hint=tag)
            items = [relax.TupleGetItem(whole, i) for i in range(len(whole.ty.fields))]
        return relax.Tuple([self.bb.emit(x, name_hint=f"{tag}_o{k}")
                            if isinstance(x, (relax.Call, relax.TupleGetItem)) else x
                            for k, x in enumerate(items)])

    def _bind_outputs(self, out, n_outputs: int, tag: str, label: str) -> list:
        """Bind each output to a variable tagged with the node; return them in order."""
        from tvm import relax

        if not isinstance(out, relax.Expr) and n_outputs == 1:
            return [out]  # an empty optional (onnx_frontend._EmptyOptional): no value
        if isinstance(out, relax.Tuple):
            items = list(out.fields)
        elif isinstance(out.ty, relax.TupleType) and n_outputs > 1:
            items = [relax.TupleGetItem(out, i) for i in range(len(out.ty.fields))]
        else:
            items = [out]
        if len(items) < n_outputs:
            raise CompileError(f"{self.where}: {label}: converter returned {len(items)} "
                               f"output(s), the node has {n_outputs}")
        bound = []
        for k, item in enumerate(items):
            # A Var the converter already bound (e.g. BatchNormalization's tuple items) is
            # re-bound under the tag, so the bindings before it are attributed to this node.
            if isinstance(item, (relax.Call, relax.TupleGetItem, relax.Var)):
                item = self.bb.emit(item, name_hint=tag if len(items) == 1 else f"{tag}_o{k}")
            bound.append(item)
        return bound


def _mixes_shapes_and_tensors(inputs) -> bool:
    from tvm import relax

    kinds = {isinstance(x.ty, relax.ShapeType) for x in inputs if x is not None}
    return len(kinds) == 2


# Integer tensors up to this size computed from constants only are evaluated at import.
_FOLD_MAX_ELEMENTS = 4096
# ... computed by at most this many expressions (shape arithmetic is short)
_FOLD_MAX_NODES = 256


# Relax ops broadcasting their tensor arguments (numpy rules), whose result shape
# _proved_broadcast may restore
_BROADCASTING = {f"relax.{n}" for n in (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum",
    "mod", "floor_mod", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "where")}


def _proved_broadcast(bb, out):
    """``out`` with its shape restored where Relax's inference lost it: an elementwise op
    over inputs whose symbolic dims are equal but written differently (SegFormer's
    residual add of ``((h - 1) // 4 * 32 + 32) * ((w - 1) // 4 + 1) // 32`` tokens, from a
    Reshape's -1, and ``((h - 1) // 4 + 1) * ((w - 1) // 4 + 1)``) gets a result of
    unknown shape, and every Shape read of it failed to import.  When each output dim is
    provably one argument's (equal, or the others' 1: numpy broadcasting), the op is
    emitted again over its arguments cast to one spelling of each dim (a cast of the
    result would leave the op itself of unknown shape, which LegalizeOps skips); else
    ``out`` as it is."""
    import tvm
    from tvm import relax, tirx

    from . import shape_arith

    ty = getattr(out, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is not None or ty.ndim < 1 or \
            not isinstance(out, relax.Call) or not isinstance(out.op, tvm.ir.Op) or \
            out.op.name not in _BROADCASTING:
        return out
    shapes = {}  # argument position -> its dims
    for i, a in enumerate(out.args):
        if isinstance(a.ty, relax.TensorType):
            values = getattr(a.ty.shape, "values", None)
            if values is None:
                return out
            shapes[i] = list(values)
    if not shapes or max(len(v) for v in shapes.values()) != ty.ndim:
        return out
    dims = []
    for k in range(ty.ndim):
        cands = [v[len(v) - ty.ndim + k] for v in shapes.values() if len(v) - ty.ndim + k >= 0]
        wide = [d for d in cands if not (isinstance(d, tirx.IntImm) and int(d) == 1)]
        if not wide:
            dims.append(cands[0])
            continue
        if not all(shape_arith.provably_equal(wide[0], d) for d in wide[1:]):
            return out
        dims.append(min(wide, key=lambda d: len(str(d))))  # the shortest spelling
    args = list(out.args)
    for i, values in shapes.items():
        want = [d if isinstance(d, tirx.IntImm) and int(d) == 1 else
                dims[ty.ndim - len(values) + k] for k, d in enumerate(values)]
        if not all(w.same_as(d) or (isinstance(w, tirx.IntImm) and isinstance(d, tirx.IntImm)
                                    and int(w) == int(d)) for w, d in zip(want, values)):
            args[i] = bb.match_cast(args[i], relax.TensorType(want, args[i].ty.dtype))
    redone = bb.normalize(relax.Call(out.op, args, out.attrs))
    return redone if getattr(redone.ty, "shape", None) is not None else out


def _fold_shape_arithmetic(expr, bb=None):
    """Evaluate a small integer/bool result computed from constants only (shape, index and
    mask arithmetic in exported graphs), so that converters downstream that need constant
    shapes or axes see constants.  Variables bound in ``bb`` are read through to their
    values (a OneHot over a shape value the import bound: transformers' Mixtral experts
    build a Tile's repeats so, and the Tile then lost its shape)."""
    import numpy as np
    import tvm
    from tvm import relax, tirx
    from tvm.ir.expr import GenericConst

    if not isinstance(expr, relax.Call) or not isinstance(expr.ty, relax.TensorType):
        return expr
    dtype = str(expr.ty.dtype)
    if not (dtype.startswith("int") or dtype.startswith("uint") or dtype == "bool"):
        return expr
    shape = getattr(expr.ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values) or \
            int(np.prod([int(v.value) for v in values])) > _FOLD_MAX_ELEMENTS:
        return expr

    def bound(e):
        return bb.lookup_binding(e) if bb is not None and isinstance(e, relax.Var) else None

    def constant_only(root) -> bool:
        """Whether ``root`` reads constants only, through bound variables.  An explicit
        walk (each expression once: they are DAGs through the bindings) that gives up past
        ``_FOLD_MAX_NODES`` expressions: the first argument of a float op's chain leads
        back through the whole network, deeper than Python's recursion (a transformers
        BERT-base export at static shapes: IsNaN over its attention mask)."""
        seen, stack = set(), [root]
        while stack:
            e = stack.pop()
            if isinstance(e, (GenericConst, relax.ShapeExpr, tvm.ir.expr.StringImm)) or \
                    e in seen:
                continue
            seen.add(e)
            if len(seen) > _FOLD_MAX_NODES:
                return False
            if isinstance(e, relax.Tuple):
                stack.extend(e.fields)
            elif isinstance(e, relax.Call):
                if not isinstance(e.op, tvm.ir.Op):
                    return False
                stack.extend(e.args)
            else:
                value = bound(e)
                if value is None:
                    return False
                stack.append(value)
        return True

    done: dict = {}

    def inlined(e):  # within constant_only's budget: shallow enough to recurse
        if e not in done:
            if isinstance(e, relax.Tuple):
                done[e] = relax.Tuple([inlined(f) for f in e.fields])
            elif isinstance(e, relax.Call):
                done[e] = relax.Call(e.op, [inlined(a) for a in e.args], e.attrs, e.ty_args)
            else:
                value = bound(e)
                done[e] = inlined(value) if value is not None else e
        return done[e]

    if not constant_only(expr):
        return expr
    try:
        fb = relax.BlockBuilder()  # the expression, read-through variables inlined, alone
        with fb.function("main", []):
            with fb.dataflow():  # FoldConstant folds dataflow bindings
                out = fb.emit_output(fb.emit(inlined(expr)))
            fb.emit_func_output(out)
        folded = relax.transform.FoldConstant()(fb.get())["main"].body
        values = {}
        while isinstance(folded, relax.SeqExpr):
            values.update({b.var: b.value for blk in folded.blocks for b in blk.bindings})
            folded = folded.body
        while isinstance(folded, relax.Var) and folded in values:
            folded = values[folded]
        return folded if isinstance(folded, GenericConst) else expr
    except Exception:  # not foldable here: leave it to the graph passes
        return expr


# Ops whose one output is an ONNX sequence (TVM's importer's "return_tuple_ops" that make
# one; Optional and OptionalGetElement pass theirs through: Importer._makes_sequence).
_SEQUENCE_OPS = {"SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
                 "SplitToSequence"}

# Ops whose TVM converters accept shape values (as TVM's importer lists them).
_SHAPE_OK = {"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand",
             "Concat", "Equal", "Where", "Cast", "CastLike", "Squeeze"}


def _tag_bindings(mod):
    """Rename every binding of main to its node's tag: an untagged binding (emitted while a
    converter built its result) takes the tag of the next tagged binding."""
    names = [b.var.name for block in mod["main"].body.blocks for b in block.bindings]
    new_names, pending, counts = [None] * len(names), [], {}
    for i, name in enumerate(names):
        k = node_of_binding(name)
        if k is None:
            pending.append(i)
            continue
        for j in pending:
            counts[k] = counts.get(k, 0) + 1
            new_names[j] = f"n{k}_{counts[k]}"
        pending = []
    return rename_bindings(mod, new_names) if any(new_names) else mod
