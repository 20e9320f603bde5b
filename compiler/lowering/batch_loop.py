"""A symbolic batch dim run as a loop over one-sample kernels.

A model exported with a symbolic batch axis (``dynamic_axes={"x": {0: "batch"}}``, the
usual PyTorch export) compiles to kernels whose every extent but the batch is static.  The
layout pass, the weight packing and the conv / pool rules need static shapes: a symbolic
build of a CNN fell to dlight's generic reduction (ResNet-50 45x onnxruntime's time at
batch 1, MobileNetV2 25x at batch 4).

When every sample of the batch is computed independently of the others, the batch can be
a loop around a one-sample graph instead: the compile driver recompiles the model with the
dim fixed to 1, with every pass and rule of a static build, and the runtime
(``runtime/batch_loop.py``) runs that graph once per sample.  This module decides whether
a dim may be looped, from the symbolic build's graph (``graph.KernelGraph``), by proof
rather than by the operator's name:

* every tensor holding the dim holds it as its leading axis and nowhere else (the model's
  inputs and outputs included), so sample ``b`` of each is a contiguous slice;
* every kernel reading such a tensor writes only such tensors, and its TIR (unscheduled,
  one block per computation) is *separable*: in each block, the loop over the batch is one
  spatial block iterator ``v`` that indexes the leading axis of every batched buffer the
  block reads or writes, exactly, and appears nowhere else; so block instance ``v = b``
  reads and writes sample ``b`` only (a reduction over the batch, a reshape mixing it with
  another axis, a gather along it are all refused);
* reshape views keep the leading batch axis (sample ``b`` is the same bytes in both).

It is chosen only where it pays: when a kernel over the dim is a conv or pool (the ops a
symbolic build leaves to generic reductions).  Transformers keep their symbolic build, whose
matmul rules take symbolic rows and read each weight once for the whole batch.
"""

from __future__ import annotations

import onnx
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import Call, TensorLoad
from tvm.s_tir import SBlock, SBlockRealize
from tvm.sym.analyzer import Analyzer

# ONNX ops whose kernels need static shapes for our layout and rules: a graph with one of
# them over the batch dim is looped
SPATIAL_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool",
               "QLinearConv", "ConvInteger")
# TIR builtins that take a buffer's address: the access they make cannot be read here
_ADDRESS_OPS = ("access_ptr", "address_of", "extern", "packed")


def loop_dim(graph, ranges: list) -> dict | None:
    """The range entry (``symbolic.resolve_ranges``) of the dim to run as a batch loop over
    one-sample kernels, or None; see the module docstring."""
    for d in ranges:
        name = d["name"]
        if d["min"] < 1 or not _worth_it(graph, name):
            continue
        if separable_graph(graph, name) is None:
            return d
    return None


def worth_looping(graph, ranges: list) -> bool:
    """Whether some dim of ``ranges`` would pay for a loop (a conv or pool over it)."""
    return any(d["min"] >= 1 and _worth_it(graph, d["name"]) for d in ranges)


def _worth_it(graph, name: str) -> bool:
    for call in graph.calls:
        if any(op in SPATIAL_OPS for op in call["ops"].split("+")) and any(
                _kind(graph.tensors[t].shape, name) == "batched" for t in call["args"]):
            return True
    return False


def _kind(shape, name: str) -> str:
    """``batched`` (the dim leads, nowhere else), ``free`` (no dim of ``name``) or
    ``mixed``; shapes hold ints and expression texts (``symbolic.expr_text``)."""
    uses = [i for i, d in enumerate(shape) if isinstance(d, str) and _mentions(d, name)]
    if not uses:
        return "free"
    return "batched" if uses == [0] and shape[0] == name else "mixed"


def _mentions(text: str, name: str) -> bool:
    import re

    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) is not None


