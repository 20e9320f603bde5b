"""What onnxruntime runs but ``onnx.checker`` or strict shape inference refuse: read as
onnxruntime reads it, with one warning naming everything that was read leniently.

Eight things exporters write that onnxruntime 1.32 accepts (checked on tiny models in
``tests/compiler/frontend/test_lenient.py``):

* a ``-1`` dimension in a declared shape (onnx's checker reads it literally and strict
  inference then sees ``2`` vs ``-1``): onnxruntime reads it as unknown.  A graph input's
  ``-1`` becomes the symbolic dimension ``<input>_dim<axis>``.  The name is ours, not the
  exporter's, so nothing says two such dims are equal or what range they have: the model
  compiles per shape (``compiler/specialize.py``) unless ``dims=`` / ``--dim`` gives the
  name a range, which keeps it symbolic (``Leniency.dims`` lists them); an output's or a
  ``value_info``'s is dropped to an unknown dimension that shape inference fills;
* a graph output declared without a type or without a shape (the checker's "Field
  'shape' of 'type' is required"): its declaration is taken from shape inference;
* a default-domain op used below its first version (``LayerNormalization``, since 17, in
  an opset-14 model: onnxruntime registers it for opsets 1..16).  The op has no other
  definition at the model's opset, so its first version is the only meaning it can have:
  it is read at that version (``registry.node_opset``).  Checker and inference see such a
  node as a call in a private domain (shape inference: of a model-local function whose
  body is the op at its first version); :func:`restore` puts the node back afterwards.  Nodes inside subgraphs are not
  rewritten (they stay refused by the checker);
* an op onnxruntime registers in the default domain that onnx does not define
  (``SimplifiedLayerNormalization``: onnxruntime's transformer optimizer writes it for
  RMSNorms): read as onnxruntime's op (``ORT_DEFAULT_DOMAIN_OPS``), the same way;
* a ``value_info`` whose shape contradicts the initializer of the same name (transformers'
  ``OnnxExporter`` with ``ort_fusions="cpu"`` declares its attention scale, a ``[1]``
  initializer, as a scalar; strict inference: "Inferred shape and existing shape differ
  in rank"): onnxruntime takes the initializer's shape, the declaration is dropped;
* an op onnx deprecated at the model's opset that onnxruntime still runs there
  (GroupNormalization-18, ``DEPRECATED_ORT_RUNS``): read as that version, the same way;
* an initializer that is not a graph input in a model of IR version 3 (the checker: "in
  initializer but not in graph input"; onnxruntime's own older test models): onnxruntime
  reads it as a constant, as IR 4 does, and the model is read as IR 4;
* nodes out of topological order (onnxruntime's fp16 converter,
  ``onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)``,
  appends the input casts after their consumers; the checker: "Nodes in a graph must be
  topologically sorted"): onnxruntime sorts the graph, and so does :func:`prepare`,
  keeping the written order wherever the dependencies allow.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .registry import first_version

# The private domain of the local functions that stand for late ops during checking.
LATE_DOMAIN = "onnxc.late_op"


class Leniency:
    """What :func:`prepare` read leniently: ``notes`` (one phrase each), the graph nodes
    it wrapped as local-function calls (index -> original node) and the outputs declared
    without a shape."""

    def __init__(self):
        self.notes: list[str] = []
        self.dims: list[str] = []  # the symbolic dims named here for an input's -1
        self.wrapped: dict[int, onnx.NodeProto] = {}
        self.shapeless: list[str] = []

    def warning(self, where: str) -> str | None:
        """The one warning naming what was accepted, or None."""
        if not self.notes:
            return None
        return (f"{where}: accepted as onnxruntime does, not as the ONNX checker would: "
                + "; ".join(self.notes))


def read_declarations(model: onnx.ModelProto, leniency: Leniency | None = None
                      ) -> onnx.ModelProto:
    """``model``, or a copy whose ``-1`` dimensions read as onnxruntime reads them (graph
    inputs: symbolic ``<input>_dim<axis>``; outputs and value_info: unknown).  Notes go to
    ``leniency``.  Other negative dimensions are left for the loader to refuse."""
    def minus_one(vi):
        return vi.type.HasField("tensor_type") and any(
            d.HasField("dim_value") and d.dim_value == -1 for d in vi.type.tensor_type.shape.dim)

    g = model.graph
    if not any(minus_one(vi) for vi in list(g.input) + list(g.output) + list(g.value_info)):
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    inits = {t.name for t in fixed.graph.initializer}
    for kind, vis in (("input", fixed.graph.input), ("output", fixed.graph.output),
                      ("value_info", fixed.graph.value_info)):
        for vi in vis:
            if not minus_one(vi):
                continue
            axes = []
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value == -1:
                    d.Clear()
                    if kind == "input" and vi.name not in inits:
                        d.dim_param = f"{vi.name}_dim{axis}"
                        if leniency is not None:
                            leniency.dims.append(d.dim_param)
                    axes.append(axis)
            if leniency is not None:
                read = "symbolic " + ", ".join(f"'{vi.name}_dim{a}'" for a in axes) \
                    if kind == "input" and vi.name not in inits else "unknown"
                leniency.notes.append(f"{kind} {vi.name!r} declares dimension -1 at axis "
                                      f"{', '.join(map(str, axes))} (read as {read})")
    return fixed


def _initializer_shapes(model: onnx.ModelProto, leniency: Leniency) -> onnx.ModelProto:
    """``model``, or a copy without the ``value_info`` entries whose declared shape
    contradicts their initializer's dims (onnxruntime reads the initializer's)."""
    dims = {t.name: list(t.dims) for t in model.graph.initializer}

    def contradicts(vi):
        if vi.name not in dims or not vi.type.HasField("tensor_type") \
                or not vi.type.tensor_type.HasField("shape"):
            return False
        declared = vi.type.tensor_type.shape.dim
        return len(declared) != len(dims[vi.name]) or any(
            d.HasField("dim_value") and d.dim_value != n
            for d, n in zip(declared, dims[vi.name]))

    bad = [vi for vi in model.graph.value_info if contradicts(vi)]
    if not bad:
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    keep = [vi for vi in fixed.graph.value_info if not contradicts(vi)]
    del fixed.graph.value_info[:]
    fixed.graph.value_info.extend(keep)
    for vi in bad:
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in vi.type.tensor_type.shape.dim]
        leniency.notes.append(f"value_info {vi.name!r} declares shape {shape}, its "
                              f"initializer has {dims[vi.name]} (read as the initializer's)")
    return fixed


def _unlisted_initializers(model: onnx.ModelProto, leniency: Leniency) -> onnx.ModelProto:
    """``model``, or a copy read as IR version 4 when it is older and has initializers that
    are not graph inputs (the checker: "W in initializer but not in graph input"; IR 3
    lists every initializer as an input).  onnxruntime reads such an initializer as a
    constant, which is what IR 4 made it; nothing else changed between the two versions."""
    if model.ir_version >= 4:
        return model
    inputs = {vi.name for vi in model.graph.input}
    unlisted = [t.name for t in model.graph.initializer if t.name not in inputs]
    if not unlisted:
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    fixed.ir_version = 4
    more = f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else ""
    leniency.notes.append(f"initializer(s) {', '.join(map(repr, unlisted[:3]))}{more} are not "
                          f"graph inputs, which IR version {model.ir_version} requires (read "
                          "as constants, as IR 4 reads them)")
    return fixed


def _outer_names(graph, found: set) -> set:
    """The names a subgraph's nodes read, its own and its outer scope's (a node reading a
    value of the enclosing graph depends on its producer there)."""
    for n in graph.node:
        found.update(n.input)
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _outer_names(g, found)
    return found


def _sorted(model: onnx.ModelProto, leniency: Leniency) -> onnx.ModelProto:
    """``model``, or a copy with its main graph's nodes in topological order: each node
    after its producers, otherwise in the written order.  A graph with a cycle or a value
    nobody produces is returned as it is, for the checker to name."""
    nodes = model.graph.node
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    deps = []
    for n in nodes:
        names = set(n.input)
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _outer_names(g, names)
        deps.append({producer[x] for x in names if x in producer})
    if all(d < k for k, ds in enumerate(deps) for d in ds):
        return model
    import heapq

    waiting = [len(ds) for ds in deps]
    users: list[list[int]] = [[] for _ in nodes]
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):  # a cycle (or a self-loop): the checker names it
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    del fixed.graph.node[:]
    fixed.graph.node.extend(nodes[k] for k in order)
    moved = sum(1 for i, k in enumerate(order) if i != k)
    leniency.notes.append(f"the graph's nodes are not in topological order ({moved} moved; "
                          "sorted as onnxruntime sorts them)")
    return fixed


def prepare(model: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto, Leniency]:
    """(a copy of ``model`` that the checker and strict shape inference accept, what was
    read leniently).  The copy's late ops are local-function calls: pass the inferred
    model to :func:`restore`.  ``model`` itself is returned when nothing is lenient."""
    leniency = Leniency()
    model = _sorted(model, leniency)  # first: the rest index nodes by position
    model = read_declarations(model, leniency)
    model = _initializer_shapes(model, leniency)
    model = _unlisted_initializers(model, leniency)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    late = [] if opset is None else [
        (k, n, since) for k, n in enumerate(model.graph.node)
        if n.domain in ("", "ai.onnx") and (since := first_version(n.op_type, opset))]
    leniency.shapeless = [vi.name for vi in model.graph.output  # (sequences etc. left alone)
                          if vi.type.WhichOneof("value") is None
                          or (vi.type.HasField("tensor_type")
                              and not vi.type.tensor_type.HasField("shape"))]
    ort_only = [(k, n) for k, n in enumerate(model.graph.node)
                if n.domain in ("", "ai.onnx") and n.op_type in ORT_DEFAULT_DOMAIN_OPS
                and not onnx.defs.has(n.op_type)]
    deprecated = [] if opset is None else [
        (k, n) for k, n in enumerate(model.graph.node)
        if n.domain in ("", "ai.onnx") and n.op_type in DEPRECATED_ORT_RUNS
        and _deprecated(n.op_type, opset)]
    if not late and not ort_only and not deprecated and not leniency.shapeless:
        return model, leniency
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for k, node, since in late:
        body = onnx.NodeProto()
        body.CopyFrom(node)
        body.name = ""
        _wrap(fixed, k, node, f"{node.op_type}_v{since}_n{k}", [body], since, leniency)
        leniency.notes.append(f"node {node.name or f'#{k}'!r} ({node.op_type}) is defined "
                              f"from opset {since} on, the model imports opset {opset} (read "
                              f"as {node.op_type}-{since}, its only definition)")
    for k, node in ort_only:
        _wrap(fixed, k, node, f"{node.op_type}_ort_n{k}", ORT_DEFAULT_DOMAIN_OPS[node.op_type](
            node), ORT_BODY_OPSET, leniency)
        leniency.notes.append(f"node {node.name or f'#{k}'!r} ({node.op_type}) is not an ONNX "
                              "op: onnxruntime registers it in the default domain (read as "
                              "onnxruntime's)")
    for k, node in deprecated:
        _wrap(fixed, k, node, f"{node.op_type}_deprecated_n{k}",
              DEPRECATED_ORT_RUNS[node.op_type](node), ORT_BODY_OPSET, leniency)
        leniency.notes.append(f"node {node.name or f'#{k}'!r} ({node.op_type}) is deprecated "
                              f"at opset {opset}, which onnx's checker refuses; onnxruntime "
                              f"runs it (read as {node.op_type}-{opset})")
    if late or ort_only or deprecated:
        fixed.opset_import.append(helper.make_opsetid(LATE_DOMAIN, 1))
    for name in leniency.shapeless:
        leniency.notes.append(f"output {name!r} is declared without a "
                              f"{'shape' if _has_type(fixed, name) else 'type'} (taken "
                              "from shape inference)")
    return fixed, leniency


def _wrap(model: onnx.ModelProto, k: int, node, fname: str, body: list, opset: int,
          leniency: Leniency) -> None:
    """Make graph node ``k`` (``node``) a call of a new local function ``fname`` in
    LATE_DOMAIN whose body is ``body`` (nodes over formal inputs i0.. and outputs o0..)."""
    leniency.wrapped[k] = node
    formal_in = [f"i{j}" for j in range(len(node.input))]
    formal_out = [f"o{j}" for j in range(len(node.output))]
    if len(body) == 1 and body[0].op_type == node.op_type:  # the op itself, renamed
        body[0].input[:] = [f if a else "" for f, a in zip(formal_in, node.input)]
        body[0].output[:] = [f if a else "" for f, a in zip(formal_out, node.output)]
    model.functions.append(helper.make_function(
        LATE_DOMAIN, fname, formal_in, formal_out, body, [helper.make_opsetid("", opset)]))
    call = model.graph.node[k]
    call.op_type, call.domain = fname, LATE_DOMAIN
    del call.attribute[:]


# onnxruntime's own ops in the default domain (``contrib_defs.cc``: kOnnxDomain), which
# onnx has no schema for.  Checker and shape inference see each as a local function whose
# body gives its outputs' types and shapes (not its values); :func:`restore` puts the node
# back and the registry's converter computes it.
ORT_BODY_OPSET = 18


def _simplified_layer_norm_body(node) -> list:
    """Y = X * scale (X's shape and type); inv_std_var = ReduceMean(X * X) over the
    normalised axes, kept (axes axis..rank-1, from X's rank when ``axis`` is positive), in
    float32 for stash_type 1 (onnxruntime's float16 kernel; its float64 one keeps float64,
    which this body does not declare)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    body = [helper.make_node("Mul", ["i0", "i1"], ["o0"])]
    if len(node.output) > 1 and node.output[1]:
        if axis < 0:
            body.append(helper.make_node("Constant", [], ["axes"],
                                         value_ints=list(range(axis, 0))))
        else:
            body += [helper.make_node("Shape", ["i0"], ["shape"]),
                     helper.make_node("Size", ["shape"], ["rank"]),
                     helper.make_node("Constant", [], ["first"], value_int=axis),
                     helper.make_node("Constant", [], ["one"], value_int=1),
                     helper.make_node("Range", ["first", "rank", "one"], ["axes"])]
        stash = next((a.i for a in node.attribute if a.name == "stash_type"), 1)
        body += [helper.make_node("Cast", ["i0"], ["xs"], to=onnx.TensorProto.FLOAT)
                 if stash == 1 else helper.make_node("Identity", ["i0"], ["xs"]),
                 helper.make_node("Mul", ["xs", "xs"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq", "axes"], ["o1"], keepdims=1)]
    return body


ORT_DEFAULT_DOMAIN_OPS = {"SimplifiedLayerNormalization": _simplified_layer_norm_body}

# Default-domain ops onnx marks deprecated at some opsets (its checker then refuses the
# node) that onnxruntime still registers and runs there, with the body that gives checker
# and shape inference their outputs' type and shape: GroupNormalization-18, deprecated by
# onnx 1.16 for its per-group scale (redefined per channel at opset 21), which exporters of
# opsets 18-20 write.
DEPRECATED_ORT_RUNS = {"GroupNormalization": lambda node: [
    helper.make_node("Identity", ["i0"], ["o0"])]}


def _deprecated(op: str, opset: int) -> bool:
    try:
        return bool(onnx.defs.get_schema(op, opset).deprecated)
    except onnx.defs.SchemaError:
        return False


def _has_type(model, name: str) -> bool:
    vi = next(vi for vi in model.graph.output if vi.name == name)
    return vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type != 0


def declare_outputs(model: onnx.ModelProto, inferred: onnx.ModelProto, leniency: Leniency,
                    where: str) -> None:
    """Give ``model``'s shapeless outputs the types shape inference found (``inferred``);
    raise ``ModelError`` naming an output whose element type or rank it could not find."""
    from ..errors import ModelError

    found = {vi.name: vi for vi in inferred.graph.output}
    for vi in model.graph.output:
        if vi.name not in leniency.shapeless:
            continue
        got = found.get(vi.name)
        tt = got.type.tensor_type if got is not None and got.type.HasField("tensor_type") \
            else None
        if tt is None or not tt.elem_type or not tt.HasField("shape"):
            raise ModelError(f"{where}: output {vi.name!r} is declared without a shape and "
                             "shape inference cannot find its element type and rank; declare "
                             "them in the model (dimensions may be symbolic)")
        vi.type.CopyFrom(got.type)


def for_checker(model: onnx.ModelProto, leniency: Leniency) -> onnx.ModelProto:
    """``model`` as ``onnx.checker`` is to see it: without the local functions of late ops
    (the checker refuses a function importing another opset than the model; a call of an
    op in a domain it has no schema for it leaves alone, and shape inference checks the
    function's body)."""
    if not leniency.wrapped:
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [f for f in m.functions if f.domain != LATE_DOMAIN]
    del m.functions[:]
    m.functions.extend(keep)
    return m


def restore(inferred: onnx.ModelProto, leniency: Leniency) -> onnx.ModelProto:
    """``inferred`` with the local-function calls :func:`prepare` made put back as the
    original nodes (and those functions and their domain dropped)."""
    if not leniency.wrapped:
        return inferred
    for k, node in leniency.wrapped.items():
        inferred.graph.node[k].CopyFrom(node)
    keep = [f for f in inferred.functions if f.domain != LATE_DOMAIN]
    del inferred.functions[:]
    inferred.functions.extend(keep)
    ops = [o for o in inferred.opset_import if o.domain != LATE_DOMAIN]
    del inferred.opset_import[:]
    inferred.opset_import.extend(ops)
    return inferred
