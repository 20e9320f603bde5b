"""Relax (after kernel grouping) -> the runtime's graph: kernel calls over planned tensors.

After FuseTIR, ``main`` is a straight line of ``call_tir`` bindings (plus reshapes,
tuples and constants).  This module turns it into the graph format ``runtime/session.py``
documents, assigns every intermediate tensor to an arena buffer (sharing a dying
input's buffer where :mod:`compiler.inplace` allows it, and sharing storage for
reshapes, which are views), computes buffer lifetimes and calls the memory planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from compiler.frontend import shape_arith
from runtime.artifact import PARAM_ALIGN  # the loader maps params in place: keep them aligned
from runtime.dims import ShapeExpr, call_kernels
from runtime.memory_plan import MemoryPlan, MemoryPlanner
from schedules import flops

from passes.place_concat import ALIGN, CONCAT_ATTR
from passes.relax_util import element_count
from passes.seq_major_cache import KV_ATTR, TO_SEQ_MAJOR

from ..errors import UnsupportedError
from .provenance import nodes_of_binding
from .inplace import ROWS_ONCE, inplace_candidates
from .symbolic import expr_text, monotone


@dataclass
class Tensor:
    name: str
    shape: list                # ints, and expression texts of symbolic dims (symbolic.py)
    dtype: str
    kind: str                  # "input" | "param" | "intermediate"
    base: int | None = None    # for a reshape view: the tensor whose storage it shares
    param: np.ndarray | None = None
    layout: str | None = None  # compiler/lowering/layouts.py; None = the ONNX layout
    size: str | int | None = None  # element count as an expression (symbolic shapes only)
    offset: str | None = None  # bytes into its base's storage, an expression of the dims
                               # (a key/value cache's new rows: place_kv_caches)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def nbytes_at(self, binding: dict) -> int:
        """Bytes with the symbolic dims bound (``binding``: {dim name: value})."""
        if self.static:
            return self.nbytes
        return int(np.prod(ShapeExpr(self.shape, binding)(binding), dtype=np.int64)) * \
            np.dtype(self.dtype).itemsize

    @property
    def size_key(self):
        """What two tensors of equal size share: the byte count, or the size expression."""
        return self.nbytes if self.static else (self.size, np.dtype(self.dtype).itemsize)


@dataclass
class KernelGraph:
    """The extracted graph before it is serialised; see ``to_meta``."""

    tensors: list = field(default_factory=list)
    calls: list = field(default_factory=list)      # dicts: kernel, args, num_outputs, ops, nodes
    inputs: list = field(default_factory=list)     # (name, tensor id)
    outputs: list = field(default_factory=list)    # (name, tensor id)
    prim_funcs: dict = field(default_factory=dict) # kernel symbol -> PrimFunc (unscheduled)
    flops: dict = field(default_factory=dict)      # kernel symbol -> floating-point ops per call
    groups: dict = field(default_factory=dict)     # fused call's binding -> [ONNX node index]
    onnx_nodes: list = field(default_factory=list) # [(node name, op type)] of the model
    checked: dict = field(default_factory=dict)    # "<kernel>__checked" -> PrimFunc
    onnx_outputs: list = field(default_factory=list)  # [[output tensor name]] per ONNX node
    dim_names: list = field(default_factory=list)  # symbolic input dims, in first-use order
    # {dim: (largest value, why)}: a dim the model is valid only up to (the import's Slice
    # bounds, frontend/shape_arith.check_slice_bounds); the driver narrows its range
    dim_caps: dict = field(default_factory=dict)
    # concats by placement (place_concats): tensor -> (group id, byte offset in the group)
    placed: dict = field(default_factory=dict)
    concats: dict = field(default_factory=dict)    # {"placed": [...], "kernels": [...]}
    # key/value caches stored sequence-major (place_kv_caches): input / output name ->
    # the permutation that shows the stored tensor in the model's layout
    perms: dict = field(default_factory=dict)
    kv_caches: dict = field(default_factory=dict)  # {"placed": [...], "kept": [...]}
    # input name -> bytes of alignment the kernels assume of its data (input_alignment.py)
    input_align: dict = field(default_factory=dict)
    # what a run's dims must satisfy beyond their ranges: a symbolic reshape's element
    # counts ({"what", "lhs", "rhs"}, expression texts), checked when the dims are bound
    checks: list = field(default_factory=list)

    def add(self, t: Tensor) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1


def _sinfo_tensor(sinfo, name: str, where: str, names=()) -> tuple[list, str]:
    """(shape, dtype) of a tensor type: ints, and expression texts of the input dims
    ``names`` (``symbolic.expr_text``); a shape the runtime could not evaluate is refused."""
    shape = sinfo.shape
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        raise UnsupportedError(f"{where}: tensor {name!r} has no known shape after import "
                               "(its rank or dims depend on input values)")
    dims = [expr_text(d, names, f"{where}: tensor {name!r}") for d in shape.values]
    return dims, str(sinfo.dtype)


def _new_tensor(sinfo, name: str, kind: str, where: str, names, **kw) -> Tensor:
    shape, dtype = _sinfo_tensor(sinfo, name, where, names)
    t = Tensor(name, shape, dtype, kind, **kw)
    if not t.static:
        size = element_count(sinfo.shape.values)
        if not monotone(size):
            # within the dims' declared ranges (the only values a run may take), where
            # min / max of a slice usually resolve (wav2vec2's positional conv trimmed to
            # min(max(n, 0), n + 1) frames: n when the samples give a frame)
            size = shape_arith.analyzer(size).simplify(size)
        if not monotone(size):
            raise UnsupportedError(
                f"{where}: tensor {name!r} has {size} elements, which can shrink as a dim "
                "grows; the arena planned at the dims' maxima would not hold it")
        t.size = expr_text(size, names, f"{where}: tensor {name!r}")
    return t


def extract(mod, input_names: list, output_names: list, where: str = "model",
            groups: dict | None = None, nodes: list | None = None) -> KernelGraph:
    """Walk ``mod["main"]`` (after kernel grouping) into a :class:`KernelGraph`.

    ``groups`` ({fused call's binding name: [node index]}) and ``nodes`` ([(name, op_type)] of the ONNX
    graph) let every call name the ONNX nodes it computes.
    """
    g = KernelGraph()
    g.groups, g.onnx_nodes = groups or {}, nodes or []
    func = mod["main"]
    for p in func.params:  # the symbolic input dims, in first-use order
        for d in getattr(p.ty.shape, "values", None) or ():
            if isinstance(d, tvm.tirx.Var) and d.name not in g.dim_names:
                g.dim_names.append(d.name)
    env: dict = {}          # relax Var -> tensor id or tuple of ids
    consts: dict = {}       # id(Constant handle) -> tensor id

    def tid_of(expr):
        if isinstance(expr, relax.Var):
            return env[expr]
        if isinstance(expr, GenericConst):
            key = hash(expr)  # object identity: the same constant used twice is one param
            if key not in consts:
                data = expr.value.numpy()
                consts[key] = g.add(Tensor(f"const{len(consts)}", list(data.shape),
                                           str(data.dtype), "param", param=data))
            return consts[key]
        if isinstance(expr, relax.Tuple):
            return tuple(tid_of(f) for f in expr.fields)
        raise UnsupportedError(f"{where}: the graph runtime cannot take {type(expr).__name__} "
                               f"as a value ({expr})")

    for name, p in zip(input_names, func.params):
        env[p] = g.add(_new_tensor(p.ty, name, "input", where, g.dim_names))
        g.inputs.append((name, env[p]))

    for block in func.body.blocks:
        for b in block.bindings:
            env[b.var] = _binding(g, b, tid_of, mod, where)

    result = tid_of(func.body.body)
    result = result if isinstance(result, tuple) else (result,)
    if len(result) != len(output_names):
        raise UnsupportedError(f"{where}: the model has {len(output_names)} outputs but the "
                               f"compiled graph returns {len(result)}")
    g.outputs = list(zip(output_names, result))
    place_kv_caches(g)
    place_concats(g)
    return g


def _binding(g: KernelGraph, b, tid_of, mod, where: str):
    v, name, names = b.value, b.var.name, g.dim_names
    if isinstance(v, (relax.Var, GenericConst, relax.Tuple)):
        return tid_of(v)
    if isinstance(v, relax.TupleGetItem):
        return tid_of(v.tuple_value)[v.index]
    if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
        if v.op.name == "relax.call_tir":
            return _call_tir(g, v, name, tid_of, mod, where)
        if v.op.name == "relax.reshape":
            src = tid_of(v.args[0])
            base = g.tensors[src]
            if base.kind == "param":  # a reshaped weight: a param of its own
                shape, dtype = _sinfo_tensor(v.ty, name, where)
                return g.add(Tensor(name, shape, dtype, "param",
                                    param=base.param.reshape(shape)))
            _check_elements(g, v, name, where)
            return g.add(_new_tensor(v.ty, name, "intermediate", where, names, base=src))
        raise UnsupportedError(f"{where}: operator {v.op.name} (binding {name!r}) was not "
                               "lowered to a kernel; the graph runtime cannot run it")
    raise UnsupportedError(f"{where}: binding {name!r} ({type(v).__name__}) cannot run in "
                           "the graph runtime")


def _check_elements(g: KernelGraph, v, name: str, where: str) -> None:
    """A reshape between symbolic shapes whose element counts are not provably equal (a
    target computed from another input's shape): the run checks them once the dims are
    bound (``runtime/session.py``), so a feed that breaks the model's assumption is an
    error naming the node, not a view over too few or too many elements."""
    from tvm.sym.analyzer import Analyzer

    a, b = element_count(v.args[0].ty.shape.values), element_count(v.ty.shape.values)
    if Analyzer().can_prove_equal(a, b):
        return
    nodes = [g.onnx_nodes[k] for k in nodes_of_binding(name) if k < len(g.onnx_nodes)]
    what = (f"node {nodes[0][0]!r} ({nodes[0][1]})" if nodes else f"binding {name!r}")
    g.checks.append({"what": f"{what}: reshape of {v.args[0].ty.shape} to {v.ty.shape}",
                     "lhs": expr_text(a, g.dim_names, f"{where}: {what}"),
                     "rhs": expr_text(b, g.dim_names, f"{where}: {what}")})


def _call_tir(g: KernelGraph, call, name: str, tid_of, mod, where: str):
    gv, args = call.args[0], call.args[1]
    # integer arguments computed from the dims: scalars a legalization passes (a slice end
    # of ``seq``) and the dims a kernel cannot read off its buffers (call_tir's tir_vars);
    # [position in the kernel's arguments, expression text]
    fields = list(args.fields) if isinstance(args, relax.Tuple) else [args]
    scalars, ins = [], []
    for pos, a in enumerate(fields):
        if isinstance(getattr(a, "ty", None), tvm.ir.PrimType) and tvm.ir.is_prim_expr(a):
            scalars.append([pos, expr_text(a, g.dim_names, f"{where}: kernel {gv.name_hint}")])
        else:
            ins.append(tid_of(a))
    sinfo = call.ty
    out_infos = list(sinfo.fields) if isinstance(sinfo, relax.TupleType) else [sinfo]
    outs = []
    for k, si in enumerate(out_infos):
        outs.append(g.add(_new_tensor(si, f"{name}.{k}" if len(out_infos) > 1 else name,
                                      "intermediate", where, g.dim_names)))
    first = len(fields) + len(outs)
    scalars += [[first + k, expr_text(d, g.dim_names, f"{where}: kernel {gv.name_hint}")]
                for k, d in enumerate(call.args[2].values if len(call.args) > 2 else ())]
    symbol = gv.name_hint
    if symbol not in g.prim_funcs:
        g.prim_funcs[symbol] = mod[gv]
        g.flops[symbol] = flops.estimate(mod[gv])
    idx = g.groups.get(name)
    if idx is None:
        idx = nodes_of_binding(name)
    covered = [g.onnx_nodes[k] for k in idx if k < len(g.onnx_nodes)]
    ops = sorted({op for _, op in covered})
    concat_axis = g.prim_funcs[symbol].attrs.get(CONCAT_ATTR) \
        if g.prim_funcs[symbol].attrs is not None else None
    kv = g.prim_funcs[symbol].attrs.get(KV_ATTR) \
        if g.prim_funcs[symbol].attrs is not None else None
    g.calls.append({"kernel": symbol, "args": ins + outs, "num_outputs": len(outs),
                    "nodes": [n for n, _ in covered], "ops": "+".join(ops) or symbol,
                    "flops": g.flops[symbol], **({"scalars": scalars} if scalars else {}),
                    **({"concat": int(concat_axis)} if concat_axis is not None else {}),
                    **({"kv": str(kv)} if kv is not None else {})})
    return tuple(outs) if isinstance(sinfo, relax.TupleType) else outs[0]


def _flops(func, binding: dict | None = None) -> int:
    """``schedules.flops.estimate`` of ``func`` with its symbolic extents bound from
    ``binding`` ({dim name: value}) first; 0 if it has none or cannot be read."""
    try:
        if binding:
            func = bind_dims(func, binding)
    except Exception:  # estimation is best effort: a kernel it cannot bind reports 0
        return 0
    return flops.estimate(func)


def bind_dims(func, binding: dict):
    """``func`` with its symbolic dims (the Vars of its parameters' shapes, and its scalar
    parameters, named in ``binding``) replaced by their values everywhere (shapes, loop
    extents, indices); a shape of ``batch * seq`` too, which ``PrimFunc.specialize``
    refuses for a buffer (it binds buffers of independent Vars only)."""
    import tvm_ffi

    scalars = {p: tvm.tirx.IntImm(str(p.ty), int(binding[p.name])) for p in func.params
               if p.name in binding and getattr(p.ty, "shape", None) is None}
    if scalars:
        func = func.specialize(scalars)
    dims = []
    for p in func.params:
        for d in (getattr(p.ty, "shape", None) or ()):
            dims += [v for v in tvm.tirx.analysis.undefined_vars(d) if v.name in binding]

    def bound(v, _):
        for d in dims:
            if v.same_as(d):
                return tvm.tirx.IntImm(str(v.ty), int(binding[v.name]))
        return v

    return tvm_ffi.structural_mutate(func, [(tvm.tirx.Var, bound)]) if dims else func


def flops_at(g: KernelGraph, binding: dict) -> None:
    """Every kernel's FLOPs (and each call's) with the symbolic dims bound: the report's
    kernel table describes the model at the dims' ``opt`` values.  A call of a kernel whose
    extents use dims also records ``flops_at``, {dim: value} of those it was counted at: a
    profiled run at other values knows its FLOPs are not that count."""
    uses = {}
    for symbol, func in g.prim_funcs.items():
        g.flops[symbol] = _flops(func, binding)
        uses[symbol] = {d: binding[d] for d in _dims_of(func) if d in binding}
    for call in g.calls:
        call["flops"] = g.flops[call["kernel"]]
        if uses[call["kernel"]]:
            call["flops_at"] = uses[call["kernel"]]


def _dims_of(func) -> set:
    """Names of the symbolic dims ``func``'s parameters' shapes and scalar parameters use."""
    names = set()
    for p in func.params:
        shape = getattr(p.ty, "shape", None)
        if shape is None:
            names.add(p.name)
            continue
        for d in shape:
            names.update(v.name for v in tvm.tirx.analysis.undefined_vars(d))
    return names


# -- storage -----------------------------------------------------------------------------
def _root(g: KernelGraph, t: int) -> int:
    while g.tensors[t].base is not None:
        t = g.tensors[t].base
    return t


def place_kv_caches(g: KernelGraph) -> None:
    """Key/value caches appended in place (``passes/seq_major_cache.py`` marked them).

    A ``kv_past`` call (``past_sm = permute(past)``) whose input is a model input read by
    nothing else is dropped: the model input *is* ``past_sm``, stored ``[P, B, H, D]``, and the
    runtime shows it as ``[B, H, P, D]`` (``g.perms``: it copies a caller's array in through
    that permutation).  A ``kv_append`` call (``present_sm = concat(past_sm, new_sm)``) whose
    ``past_sm`` is such an input, whose ``present_sm`` is a model output and whose ``new_sm``
    one kernel writes is dropped too: ``present_sm`` is a view of ``past_sm``'s storage and
    ``new_sm`` one at byte ``P * row`` of it (an offset expression of the dims), so the
    producer of the new rows writes them after the past and nothing copies the cache.  The
    input's buffer is sized for ``present_sm`` at the dims' maxima.  A call that cannot be
    dropped stays a kernel (a transpose copy, or a concat into its own buffer): correct,
    copying, and reported with its reason in ``g.kv_caches``.
    """
    inputs = {t: n for n, t in g.inputs}
    outputs = {}
    for n, t in g.outputs:
        outputs.setdefault(t, []).append(n)
    readers: dict = {}
    writers: dict = {}
    for k, call in enumerate(g.calls):
        nin = len(call["args"]) - call["num_outputs"]
        for t in call["args"][:nin]:
            readers.setdefault(t, []).append(k)
        for t in call["args"][nin:]:
            writers.setdefault(t, []).append(k)
    stored: dict = {}   # past_sm tensor -> model input name
    drop, placed, kept = set(), [], []
    for k, call in enumerate(g.calls):
        if call.get("kv") != "past":
            continue
        i, o = call["args"]
        if i not in inputs or readers.get(i) != [k] or i in outputs:
            kept.append({"nodes": call["nodes"], "reason": "past is read by other kernels"})
            continue
        name = inputs[i]
        g.inputs = [(n, o if t == i else t) for n, t in g.inputs]
        g.tensors[o].kind = "input"
        g.tensors[i].base = o  # the model's [B, H, P, D] tensor: unused, shares the storage
        g.perms[name] = [TO_SEQ_MAJOR.index(a) for a in range(4)]
        stored[o] = name
        drop.add(k)
    for k, call in enumerate(g.calls):
        if call.get("kv") != "append":
            continue
        past, new, present = call["args"]
        out_names = outputs.get(present, [])
        for n in out_names:
            g.perms[n] = [TO_SEQ_MAJOR.index(a) for a in range(4)]
        reason = None
        if past not in stored:
            reason = "past is not stored sequence-major"
        elif len(out_names) != 1:
            reason = "present is not one model output"
        elif len(writers.get(new, ())) != 1 or new in inputs or new in outputs or \
                g.tensors[new].base is not None or g.tensors[new].kind != "intermediate":
            reason = "the new rows are not one kernel's output"
        if reason is not None:
            kept.append({"nodes": call["nodes"], "reason": reason})
            continue
        pt = g.tensors[past]
        g.tensors[present].base = past
        g.tensors[new].base = past
        itemsize = np.dtype(pt.dtype).itemsize
        g.tensors[new].offset = "*".join(f"({d})" for d in pt.shape) + f"*{itemsize}"
        placed.append({"input": stored[past], "output": out_names[0], "nodes": call["nodes"]})
        drop.add(k)
    if not drop:
        g.kv_caches = {"placed": placed, "kept": kept} if kept else {}
        return
    for call in g.calls:
        call.pop("kv", None)
    g.calls = [c for k, c in enumerate(g.calls) if k not in drop]
    used = {c["kernel"] for c in g.calls}
    for symbol in [s for s in g.prim_funcs if s not in used]:
        del g.prim_funcs[symbol]
        g.flops.pop(symbol, None)
    g.kv_caches = {"placed": placed, "kept": kept}


# kernels assume 64-byte aligned buffers (as the params payload keeps them); the pass
# already refuses unaligned inputs, so this is a guard for the group offsets
PLACE_ALIGN = ALIGN


def place_concats(g: KernelGraph) -> None:
    """Concat by placement: drop each concat call that ``passes/place_concat.py`` marked
    when its inputs can live inside its output's storage, at their offsets.

    A placed concat is a set of constraints ``pos(input_j) = pos(output) + offset_j`` (the
    axis is the first non-unit one, so ``offset_j`` is the bytes of the inputs before it);
    constraints that share a tensor join one *group*, whose members sit at fixed offsets in
    one arena buffer (DenseNet: one buffer per dense block, ``[x0 | f1 | f2 | ...]``, every
    concat of the block a prefix of it).  Concats are taken in call order; one is refused
    (kept as a kernel, unfused) when an input's storage is a model input, a param or a model
    output, when its output is a model output or symbolic, when a tensor would sit at two
    offsets of its group, when two *leaves* (members written by a kernel, not themselves
    placed concat outputs) would overlap, or when an offset is not 64-byte aligned.  Leaves
    are disjoint and each written once by its producer before any concat that holds it is
    read; placed outputs are read only, and ``plan_storage`` gives no member's storage to an
    in-place output, so no byte of a group is written twice in a run.

    Sets ``g.placed`` ({tensor root: (group, byte offset)}) and ``g.concats`` (the placed
    and the kept concats, with the reason, for the report); unused kernels are dropped.
    """
    io_roots = {_root(g, t): "model input" for _, t in g.inputs}
    io_roots.update({_root(g, t): "model output" for _, t in g.outputs})
    groups: dict = {}       # tensor -> its group's {tensor: byte offset} (a shared dict)
    outs: set = set()       # outputs of placed concats (views over their leaves)
    kept_calls, placed, kept = [], [], []
    for call in g.calls:
        if "concat" not in call:
            kept_calls.append(call)
            continue
        del call["concat"]
        members, reason = _place(g, call, groups, outs, io_roots)
        entry = {"nodes": call["nodes"], "output": g.tensors[call["args"][-1]].name}
        if reason is not None:
            kept_calls.append(call)
            kept.append({**entry, "reason": reason})
            continue
        for t in members:
            groups[t] = members
        outs.add(call["args"][-1])
        placed.append({**entry, "inputs": len(call["args"]) - 1,
                       "bytes": g.tensors[call["args"][-1]].nbytes})
    g.calls = kept_calls
    ids: dict = {}          # id(group dict) -> group number
    for t, members in groups.items():
        low = min(members.values())
        g.placed[t] = (ids.setdefault(id(members), len(ids)), members[t] - low)
    used = {c["kernel"] for c in g.calls}
    for symbol in [s for s in g.prim_funcs if s not in used]:
        del g.prim_funcs[symbol]
        g.flops.pop(symbol, None)
    g.concats = {"placed": placed, "kernels": kept}


def _place(g: KernelGraph, call: dict, groups: dict, outs: set, io_roots: dict):
    """(the merged group's {tensor: offset}, None) if ``call``'s concat can be placed, else
    (None, why not)."""
    ins, o = call["args"][:-1], call["args"][-1]
    if call["num_outputs"] != 1 or g.tensors[o].base is not None:
        return None, "not a one-output concat"
    if io_roots.get(o):
        return None, f"its output is a {io_roots[o]}"
    if not g.tensors[o].static:
        return None, "symbolic shape"
    members, off = {o: 0}, 0
    for i in ins:
        r = _root(g, i)
        name = g.tensors[i].name
        if g.tensors[r].kind == "param":
            return None, f"input {name!r} is a constant"
        if r in io_roots:
            return None, f"input {name!r} is a {io_roots[r]}"
        if g.tensors[r].nbytes != g.tensors[i].nbytes or off % PLACE_ALIGN:
            return None, f"input {name!r} would start at byte {off}, not {PLACE_ALIGN}-aligned"
        group = groups.get(r, {r: off})
        shift = off - group[r]
        for t, x in group.items():
            if members.setdefault(t, x + shift) != x + shift:
                return None, (f"tensor {g.tensors[t].name!r} would sit at two offsets "
                              f"({members[t]} and {x + shift}) of one buffer")
        off += g.tensors[i].nbytes
    spans = sorted((x, x + g.tensors[t].nbytes, t) for t, x in members.items()
                   if t != o and t not in outs)
    for (a0, a1, ta), (b0, b1, tb) in zip(spans, spans[1:]):
        if b0 < a1:
            return None, (f"tensors {g.tensors[ta].name!r} and {g.tensors[tb].name!r} would "
                          "overlap in one buffer")
    low = min(members.values())
    if any((x - low) % PLACE_ALIGN for x in members.values()):
        return None, f"a member would not be {PLACE_ALIGN}-byte aligned in its buffer"
    return members, None


def _rows_once(call: dict, rules: dict) -> bool:
    """Whether every kernel the call may run (its row variants too) was scheduled by a rule
    that computes each row's reductions once (``inplace.ROWS_ONCE``)."""
    return all(rules.get(k) in ROWS_ONCE for k in call_kernels(call))


def plan_storage(g: KernelGraph, reuse: bool = True, dims: list | None = None,
                 rules: dict | None = None) -> tuple[dict, MemoryPlan]:
    """Assign tensors to arena buffers and params, plan the arena.

    Steps: inputs are written at step 0, call k runs at step k+1, outputs are read at
    step len(calls)+1.  Returns (graph meta for the artifact, memory plan); the params
    payload is ``meta["params_payload"]`` (popped by the caller).

    Symbolic shapes: ``dims`` ([{name, min, max, opt, declared}], ``symbolic.resolve_ranges``)
    gives each dim's range; every buffer is sized with the dims at their maxima.  Its offsets
    hold for any smaller binding because every size is monotone in the dims (checked when
    the tensor was extracted: ``symbolic.monotone``) and lifetimes do not depend on them.
    An in-place output shares a buffer only with an input of the same size expression.
    ``rules`` ({kernel: the rule that scheduled it}) lets a softmax run in place where its
    rule computes each row's reductions once (``inplace.ROWS_ONCE``).
    """
    at_max = {d["name"]: d["max"] for d in dims or ()}
    n = len(g.tensors)
    end = len(g.calls) + 1
    first = [0] * n
    last = [-1] * n
    for step, call in enumerate(g.calls, start=1):
        for t in call["args"][len(call["args"]) - call["num_outputs"]:]:
            first[t] = step
        for t in call["args"][:len(call["args"]) - call["num_outputs"]]:
            last[t] = max(last[t], step)
    for _, t in g.outputs:
        last[t] = end
    for t in range(n):  # a view's reads keep its storage alive; views may chain
        tt = g.tensors[t]
        if tt.base is not None and tt.kind != "param":
            first[t] = max(first[t], first[tt.base])
    for t in reversed(range(n)):
        if g.tensors[t].base is not None:
            last[g.tensors[t].base] = max(last[g.tensors[t].base], last[t])

    buffer_of: dict = {}      # root tensor -> buffer index
    buffers: list = []        # [nbytes, first, last]
    for name, t in g.inputs:
        buffer_of[t] = len(buffers)
        # a sequence-major cache's input holds present too (views of its storage)
        nbytes = max(g.tensors[v].nbytes_at(at_max) for v in range(n) if _root(g, v) == t)
        buffers.append([nbytes, 0, max(last[t], 0)])
    # concats by placement: one buffer per group, live from its first member's write to its
    # last member's read (members that no call writes, the placed outputs, add no start)
    written = {t for c in g.calls for t in c["args"][len(c["args"]) - c["num_outputs"]:]}
    group_buffer: dict = {}   # group -> buffer index
    for t, (grp, off) in sorted(g.placed.items()):
        if grp not in group_buffer:
            group_buffer[grp] = len(buffers)
            buffers.append([0, end, 0])
        buf = buffers[group_buffer[grp]]
        buf[0] = max(buf[0], off + g.tensors[t].nbytes)
        if t in written:
            buf[1] = min(buf[1], first[t])
        buf[2] = max(buf[2], last[t])
        buffer_of[t] = group_buffer[grp]
    inplace_cache: dict = {}
    model_inputs = {t for _, t in g.inputs}
    for step, call in enumerate(g.calls, start=1):
        nin = len(call["args"]) - call["num_outputs"]
        ins, outs = call["args"][:nin], call["args"][nin:]
        if reuse and call["kernel"] not in inplace_cache:
            # scalar arguments shift the kernel's parameters: no in-place for those
            inplace_cache[call["kernel"]] = [] if call.get("scalars") else \
                inplace_candidates(g.prim_funcs[call["kernel"]], nin,
                                   rows_once=_rows_once(call, rules or {}))
        taken = set()
        for o_idx, o in enumerate(outs):
            if o in g.placed:  # written in place of its group's buffer: nothing to choose
                continue
            if g.tensors[o].base is not None:  # a cache's new rows, inside the input's buffer
                continue
            chosen = None
            for i_idx, oo in inplace_cache.get(call["kernel"], []) if reuse else []:
                if oo != o_idx:
                    continue
                i = ins[i_idx]
                r = _root(g, i)
                # the kernel may read no other view of this storage
                # nor a placed concat's member: its neighbours in the buffer stay live;
                # nor a model input's: the runtime would first copy the caller's array into
                # the arena (to leave it untouched), a whole extra pass, where a buffer of
                # its own only costs arena bytes (a [8, 1500, 1500] softmax fed directly:
                # 10 -> 23 ms with the copy)
                if (g.tensors[r].kind == "param" or r not in buffer_of or buffer_of[r] in taken
                        or r in g.placed or r in model_inputs
                        or sum(_root(g, a) == r for a in ins) > 1):
                    continue
                buf = buffers[buffer_of[r]]
                if buf[2] == step and g.tensors[r].size_key == g.tensors[o].size_key:
                    chosen = buffer_of[r]
                    break
            if chosen is None:
                chosen = len(buffers)
                buffers.append([g.tensors[o].nbytes_at(at_max), step, last[o]])
            buffers[chosen][2] = max(buffers[chosen][2], last[o], step)
            buffer_of[o] = chosen
            taken.add(chosen)
            call.setdefault("inplace", [])
            if buffers[chosen][1] != step:
                call["inplace"].append(o_idx)

    planner = MemoryPlanner(alignment=64)
    for k, (nbytes, f, l) in enumerate(buffers):
        planner.add(nbytes, f, max(l, f), name=f"buf{k}")
    plan = planner.plan(reuse=reuse)

    params, size = [], 0
    for tt in g.tensors:  # offsets first, then one copy of each param into the payload
        if tt.kind == "param":
            size += (-size) % PARAM_ALIGN
            params.append({"offset": size, "nbytes": tt.param.nbytes})
            size += tt.param.nbytes
    payload = np.zeros(size, np.uint8)
    tensors, k = [], 0
    for t, tt in enumerate(g.tensors):
        if tt.kind == "param":
            at = params[k]["offset"]
            payload[at:at + tt.param.nbytes] = \
                np.ascontiguousarray(tt.param).reshape(-1).view(np.uint8)
            tensors.append({"name": tt.name, "shape": tt.shape, "dtype": tt.dtype,
                            "storage": "param", "index": k})
            k += 1
        else:
            r = _root(g, t)
            offset = g.placed[r][1] if r in g.placed else (tt.offset or 0)
            tensors.append({"name": tt.name, "shape": tt.shape, "dtype": tt.dtype,
                            "storage": "arena", "index": buffer_of[r],
                            **({"offset": offset} if offset else {}),
                            **({"layout": tt.layout} if tt.layout else {})})
    meta = {
        "tensors": tensors,
        # perm: a sequence-major cache, shown to callers as tensor.transpose(perm)
        # align: what the kernels assume of the input's data (none given: 64)
        "inputs": [{"name": n, "tensor": t, **({"perm": g.perms[n]} if n in g.perms else {}),
                    **({"align": g.input_align[n]} if n in g.input_align else {})}
                   for n, t in g.inputs],
        "outputs": [{"name": n, "tensor": t, **({"perm": g.perms[n]} if n in g.perms else {})}
                    for n, t in g.outputs],
        "calls": g.calls,
        "params": params,
        "buffers": [{"nbytes": b[0], "first_use": b[1], "last_use": b[2]} for b in buffers],
        # concats by placement: no call, their inputs written in place (place_concats)
        **({"placed_concats": g.concats["placed"]} if g.concats.get("placed") else {}),
        **({"kv_caches": g.kv_caches["placed"]} if g.kv_caches.get("placed") else {}),
        "params_payload": payload,  # uint8 array (bytes-like)
        **({"dims": list(dims)} if dims else {}),
        **({"checks": g.checks} if g.checks else {}),
    }
    return meta, plan