def separable_graph(graph, name: str) -> str | None:
    """None when the batch dim ``name`` can be looped over (module docstring), else why not."""
    kinds = []
    for t in graph.tensors:
        k = _kind(t.shape, name)
        if k == "mixed":
            return f"tensor {t.name!r} has shape {t.shape}: {name!r} is not its leading axis"
        if t.offset not in (None, 0, "0"):
            return f"tensor {t.name!r} lies at offset {t.offset} in another"
        kinds.append(k)
    for t in graph.tensors:
        if t.base is not None and kinds[graph.tensors.index(t)] != kinds[t.base]:
            return f"view {t.name!r} and its base differ in the batch axis"
    for io_name, t in graph.inputs + graph.outputs:
        if kinds[t] != "batched" and _kind(graph.tensors[t].shape, name) != "free":
            return f"{io_name!r} does not lead with {name!r}"
    for call in graph.calls:
        if any(_mentions(e, name) for _, e in call.get("scalars", ())):
            return f"kernel {call['kernel']} takes an integer computed from {name!r}"
        n_out = call["num_outputs"]
        ins, outs = call["args"][:-n_out], call["args"][-n_out:]
        if any(kinds[t] == "batched" for t in ins) and not all(
                kinds[t] == "batched" for t in outs):
            return f"kernel {call['kernel']} reduces or drops the batch axis"
        if any(kinds[t] == "batched" for t in call["args"]):
            why = separable_kernel(graph.prim_funcs[call["kernel"]], name)
            if why:
                return f"kernel {call['kernel']}: {why}"
    return None


def separable_kernel(func, name: str) -> str | None:
    """None when every block of the unscheduled ``func`` computes sample ``b`` of its
    batched outputs from sample ``b`` of its batched inputs alone (module docstring);
    else why not."""
    batch = None
    for buf in func.params:
        for d in _shape(buf):
            for v in tirx.analysis.undefined_vars(d):
                if v.name == name:
                    if batch is not None and not batch.same_as(v):
                        return f"two variables named {name!r}"
                    batch = v
    if any(p.name == name for p in func.params if _shape(p) == ()):
        return f"{name!r} is a scalar parameter"
    if batch is None:
        return None
    for call in _nodes(func.body, Call, into_blocks=True):
        op = getattr(call.op, "name", "") or ""
        if any(a in op for a in _ADDRESS_OPS):
            return f"it calls {op}"
    for realize in _nodes(func.body, SBlockRealize, into_blocks=True):
        if _uses(realize.predicate, [batch]):
            return f"block {realize.block.name_hint} is predicated on the batch size"
    for block in _nodes(func.body, SBlock, into_blocks=True):
        why = _separable_block(block, batch)
        if why:
            return f"block {block.name_hint}: {why}"
    return None


def _separable_block(block, batch) -> str | None:
    """Why block instances with the batch iterator at ``b`` may touch another sample (or
    the batch size), or None; see separable_kernel."""
    def batched(buf) -> bool | None:
        """True (leads, only there), False (absent), None (elsewhere too)."""
        shape = _shape(buf)
        uses = [_uses(d, [batch]) for d in shape]
        if not any(uses):
            return False
        if uses[0] and not any(uses[1:]) and isinstance(shape[0], tirx.Var):
            return True
        return None

    if not block.iter_vars:  # the root: loop nests around the blocks that compute
        own = _nodes(block, TensorLoad) + _nodes(block, tirx.BufferStore)
        return "it computes outside a block" if own else None
    iters = [iv for iv in block.iter_vars
             if isinstance(iv.dom.extent, tirx.Var) and iv.dom.extent.same_as(batch)]
    for iv in block.iter_vars:
        if _uses(iv.dom.min, [batch]) or (_uses(iv.dom.extent, [batch]) and iv not in iters):
            return f"iterator {iv.var} ranges over an expression of the batch"
    if len(iters) > 1:
        return "two iterators over the batch"
    if iters and iters[0].iter_type != tirx.IterVar.DataPar:
        return "it reduces over the batch"
    v = iters[0].var if iters else None
    loop = [batch] + ([v] if v is not None else [])
    for buf in list(block.alloc_buffers) + [m.buffer for m in block.match_buffers]:
        if batched(buf) is None:
            return f"buffer {_label(buf)} holds the batch off its leading axis"
    if block.match_buffers:
        return "it matches a buffer region"
    # (buffer, indices, extents or None) of each access: loads, stores, declared regions
    accesses = [(n.source, list(n.indices), None) for n in _nodes(block, TensorLoad)]
    accesses += [(n.buffer, list(n.indices), None) for n in _nodes(block, tirx.BufferStore)]
    accesses += [(r.source, [x.min for x in r.region], [x.extent for x in r.region])
                 for r in list(block.reads) + list(block.writes)]
    # indices simplified over the block's iterator domains: a flatten's reshape reads
    # ``x[(v * C + c) // C, (v * C + c) % C]``, which is ``x[v, c]``
    ana = Analyzer()
    for iv in block.iter_vars:
        ana.bind(iv.var, iv.dom)
    accesses = [(buf, [_index(ana, i) for i in indices], extents)
                for buf, indices, extents in accesses]
    for buf, indices, extents in accesses:
        b = batched(buf)
        if b is None:
            return f"buffer {_label(buf)} holds the batch off its leading axis"
        if b:
            if v is None or not (isinstance(indices[0], tirx.Var) and indices[0].same_as(v)):
                return f"it reads or writes {_label(buf)} at another sample"
            if extents is not None and not (isinstance(extents[0], tirx.IntImm)
                                            and int(extents[0]) == 1):
                return f"its region of {_label(buf)} spans samples"
        if any(_uses(i, loop) for i in (indices[1:] if b else indices)):
            return f"it indexes {_label(buf)} by the batch"
    for buf in (r.source for r in block.writes):
        if v is not None and batched(buf) is False:
            return f"it writes the unbatched {_label(buf)} once per sample"
    # the sample index and the batch size in anything but a leading index
    values = [_without_loads(n.value)
              for n in _nodes(block, tirx.BufferStore)]
    values += [n.condition for n in _nodes(block, tirx.IfThenElse)]
    values += [_without_loads(n) for n in _nodes(block, tirx.Let)]
    values += [_without_loads(n.value) for n in _nodes(block, (tirx.LetStmt, tirx.Bind))
               if hasattr(n, "value")]
    if any(_uses(e, loop) for e in values):
        return "it computes with the sample index or the batch size"
    if any(_uses(s, loop) for s in _nodes(block, tirx.For)):
        return "a loop inside it depends on the batch"
    return None


