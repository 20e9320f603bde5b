"""op(reshape(x, S), ..) => reshape(op(x, ..), S) for elementwise ops that keep the last axis.

A reshape between a matmul and its epilogue stops TVM's FuseOps: a matmul may take
elementwise and broadcast consumers into its kernel, not an injective reshape.
``pack_matmul_weights`` runs a few-rows-per-batch matmul (ConvNeXt's [1, 14, 14, C]
MLPs) as one [B*M, K] matmul between reshapes, so the bias, the GELU and the layer-scale /
residual of every ConvNeXt block became an elementwise kernel of their own after the
matmul (an extra pass over [196, 1536] per block).  Sinking the reshape below the
elementwise ops puts them next to the matmul, where they fuse into its write-back; a
reshape of a reshape becomes one reshape (the next matmul's flattening cancels it).

Sinks below:

* unary elementwise ops (GELU, ReLU, SiLU, sigmoid, tanh, erf, exp, clip);
* add / subtract / multiply / divide whose other operand broadcasts along the last axis
  only (a bias or scale of shape [n], [1, .., n] or a scalar: used as is) or has the
  reshape's whole shape (a residual: read through a reshape view of itself).

Only when the reshape keeps the last axis (``x.shape[-1] == S[-1]``), so a broadcast
along it means the same thing on both sides; static shapes only.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, record_calls, rewrite_calls, shape_of

UNARY = ("nn.gelu", "nn.gelu_tanh", "nn.relu", "nn.silu", "sigmoid", "tanh", "erf", "exp",
         "clip")
BINARY = ("add", "subtract", "multiply", "divide")
RULE = "op(reshape(x), c) => reshape(op(x, c)) (elementwise epilogue next to its producer)"
RULE_CHAIN = "reshape(reshape(x)) => reshape(x)"
VIEW = "_view"  # the name suffix of a residual's view (never sunk back: no ping-pong)


class SinkReshape(GraphPass):
    """Sink reshapes that keep the last axis below elementwise ops; fold reshape chains."""

    name = "sink_reshape"
    opt_level = 2

    def rewrite(self, mod, report: PassReport, options: dict):
        sunk, chains = [], []
        for _ in range(16):  # each sweep moves every reshape one op further down
            df = Dataflow(mod)
            ops, chained = _candidates(df)
            if not ops and not chained:
                break
            moved = 0
            for op in (o for o in UNARY + BINARY if o in ops):
                mod, done = rewrite_calls(mod, "relax." + op,
                                          lambda m, call, df=df: _sink(df, m, call))
                sunk += done
                moved += len(done)
                if done:
                    df = Dataflow(mod)
            done = []
            if chained:
                mod, done = rewrite_calls(mod, "relax.reshape",
                                          lambda m, call, df=df: _chain(df, m, call))
                chains += done
            if not moved and not done:
                break
        record_calls(report, RULE, sunk)
        record_calls(report, RULE_CHAIN, chains)
        if chains:  # a chain back to x's own shape left an alias ``y = x``: drop it
            mod = relax.transform.CanonicalizeBindings()(mod)
        return mod


def _candidates(df: Dataflow) -> tuple[set, bool]:
    """(the elementwise ops with a live call reading a last-axis-keeping reshape, whether a
    live reshape reads a reshape): a cheap scan, so that a model with nothing to sink (most
    of GPT-2's reshapes split heads) costs one walk, not a rewrite per op and sweep."""
    ops, chained = set(), False
    for b in df.roots():
        v = b.value
        if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
            continue
        name = v.op.name[len("relax."):]
        if name == "reshape":
            chained = chained or df.call(v.args[0], "reshape") is not None
        elif name in UNARY:
            if _reshape_of(df, v.args[0]) is not None:
                ops.add(name)
        elif name in BINARY and any(_reshape_of(df, a) is not None for a in v.args[:2]):
            ops.add(name)
    return ops, chained


def _reshape_of(df: Dataflow, expr, m=None):
    """(x, shape of x, S) when ``expr`` is ``reshape(x, S)`` keeping the last axis, static;
    else None.  With the mutator ``m``, ``expr`` is looked up in the graph as rewritten so
    far first (a reshape this sweep has just sunk is sunk further in the same sweep: along
    a residual stream, one sweep instead of one per block), and ``x`` is of that graph."""
    r = None
    if m is not None:
        new = m.visit_expr(expr)
        while isinstance(new, relax.Var):
            bound = m.lookup_binding(new)
            if isinstance(bound, relax.Var):
                new = bound
                continue
            if (isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op)
                    and bound.op.name == "relax.reshape"):
                r = bound
                if new.name.endswith(VIEW):
                    return None
            break
    if r is None:
        r = df.call(expr, "reshape")
        src = df.source(expr)
        if r is not None and isinstance(src, relax.Var) and src.name.endswith(VIEW):
            return None  # a residual's view this pass made: sinking it undoes the move
    if r is None:
        return None
    x = r.args[0]
    sx, s = shape_of(x), shape_of(r)
    if sx is None or s is None or not sx or not s or sx[-1] != s[-1] or sx == s:
        return None
    return x, sx, s


def _sink(df: Dataflow, m, call):
    """``reshape(op(x', ..), S)`` for ``call`` = op(reshape(x, S), ..), else None."""
    name = call.op.name[len("relax."):]
    if name in UNARY:
        found = _reshape_of(df, call.args[0], m)
        if found is None:
            return None
        x, _, s = found
        inner = m.builder_.emit(relax.Call(call.op, [m.visit_expr(x), *call.args[1:]],
                                           call.attrs), name_hint=_inner_name(m))
        return relax.op.reshape(inner, s)
    for pos in (0, 1):
        found = _reshape_of(df, call.args[pos], m)
        if found is None:
            continue
        x, sx, s = found
        other = call.args[1 - pos]
        so = shape_of(other)
        if so is None or shape_of(call) != s:
            return None
        if so == s:  # a residual of the reshaped shape: read it in x's shape (a view)
            other = m.builder_.emit(relax.op.reshape(m.visit_expr(other), sx),
                                    name_hint=m.binding.var.name + VIEW)
        elif len(so) <= len(s) and math.prod(so[:-1] or [1]) == 1 and (
                not so or so[-1] in (1, s[-1])):
            other = m.visit_expr(other)  # broadcasts along the last axis: the same on x
        else:
            return None
        args = [m.visit_expr(x), other] if pos == 0 else [other, m.visit_expr(x)]
        # named as the op's binding: its kernel keeps naming the op's ONNX node
        inner = m.builder_.emit(relax.Call(call.op, args, call.attrs),
                                name_hint=_inner_name(m))
        return relax.op.reshape(inner, s)
    return None


def _chain(df: Dataflow, m, call):
    """``reshape(x, S)`` for ``call`` = reshape(reshape(x, S0), S) (``x`` itself when S is
    x's shape); else None."""
    inner = df.call(call.args[0], "reshape")
    if inner is None:
        return None
    x = inner.args[0]
    sx, s = shape_of(x), shape_of(call)
    if sx is None or s is None:
        return None
    if sx == s:
        return m.visit_expr(x)
    return relax.op.reshape(m.visit_expr(x), s)


def _inner_name(m) -> str:
    """The sunk op's binding name: the replaced binding's tag with a helper suffix
    (``n114`` -> ``n114_0``), so its kernel still names the op's ONNX node and the reshape
    left under the binding's own name stays a distinct name."""
    name = m.binding.var.name
    return name + "_0" if "_" not in name else name + "0"
