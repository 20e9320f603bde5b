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

from runtime.artifact import PARAM_ALIGN  # the loader maps params in place: keep them aligned
from runtime.dims import ShapeExpr
from runtime.memory_plan import MemoryPlan, MemoryPlanner
from schedules import flops

from ..errors import UnsupportedError
from .provenance import nodes_of_binding
from .inplace import inplace_candidates
from .symbolic import expr_text, monotone, size_expr


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
        size = size_expr(sinfo.shape.values)
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
            return g.add(_new_tensor(v.ty, name, "intermediate", where, names, base=src))
        raise UnsupportedError(f"{where}: operator {v.op.name} (binding {name!r}) was not "
                               "lowered to a kernel; the graph runtime cannot run it")
    raise UnsupportedError(f"{where}: binding {name!r} ({type(v).__name__}) cannot run in "
                           "the graph runtime")


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
    g.calls.append({"kernel": symbol, "args": ins + outs, "num_outputs": len(outs),
                    "nodes": [n for n, _ in covered], "ops": "+".join(ops) or symbol,
                    "flops": g.flops[symbol], **({"scalars": scalars} if scalars else {})})
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
    """``func`` with its symbolic dims (the Vars named in ``binding``) replaced by values:
    each buffer parameter of a symbolic shape specialised to a buffer of the bound one."""
    from runtime.dims import ShapeExpr

    from .symbolic import expr_text

    pmap = {}
    for p in func.params:
        shape = getattr(p.ty, "shape", None) if hasattr(p.ty, "shape") else None
        if not shape or all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            continue
        texts = [expr_text(d, binding, "flops") for d in shape]
        values = ShapeExpr(texts, binding)(binding)
        pmap[p] = tvm.tirx.decl_buffer(
            [d if isinstance(d, tvm.tirx.IntImm) else tvm.tirx.IntImm("int64", int(v))
             for d, v in zip(shape, values)], p.ty.dtype)
    return func.specialize(pmap) if pmap else func


def flops_at(g: KernelGraph, binding: dict) -> None:
    """Every kernel's FLOPs (and each call's) with the symbolic dims bound: the report's
    kernel table describes the model at the dims' ``opt`` values."""
    for symbol, func in g.prim_funcs.items():
        g.flops[symbol] = _flops(func, binding)
    for call in g.calls:
        call["flops"] = g.flops[call["kernel"]]


# -- storage -----------------------------------------------------------------------------
def _root(g: KernelGraph, t: int) -> int:
    while g.tensors[t].base is not None:
        t = g.tensors[t].base
    return t


def plan_storage(g: KernelGraph, reuse: bool = True, dims: list | None = None
                 ) -> tuple[dict, MemoryPlan]:
    """Assign tensors to arena buffers and params, plan the arena.

    Steps: inputs are written at step 0, call k runs at step k+1, outputs are read at
    step len(calls)+1.  Returns (graph meta for the artifact, memory plan); the params
    payload is ``meta["params_payload"]`` (popped by the caller).

    Symbolic shapes: ``dims`` ([{name, min, max, opt, declared}], ``symbolic.resolve_ranges``)
    gives each dim's range; every buffer is sized with the dims at their maxima.  Its offsets
    hold for any smaller binding because every size is monotone in the dims (checked when
    the tensor was extracted: ``symbolic.monotone``) and lifetimes do not depend on them.
    An in-place output shares a buffer only with an input of the same size expression.
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
        buffers.append([g.tensors[t].nbytes_at(at_max), 0, max(last[t], 0)])
    inplace_cache: dict = {}
    for step, call in enumerate(g.calls, start=1):
        nin = len(call["args"]) - call["num_outputs"]
        ins, outs = call["args"][:nin], call["args"][nin:]
        if reuse and call["kernel"] not in inplace_cache:
            # scalar arguments shift the kernel's parameters: no in-place for those
            inplace_cache[call["kernel"]] = [] if call.get("scalars") else \
                inplace_candidates(g.prim_funcs[call["kernel"]], nin)
        taken = set()
        for o_idx, o in enumerate(outs):
            chosen = None
            for i_idx, oo in inplace_cache.get(call["kernel"], []) if reuse else []:
                if oo != o_idx:
                    continue
                i = ins[i_idx]
                r = _root(g, i)
                # the kernel may read no other view of this storage
                if (g.tensors[r].kind == "param" or r not in buffer_of or buffer_of[r] in taken
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

    params, payload = [], bytearray()
    tensors = []
    for t, tt in enumerate(g.tensors):
        if tt.kind == "param":
            data = np.ascontiguousarray(tt.param)
            payload += b"\0" * ((-len(payload)) % PARAM_ALIGN)
            params.append({"offset": len(payload), "nbytes": data.nbytes})
            payload += data.tobytes()
            tensors.append({"name": tt.name, "shape": tt.shape, "dtype": tt.dtype,
                            "storage": "param", "index": len(params) - 1})
        else:
            r = _root(g, t)
            tensors.append({"name": tt.name, "shape": tt.shape, "dtype": tt.dtype,
                            "storage": "arena", "index": buffer_of[r],
                            **({"layout": tt.layout} if tt.layout else {})})
    meta = {
        "tensors": tensors,
        "inputs": [{"name": n, "tensor": t} for n, t in g.inputs],
        "outputs": [{"name": n, "tensor": t} for n, t in g.outputs],
        "calls": g.calls,
        "params": params,
        "buffers": [{"nbytes": b[0], "first_use": b[1], "last_use": b[2]} for b in buffers],
        "params_payload": bytes(payload),
        **({"dims": list(dims)} if dims else {}),
    }
    return meta, plan
