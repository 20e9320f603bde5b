"""Control flow at import: ``If``, ``Loop`` and ``Scan`` become straight-line Relax.

Our runtime runs a static list of kernels, so control flow is resolved when the model is
imported.  A node's subgraph (its ``GraphProto`` attribute) is converted by the importer's
own node loop (its public ``convert_subgraph``), with the outer scope's tensor names
visible and the subgraph's inputs bound to Relax values:

* ``If``: a compile-time constant condition (an initializer, a folded value, or an input
  bound by specialisation, ``compiler/specialize.py``) inlines the taken branch.  Otherwise
  both branches are converted and each output is ``where(cond, then, else)``, which needs
  both branches to give the same shapes and dtypes.
* ``Loop``: the body is unrolled for a constant trip count ``M``, while the condition stays
  a constant true (it must fold to a constant after every iteration).  Loop-carried values
  thread through the copies; scan outputs are stacked along a new axis 0.
* ``Scan``: the body is unrolled over the static scan-axis length (opset 8: per batch
  element, ``sequence_lens`` must be absent or all full length; opset 9+: per-input axes
  and directions, per-output axes and directions).

Unrolling is bounded (``MAX_ITERATIONS`` steps, ``MAX_UNROLLED_NODES`` body nodes in all);
past that, or where a trip count or condition is not a compile-time constant, an
``UnsupportedError`` names the node.  That error is a ``CompileError``, so a model whose
graph inputs fix the trip count or condition is compiled per value by the specialising
session.  Errors inside a subgraph name the node as ``parent > child``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
from tvm import relax, tirx
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from .converters.common import register, constant_value
from ..errors import CompileError, UnsupportedError
from .fold_onnx import fold_node, opset_ids
from .registry import register_op

# Unrolling bounds: loop iterations, and subgraph nodes converted for one Loop/Scan node.
MAX_ITERATIONS = 1024
MAX_UNROLLED_NODES = 20000




def _const(arr: np.ndarray):
    arr = np.asarray(arr)
    return relax.const(arr, str(arr.dtype))


def _where(ctx) -> str:
    return f"{ctx.importer.where}: {ctx.label}"


def _static_shape(x) -> list[int] | None:
    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    return [int(v.value) for v in values]


def _count_nodes(graph) -> int:
    """Nodes of ``graph``, those of nested subgraphs included."""
    n = 0
    for node in graph.node:
        n += 1
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                n += _count_nodes(g)
    return n


def _check_budget(ctx, body, iterations: int) -> None:
    if iterations > MAX_ITERATIONS:
        raise UnsupportedError(f"{_where(ctx)}: {iterations} iterations; onnxc unrolls "
                               f"control flow at compile time, up to {MAX_ITERATIONS}")
    nodes = _count_nodes(body) * iterations
    if nodes > MAX_UNROLLED_NODES:
        raise UnsupportedError(f"{_where(ctx)}: unrolling {iterations} iterations of a "
                               f"{_count_nodes(body)}-node body gives {nodes} nodes, more "
                               f"than onnxc unrolls ({MAX_UNROLLED_NODES})")


def convert_subgraph(ctx, graph, feeds: dict, scope: str) -> list:
    """Convert ``graph`` (a node's subgraph) into the current function; returns its outputs.

    ``feeds`` binds the subgraph's inputs ({name: Relax expr}); outer-scope tensors are
    visible by name, and the subgraph's own names shadow them only inside it.
    """
    importer = ctx.importer
    if importer is None:
        raise CompileError(f"{ctx.label}: subgraphs need the onnxc importer")
    names = dict(ctx.tensors)  # the outer scope (a subgraph's own, for nested ones)
    for t in graph.initializer:
        names[t.name] = _const(numpy_helper.to_array(t))
    names.update(feeds)
    rest = _fold(graph, names, importer.domain_opsets)
    importer.convert_subgraph(rest, names, scope)
    missing = [o.name for o in graph.output if o.name not in names]
    if missing:
        raise CompileError(f"{importer.where}: {scope}: subgraph outputs {missing} are never "
                           "computed")
    return [names[o.name] for o in graph.output]


def _fold(graph, names: dict, domain_opsets: dict):
    """Evaluate the subgraph's nodes whose inputs are all constants (as ``fold_onnx`` does
    for the main graph; here the subgraph's inputs are known per branch or iteration),
    binding their outputs in ``names``; returns the graph of the nodes left to convert."""
    opsets = opset_ids(domain_opsets)
    kept = []
    for node in graph.node:
        result = None
        if all(not n or isinstance(names.get(n), (GenericConst, relax.ShapeExpr))
               for n in node.input):
            values = [constant_value(names[n]) if n else None for n in node.input]
            if all(v is not None for n, v in zip(node.input, values) if n):
                result = fold_node(node, values, opsets)
        if result is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, result):
            if name:
                names[name] = _const(value)
    if len(kept) == len(graph.node):
        return graph
    rest = onnx.GraphProto()
    rest.CopyFrom(graph)
    del rest.node[:]
    rest.node.extend(kept)
    return rest


def _result(outs: list):
    return outs[0] if len(outs) == 1 else relax.Tuple(outs)


# --------------------------------------------------------------------------- If


@register("If")
def convert_if(bb, inputs, attrs, ctx):
    """If: the taken branch when the condition is constant, else where(cond, then, else)."""
    cond = constant_value(inputs[0])
    if cond is not None:
        if cond.size != 1:
            raise CompileError(f"{_where(ctx)}: the condition has {cond.size} elements, "
                               "ONNX needs exactly one")
        taken = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        return _result(convert_subgraph(ctx, attrs[taken], {}, f"{ctx.label} {taken}"))
    need = (f"its condition {ctx.node.input[0]!r} is not a compile-time constant; compile "
            "with input_values={...} for the inputs it depends on, or run the model through "
            "the session compiler.compile returns, which specialises on them")
    try:
        then_outs = convert_subgraph(ctx, attrs["then_branch"], {}, f"{ctx.label} then_branch")
        else_outs = convert_subgraph(ctx, attrs["else_branch"], {}, f"{ctx.label} else_branch")
    except CompileError as e:
        raise UnsupportedError(f"{_where(ctx)}: {need}, and selecting between both branches "
                               f"failed: {str(e).splitlines()[0]}") from e
    then_outs = ctx.importer._shape_values_as_tensors(then_outs, ctx.label)
    else_outs = ctx.importer._shape_values_as_tensors(else_outs, ctx.label)
    c = inputs[0]
    if _static_shape(c) != []:
        c = bb.emit(relax.op.reshape(c, []))
    outs = []
    for k, (t, e) in enumerate(zip(then_outs, else_outs)):
        ts, es = _static_shape(t), _static_shape(e)
        if ts is None or ts != es or str(t.ty.dtype) != str(e.ty.dtype):
            raise UnsupportedError(
                f"{_where(ctx)}: {need}; output {k} differs between the branches "
                f"(then: {ts} {t.ty.dtype}, else: {es} {e.ty.dtype}), so it cannot be "
                "selected element-wise")
        outs.append(relax.op.where(c, t, e))
    return _result(outs)


# --------------------------------------------------------------------------- Loop


def _scalar_input(ctx, x, index: int, what: str):
    """The constant value of a Loop's M / cond input, or an error naming it."""
    value = constant_value(x)
    if value is None:
        raise UnsupportedError(
            f"{_where(ctx)}: the {what} (input {ctx.node.input[index]!r}) is not a "
            "compile-time constant; onnxc unrolls loops at compile time: compile with "
            "input_values={...} for the inputs it depends on, or run the model through the "
            "session compiler.compile returns, which specialises on them")
    if value.size != 1:
        raise CompileError(f"{_where(ctx)}: the {what} has {value.size} elements, ONNX needs "
                           "exactly one")
    return value.reshape(-1)[0]


def _stack(values: list, axis: int):
    """Per-iteration values stacked along a new ``axis`` (ONNX scan outputs)."""
    return relax.op.concat([relax.op.expand_dims(v, [axis]) for v in values], axis=axis)


def _stackable(ctx, values: list, k: int) -> None:
    shapes = {(tuple(_static_shape(v) or ()), str(v.ty.dtype)) for v in values}
    if len(shapes) > 1 or any(_static_shape(v) is None for v in values):
        raise UnsupportedError(f"{_where(ctx)}: scan output {k} changes shape or dtype between "
                               f"iterations ({sorted(shapes)}); it cannot be stacked")


@register("Loop")
def convert_loop(bb, inputs, attrs, ctx):
    """Loop with a constant trip count / condition: the body unrolled."""
    body = attrs["body"]
    trip = None if inputs[0] is None else int(_scalar_input(ctx, inputs[0], 0, "trip count M"))
    cond = True if inputs[1] is None else bool(_scalar_input(ctx, inputs[1], 1, "condition"))
    carried = list(inputs[2:])
    n_scan = len(body.output) - 1 - len(carried)
    if trip is None and inputs[1] is None:
        raise UnsupportedError(f"{_where(ctx)}: a loop with neither a trip count nor a "
                               "condition never ends")
    bound = MAX_ITERATIONS if trip is None else max(trip, 0)
    if trip is not None and cond:
        _check_budget(ctx, body, bound)
    names = [vi.name for vi in body.input]
    scans: list[list] = [[] for _ in range(n_scan)]
    i = 0
    while cond and i < bound:
        _check_budget(ctx, body, i + 1)  # a condition-bounded loop: checked as it goes
        feeds = {names[0]: _const(np.array(i, np.int64)), names[1]: _const(np.array(cond))}
        feeds.update(zip(names[2:], carried))
        outs = convert_subgraph(ctx, body, feeds, f"{ctx.label} iteration {i}")
        c = constant_value(outs[0])
        if c is None or c.size != 1:
            raise UnsupportedError(
                f"{_where(ctx)}: the body's condition output {body.output[0].name!r} is not a "
                f"compile-time constant after iteration {i}; onnxc unrolls loops at compile "
                "time, so the number of iterations must be known")
        cond = bool(c.reshape(-1)[0])
        carried = ctx.importer._shape_values_as_tensors(outs[1:1 + len(carried)], ctx.label)
        for k, v in enumerate(outs[1 + len(carried):]):
            scans[k].append(v)
        i += 1
    if trip is None and cond:
        raise UnsupportedError(f"{_where(ctx)}: the condition still holds after "
                               f"{MAX_ITERATIONS} iterations; onnxc unrolls up to that many")
    stacked = []
    for k, values in enumerate(scans):
        if not values:
            stacked.append(_empty_scan_output(ctx, body, names, carried, k))
            continue
        values = ctx.importer._shape_values_as_tensors(values, ctx.label)
        _stackable(ctx, values, k)
        stacked.append(_stack(values, 0))
    return _result(list(carried) + stacked)


def _empty_scan_output(ctx, body, names, carried, k: int):
    """Scan output ``k`` of a loop that ran no iteration: shape [0, *per-iteration shape],
    the per-iteration shape and dtype taken from one body conversion whose values are
    unused (dead code, removed by the graph passes)."""
    feeds = {names[0]: _const(np.array(0, np.int64)), names[1]: _const(np.array(True))}
    feeds.update(zip(names[2:], carried))
    outs = convert_subgraph(ctx, body, feeds, f"{ctx.label} (shape of scan output {k})")
    (v,) = ctx.importer._shape_values_as_tensors([outs[1 + len(carried) + k]], ctx.label)
    shape = _static_shape(v)
    if shape is None:
        raise UnsupportedError(f"{_where(ctx)}: the loop runs no iteration and scan output {k} "
                               "has no static shape")
    return relax.op.zeros(relax.ShapeExpr([0, *shape]), str(v.ty.dtype))


# --------------------------------------------------------------------------- Scan


def _step(bb, x, axis: int, t: int):
    """x's slice t along ``axis``, the axis removed."""
    s = relax.op.strided_slice(x, axes=[axis], begin=[t], end=[t + 1])
    return bb.normalize(relax.op.squeeze(s, axis=[axis]))


def _norm_axis(ctx, axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise CompileError(f"{_where(ctx)}: {what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _unroll_scan(ctx, body, states: list, xs: list, axes: list, directions: list,
                 scope: str) -> tuple[list, list]:
    """Run the scan body over the steps of ``xs``; returns (final states, per-output lists
    of per-iteration values in iteration order)."""
    lengths = set()
    for k, (x, a) in enumerate(zip(xs, axes)):
        shape = _static_shape(x)
        if shape is None:
            raise UnsupportedError(f"{_where(ctx)}: scan input {k} has no static shape; "
                                   "onnxc unrolls scans over a static length")
        lengths.add(shape[a])
    if len(lengths) != 1:
        raise CompileError(f"{_where(ctx)}: the scan inputs have different lengths along "
                           f"their scan axes ({sorted(lengths)})")
    (steps,) = lengths
    _check_budget(ctx, body, steps)
    names = [vi.name for vi in body.input]
    n_out = len(body.output) - len(states)
    per_output: list[list] = [[] for _ in range(n_out)]
    for t in range(steps):
        feeds = dict(zip(names, states))
        for name, x, a, d in zip(names[len(states):], xs, axes, directions):
            feeds[name] = _step(ctx.importer.bb, x, a, steps - 1 - t if d else t)
        outs = convert_subgraph(ctx, body, feeds, f"{scope} step {t}")
        states = ctx.importer._shape_values_as_tensors(outs[:len(states)], ctx.label)
        for k, v in enumerate(ctx.importer._shape_values_as_tensors(outs[len(states):],
                                                                    ctx.label)):
            per_output[k].append(v)
    if steps == 0:
        raise UnsupportedError(f"{_where(ctx)}: a scan over 0 steps is not supported")
    return list(states), per_output


def _ints(attrs, name: str, n: int, default: int = 0) -> list[int]:
    value = attrs.get(name)
    out = [int(v) for v in value] if value is not None else [default] * n
    return out


@register("Scan", since=9)
def convert_scan(bb, inputs, attrs, ctx):
    """Scan (opset 9+): the body unrolled over the static scan-axis length."""
    body = attrs["body"]
    n_in = int(attrs["num_scan_inputs"])
    states, xs = list(inputs[:len(inputs) - n_in]), list(inputs[len(inputs) - n_in:])
    n_out = len(body.output) - len(states)
    in_axes = _ints(attrs, "scan_input_axes", n_in)
    in_dirs = _ints(attrs, "scan_input_directions", n_in)
    out_axes = _ints(attrs, "scan_output_axes", n_out)
    out_dirs = _ints(attrs, "scan_output_directions", n_out)
    in_axes = [_norm_axis(ctx, a, len(_static_shape(x) or []), "scan_input_axes entry")
               for a, x in zip(in_axes, xs)]
    final, per_output = _unroll_scan(ctx, body, states, xs, in_axes, in_dirs, ctx.label)
    outs = list(final)
    for k, values in enumerate(per_output):
        _stackable(ctx, values, k)
        rank = len(_static_shape(values[0])) + 1
        axis = _norm_axis(ctx, out_axes[k], rank, "scan_output_axes entry")
        outs.append(_stack(values[::-1] if out_dirs[k] else values, axis))
    return _result(outs)


@register_op("", "Scan", since=8, until=8, implementation="onnxc")
def convert_scan8(bb, inputs, attrs, ctx):
    """Scan (opset 8): batch axis 0 everywhere, time axis 1 of the scan inputs."""
    body = attrs["body"]
    n_in = int(attrs["num_scan_inputs"])
    seq_lens, rest = inputs[0], list(inputs[1:])
    states, xs = rest[:len(rest) - n_in], rest[len(rest) - n_in:]
    dirs = _ints(attrs, "directions", n_in)
    shape = _static_shape(xs[0]) if xs else None
    if shape is None or len(shape) < 2:
        raise UnsupportedError(f"{_where(ctx)}: the scan inputs need static [batch, time, ...] "
                               "shapes")
    batch, steps = shape[0], shape[1]
    if seq_lens is not None:
        lens = constant_value(seq_lens)
        if lens is None or not np.all(lens == steps):
            raise UnsupportedError(f"{_where(ctx)}: sequence_lens other than the full length "
                                   f"({steps}) for every batch element is not supported")
    finals: list[list] = [[] for _ in states]
    outputs: list[list] = [[] for _ in range(len(body.output) - len(states))]
    for b in range(batch):
        final, per_output = _unroll_scan(ctx, body, [_step(bb, s, 0, b) for s in states],
                                         [_step(bb, x, 0, b) for x in xs], [0] * len(xs), dirs,
                                         f"{ctx.label} batch {b}")
        for k, v in enumerate(final):
            finals[k].append(v)
        for k, values in enumerate(per_output):
            _stackable(ctx, values, k)
            outputs[k].append(_stack(values, 0))
    return _result([_stack(v, 0) for v in finals] + [_stack(v, 0) for v in outputs])