def _index(ana, e):
    """``e`` simplified, and ``a % n`` taken as ``a`` where ``0 <= a < n`` (a symbolic
    ``n``, which TVM's simplifier leaves: a reshape's ``(c // 32 + v) % batch``)."""
    e = ana.simplify(e)
    if isinstance(e, tirx.FloorMod) and ana.can_prove(e.a >= 0) and ana.can_prove(e.a < e.b):
        return _index(ana, e.a)
    return e


def _nodes(root, kind, into_blocks: bool = False) -> list:
    """Every node of type ``kind`` under ``root``: a block's own body and init (not the
    blocks nested in it, unless ``into_blocks``), or a statement."""
    from tvm_ffi.structural import WalkResult

    out = []
    starts = [root] if not isinstance(root, SBlock) else \
        [s for s in (root.body, root.init) if s is not None]

    def visit(node):
        if not into_blocks and isinstance(node, SBlock):
            return WalkResult.SKIP
        if isinstance(node, kind):
            out.append(node)
        return WalkResult.ADVANCE

    for s in starts:
        tvm_ffi.structural_walk(s, visit, order="pre")
    return out


def _shape(buf) -> tuple:
    """A buffer's shape (buffers are Vars of a BufferType here; scalars have none)."""
    shape = getattr(getattr(buf, "ty", None), "shape", None)
    if shape is None:
        shape = getattr(buf, "shape", None)
    return tuple(shape) if shape is not None else ()


def _label(buf) -> str:
    return getattr(buf, "name", None) or getattr(buf, "name_hint", None) or str(buf)


def _uses(expr, vars_) -> bool:
    """Whether ``expr`` (an expression, or a loop: its bounds) reads one of ``vars_``."""
    if isinstance(expr, tirx.For):
        return _uses(expr.min, vars_) or _uses(expr.extent, vars_)
    return any(u.same_as(v) for u in tirx.analysis.undefined_vars(expr) for v in vars_)


def _without_loads(expr):
    """``expr`` with each buffer load replaced by 0 (loads' indices are checked apart)."""
    if not tvm.ir.is_prim_expr(expr):
        return tirx.const(0, "int32")

    def zero(node, _):
        return tirx.const(0, str(node.ty))

    return tvm_ffi.structural_mutate(expr, [(TensorLoad, zero)])


def fix_dim(model: onnx.ModelProto, name: str, value: int = 1) -> onnx.ModelProto:
    """A copy of ``model`` with every ``dim_param`` ``name`` (inputs, outputs, value infos,
    subgraphs) set to ``value``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)

    def graph(g):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if t is None or not t.HasField("shape"):
                continue
            for d in t.shape.dim:
                if d.HasField("dim_param") and d.dim_param == name:
                    d.dim_value = value
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        graph(sub)

    graph(m.graph)
    return m
