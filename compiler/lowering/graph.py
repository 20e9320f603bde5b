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
from runtime.memory_plan import MemoryPlan, MemoryPlanner
from schedules import flops

from ..errors import UnsupportedError
from .provenance import nodes_of_binding
from .inplace import inplace_candidates


@dataclass
class Tensor:
    name: str
    shape: list
    dtype: str
    kind: str                  # "input" | "param" | "intermediate"
    base: int | None = None    # for a reshape view: the tensor whose storage it shares
    param: np.ndarray | None = None
    layout: str | None = None  # compiler/lowering/layouts.py; None = the ONNX layout

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


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

    def add(self, t: Tensor) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1


def _sinfo_tensor(sinfo, name: str, where: str) -> tuple[list, str]:
    shape = sinfo.shape
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        raise UnsupportedError(f"{where}: tensor {name!r} has no static shape after import")
    dims = []
    for d in shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            raise UnsupportedError(f"{where}: tensor {name!r} has a symbolic dimension {d}; "
                                   "this build compiles static shapes only")
        dims.append(int(d.value))
    return dims, str(sinfo.dtype)


def extract(mod, input_names: list, output_names: list, where: str = "model",
            groups: dict | None = None, nodes: list | None = None) -> KernelGraph:
    """Walk ``mod["main"]`` (after kernel grouping) into a :class:`KernelGraph`.

    ``groups`` ({fused call's binding name: [node index]}) and ``nodes`` ([(name, op_type)] of the ONNX
    graph) let every call name the ONNX nodes it computes.
    """
    g = KernelGraph()
    g.groups, g.onnx_nodes = groups or {}, nodes or []
    func = mod["main"]
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
        shape, dtype = _sinfo_tensor(p.ty, name, where)
        env[p] = g.add(Tensor(name, shape, dtype, "input"))
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
    v, name = b.value, b.var.name
    if isinstance(v, (relax.Var, GenericConst, relax.Tuple)):
        return tid_of(v)
    if isinstance(v, relax.TupleGetItem):
        return tid_of(v.tuple_value)[v.index]
    if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
        if v.op.name == "relax.call_tir":
            return _call_tir(g, v, name, tid_of, mod, where)
        if v.op.name == "relax.reshape":
            src = tid_of(v.args[0])
            shape, dtype = _sinfo_tensor(v.ty, name, where)
            base = g.tensors[src]
            if base.kind == "param":  # a reshaped weight: a param of its own
                return g.add(Tensor(name, shape, dtype, "param",
                                    param=base.param.reshape(shape)))
            return g.add(Tensor(name, shape, dtype, "intermediate", base=src))
        raise UnsupportedError(f"{where}: operator {v.op.name} (binding {name!r}) was not "
                               "lowered to a kernel; the graph runtime cannot run it")
    raise UnsupportedError(f"{where}: binding {name!r} ({type(v).__name__}) cannot run in "
                           "the graph runtime")


def _call_tir(g: KernelGraph, call, name: str, tid_of, mod, where: str):
    gv, args = call.args[0], call.args[1]
    if len(call.args) > 2:
        raise UnsupportedError(f"{where}: kernel {gv.name_hint} takes symbolic shape "
                               "arguments; this build compiles static shapes only")
    ins = [tid_of(a) for a in args.fields]
    sinfo = call.ty
    out_infos = list(sinfo.fields) if isinstance(sinfo, relax.TupleType) else [sinfo]
    outs = []
    for k, si in enumerate(out_infos):
        shape, dtype = _sinfo_tensor(si, name, where)
        outs.append(g.add(Tensor(f"{name}.{k}" if len(out_infos) > 1 else name, shape, dtype,
                                 "intermediate")))
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
                    "flops": g.flops[symbol]})
    return tuple(outs) if isinstance(sinfo, relax.TupleType) else outs[0]


# -- storage -----------------------------------------------------------------------------
def _root(g: KernelGraph, t: int) -> int:
    while g.tensors[t].base is not None:
        t = g.tensors[t].base
    return t


def plan_storage(g: KernelGraph, reuse: bool = True) -> tuple[dict, MemoryPlan]:
    """Assign tensors to arena buffers and params, plan the arena.

    Steps: inputs are written at step 0, call k runs at step k+1, outputs are read at
    step len(calls)+1.  Returns (graph meta for the artifact, memory plan); the params
    payload is ``meta["params_payload"]`` (popped by the caller).
    """
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
        buffers.append([g.tensors[t].nbytes, 0, max(last[t], 0)])
    inplace_cache: dict = {}
    for step, call in enumerate(g.calls, start=1):
        nin = len(call["args"]) - call["num_outputs"]
        ins, outs = call["args"][:nin], call["args"][nin:]
        if reuse and call["kernel"] not in inplace_cache:
            inplace_cache[call["kernel"]] = inplace_candidates(g.prim_funcs[call["kernel"]], nin)
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
                if buf[2] == step and buf[0] == g.tensors[o].nbytes:
                    chosen = buffer_of[r]
                    break
            if chosen is None:
                chosen = len(buffers)
                buffers.append([g.tensors[o].nbytes, step, last[o]])
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
    }
    return meta, plan
