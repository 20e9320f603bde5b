"""Matching and rewriting ``main``'s bindings, for the fusion and numerics passes.

``Dataflow`` is a read-only view of ``main``: what each variable is bound to (seeing
through the importer's alias bindings such as ``n1_o0 = n1_2``), which constants feed it,
and how many *live* uses it has (a binding that nothing reaches, e.g. the unused outputs
of BatchNormalization, is not a use; the function's result is).

``rewrite`` replaces chosen bindings and names what it emits with provenance tags
(``compiler/lowering/provenance.py``): the root after every ONNX node the match covers
(``n24x25x26x27x28`` for a fused GELU), helpers after the node they stand for, so kernels
keep naming all their nodes.  The bindings a rewrite made dead are dropped right away: a
later pass would otherwise rewrite them too (e.g. pack a dead conv's weights).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_util import bindings

# The binding tags of compiler/lowering/provenance.py (passes/ may not import compiler/): ``n3`` for
# node 3, ``n2x3`` for a value a pass made from nodes 2 and 3, ``_<j>``/``_o<j>`` suffixes.
_TAG = re.compile(r"^n(\d+(?:x\d+)*)(?:_o?(\d+))?$")


def nodes_of(name: str) -> list:
    """The ONNX node indices a binding name is tagged with ([] if untagged)."""
    m = _TAG.match(name)
    return [int(k) for k in m.group(1).split("x")] if m else []


def tag(nodes) -> str:
    """The binding name for a value computed by ``nodes`` (``n2x3``)."""
    return "n" + "x".join(str(k) for k in sorted(set(nodes)))


@dataclass
class Match:
    """One place a pattern fired: the binding replaced (``root``), the bindings folded into
    it (``inner``), the rule name and what the rewrite needs (``info``)."""

    rule: str
    root: relax.Var
    inner: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


class Dataflow:
    """``main``'s bindings as a graph: values through aliases, constants, live uses."""

    def __init__(self, mod, func: str = "main"):
        self.bindings = bindings(mod, func)
        self._value = {b.var: b.value for b in self.bindings}
        body = mod[func].body
        result = body.body if isinstance(body, relax.SeqExpr) else body
        self._users: dict = {}          # var -> [live binding vars using it] (+ None: result)
        live = set(_free_vars(result))
        for v in live:
            self._users.setdefault(v, []).append(None)
        for b in reversed(self.bindings):
            if b.var not in live:
                continue
            for v in _free_vars(b.value):
                live.add(v)
                self._users.setdefault(v, []).append(b.var)
        self.live = live

    def roots(self) -> list:
        """The live bindings that compute something (not aliases): where rewrites root."""
        return [b for b in self.bindings
                if b.var in self.live and not isinstance(b.value, relax.Var)]

    def source(self, expr):
        """The expression behind ``expr``: follows variables bound to other variables to
        the variable bound to a call (or a parameter, or a constant)."""
        while isinstance(expr, relax.Var) and isinstance(self._value.get(expr), relax.Var):
            expr = self._value[expr]
        return expr

    def value(self, expr):
        """What ``expr`` computes: the bound value of its source variable, or ``expr``."""
        expr = self.source(expr)
        return self._value.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def call(self, expr, *ops: str):
        """The Relax op call behind ``expr`` if its op is one of ``ops`` (names without the
        ``relax.`` prefix: ``"add"``, ``"nn.conv2d"``), else None."""
        v = self.value(expr)
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
            if v.op.name.startswith("relax.") and v.op.name[6:] in ops:
                return v
        return None

    def const(self, expr) -> np.ndarray | None:
        """The value of a constant operand, or None."""
        v = self.value(expr)
        return v.value.numpy() if isinstance(v, GenericConst) else None

    def scalar(self, expr) -> float | None:
        """The value of a one-element constant operand, or None."""
        c = self.const(expr)
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None

    def uses(self, expr) -> int:
        """Live uses of ``expr``'s source, counted through aliases (the result is a use)."""
        return len(self._final_users(self.source(expr)))

    def users(self, expr) -> list:
        """The live binding vars using ``expr``'s source, through aliases (None: the
        function's result)."""
        return self._final_users(self.source(expr))

    def returned(self, expr) -> bool:
        """True when the function returns ``expr``'s source (through aliases and tuples)."""
        todo, seen = [self.source(expr)], set()
        while todo:
            v = todo.pop()
            for u in self._final_users(v):
                if u is None:
                    return True
                if u not in seen and isinstance(self._value.get(u), relax.Tuple):
                    seen.add(u)
                    todo.append(u)
        return False

    def private(self, inner, root) -> bool:
        """True when nothing but ``inner`` bindings and ``root`` uses the ``inner`` ones
        (so replacing ``root`` leaves them dead)."""
        keep = {self.source(v) for v in inner} | {self.source(root)}
        for v in inner:
            for u in self._final_users(self.source(v)):
                if u is None or self.source(u) not in keep:
                    return False
        return True

    def _final_users(self, var) -> list:
        out = []
        for u in self._users.get(var, []):
            if u is not None and isinstance(self._value.get(u), relax.Var):
                out.extend(self._final_users(u))        # an alias: its users count
            else:
                out.append(u)
        return out


def _free_vars(expr) -> list:
    if isinstance(expr, relax.Var):
        return [expr]
    return list(relax.analysis.free_vars(expr))


def qdq_params(df: "Dataflow", call) -> tuple | None:
    """(scale, zero point) of a quantize / dequantize ``call`` whose scale and zero point
    are one-element constants (per tensor), else None."""
    s, z = df.scalar(call.args[1]), df.scalar(call.args[2])
    return None if s is None or z is None else (s, int(z))


def dims_of(expr) -> list | None:
    """A tensor expression's shape with symbolic entries as None (a model's symbolic batch
    or image size), or None when its rank is unknown."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]


def shape_of(expr) -> list | None:
    """Static shape of a tensor expression, or None."""
    dims = dims_of(expr)
    return None if dims is None or None in dims else dims


def dtype_of(expr) -> str:
    """A tensor expression's dtype ('' for tuples and the like)."""
    return str(getattr(expr.ty, "dtype", ""))


def is_float(expr) -> bool:
    return dtype_of(expr) in ("float16", "bfloat16", "float32", "float64")


def axes_of(call, ndim: int) -> list | None:
    """A reduction's ``axis`` attribute as sorted non-negative ints (None: all axes)."""
    axis = call.attrs.axis
    if axis is None:
        return list(range(ndim))
    return sorted(int(a) % ndim for a in axis)


def square_base(df: "Dataflow", sq, same=None):
    """y of y^2 or y*y (the decomposed norms' mean of squares), else None; ``same(df, a,
    b)`` decides whether the two factors are one value (default: one binding)."""
    pw = df.call(sq, "power")
    if pw is not None:
        return pw.args[0] if df.scalar(pw.args[1]) == 2.0 else None
    mul = df.call(sq, "multiply")
    same = same or (lambda d, a, b: d.source(a).same_as(d.source(b)))
    if mul is not None and same(df, mul.args[0], mul.args[1]):
        return mul.args[0]
    return None


def per_feature(c, shape, axes, default: float = 1.0):
    """A norm's gamma / beta ``c`` (numpy, or None: ``default`` everywhere) as a contiguous
    array of shape x.shape[axes], or None when it varies along another axis, would
    broadcast x to a larger shape, or the normalised axes are not static."""
    if shape is None or any(not isinstance(shape[a], int) for a in axes):
        return None
    feat = [shape[a] for a in axes]
    if c is None:
        return np.full(feat, default, np.float32)
    if c.ndim > len(shape):
        return None
    off = len(shape) - c.ndim
    if any(d != 1 and (i + off) not in axes for i, d in enumerate(c.shape)):
        return None
    try:
        full = np.broadcast_to(c.reshape((1,) * off + c.shape), [
            shape[i] if i in axes else 1 for i in range(len(shape))])
    except ValueError:
        return None
    return np.ascontiguousarray(full.reshape(feat))


def select(matches: list) -> list:
    """Largest matches first, dropping any that shares a binding with one already taken
    (a LayerNorm without its gamma is also a match, inside the one with it)."""
    taken, out = set(), []
    for m in sorted(matches, key=lambda m: -len(m.inner)):
        vs = {m.root, *m.inner}
        if vs & taken:
            continue
        taken |= vs
        out.append(m)
    return out


def match_nodes(m) -> list:
    """The ONNX node indices behind a match's bindings, sorted."""
    return sorted({k for v in [m.root, *m.inner] for k in nodes_of(v.name)})


def record(report, df: Dataflow, matches: list) -> None:
    """Count ``matches`` into ``report.rewrites`` and their ONNX nodes into ``report.nodes``."""
    for m in matches:
        report.rewrites[m.rule] = report.rewrites.get(m.rule, 0) + 1
        names = getattr(report, "node_names", None) or []
        for k in match_nodes(m):
            label = names[k] if k < len(names) else f"n{k}"
            if label not in report.nodes:
                report.nodes.append(label)


def rebind(mutator, binding, value, name: str | None = None):
    """Emit ``value`` in place of ``binding`` in ``mutator``'s builder, under a var of the
    same kind named ``name`` (default: the binding's own name, so the kernel that computes
    it keeps naming its ONNX node), and make later uses of the old var read it."""
    value = mutator.builder_.normalize(value)
    cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
    var = cls(name or binding.var.name, value.ty)
    mutator.builder_.emit_normalized(relax.VarBinding(var, value))
    mutator.set_var_remap(binding.var, var)
    return var


def emitter(mutator):
    """``emit(expr)``: bind ``expr`` in ``mutator``'s builder under the tag of the binding
    being replaced (``rewrite_calls``' ``mutator.binding``) and a running suffix, so that
    each kernel made from the pieces names the ONNX node (``n12_1``, ``n12_2``, ...)."""
    name = mutator.binding.var.name
    base = tag(nodes_of(name)) if nodes_of(name) else name
    count = itertools.count(1)

    def emit(expr):
        return mutator.builder_.emit(expr, name_hint=f"{base}_{next(count)}")
    return emit


def rewrite_calls(mod, op_name: str, replace, func: str = "main"):
    """Replace each binding of ``func`` whose value is a call to the operator ``op_name``
    by ``replace(mutator, call)`` (an expression; None keeps the binding), bound under the
    binding's own name so that its kernel keeps naming the ONNX node.  ``replace`` visits
    the operands it keeps (``mutator.visit_expr``) and may make kernels
    (``mutator.builder_.call_te``).  Returns (module, the replaced vars); the module as
    given when nothing was replaced, else with the bindings this made dead removed."""

    @mutator
    class _Calls(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.replaced = []

        def visit_var_binding_(self, binding):
            value = binding.value
            self.binding = binding  # the one being replaced, for replace() to name kernels
            new = replace(self, value) if (
                isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name == op_name) else None
            if new is None:
                super().visit_var_binding_(binding)
                return
            rebind(self, binding, new)
            self.replaced.append(binding.var)

    m = _Calls(mod)
    new_func = m.visit_expr(mod[func])
    if not m.replaced:
        return mod, []
    out = m.builder_.get()
    out[func] = new_func
    return relax.transform.DeadCodeElimination([func])(out), m.replaced


def record_calls(report, rule: str, replaced: list) -> None:
    """Count ``rewrite_calls``' replaced vars under ``rule`` in ``report`` and add their
    ONNX nodes to its list (a var no node made is named by itself)."""
    if not replaced:
        return
    report.rewrites[rule] = len(replaced)
    names = report.node_names
    report.nodes += [names[k] if k < len(names) else v.name
                     for v in replaced for k in nodes_of(v.name) or [len(names)]]


def record_bindings(report, rule: str, names: list) -> None:
    """Count the rewritten bindings ``names`` (binding names, tagged ``n<k>``) under
    ``rule`` in ``report`` and add the ONNX nodes behind them to its list, once each."""
    if not names:
        return
    report.rewrites[rule] = len(names)
    labels = report.node_names or []
    for k in sorted({k for name in names for k in nodes_of(name)}):
        label = labels[k] if k < len(labels) else f"n{k}"
        if label not in report.nodes:
            report.nodes.append(label)


class Emitter:
    """What a rewrite callback gets: ``emit`` binds a helper value, named after the nodes
    of the match or of the binding ``like`` (the one it stands for, so that its kernel
    names that node); ``call_te`` makes a kernel from a TE compute."""

    def __init__(self, mutator, base: str):
        self._m = mutator
        self._base = base

    def emit(self, expr, like=None) -> relax.Var:
        base = tag(nodes_of(like.name)) if isinstance(like, relax.Var) and \
            nodes_of(like.name) else self._base
        expr = self._m.visit_expr(expr)
        return self._m.builder_.emit(expr, name_hint=self._m.fresh_name(base))

    def call_te(self, fn, *args, name: str, **kwargs):
        args = [self._m.visit_expr(a) if isinstance(a, relax.Expr) else a for a in args]
        return self._m.builder_.call_te(fn, *args, primfunc_name_hint=name, **kwargs)


def rewrite_matches(mod, report, match, plan, exclusive: bool = False):
    """The whole of a pattern pass: ``match(df, var)`` at every root binding, ``select`` the
    non-overlapping ones when ``exclusive``, record them in ``report``, apply ``plan``."""
    df = Dataflow(mod)
    matches = [m for b in df.roots() for m in [match(df, b.var)] if m]
    if exclusive:
        matches = select(matches)
    record(report, df, matches)
    return rewrite(mod, matches, plan)


def rewrite(mod, matches: list, plan, func: str = "main"):
    """Replace every match's root binding by ``plan(match)(emitter)``.

    The root is renamed after all the nodes of the match (``n24x25x26``: its kernel names
    them all); helper bindings get that name with a ``_<j>`` suffix, or the tag of the
    binding they stand for (``Emitter.emit(like=)``).
    """
    if not matches:
        return mod
    roots = {m.root: m for m in matches}
    names = {b.var.name for b in bindings(mod, func)}
    used: dict = {}
    for n in names:
        t = _TAG.match(n)
        if t:
            base = "n" + t.group(1)
            used[base] = max(used.get(base, 0), int(t.group(2) or 0))

    @mutator
    class _Rewriter(PyExprMutator):
        def fresh_name(self, base):
            used[base] = used.get(base, 0) + 1
            names.add(f"{base}_{used[base]}")
            return f"{base}_{used[base]}"

        def visit_var_binding_(self, binding):
            m = roots.get(binding.var)
            name = binding.var.name
            if m is None:
                value = self.visit_expr(binding.value)
            else:
                base = tag(match_nodes(m)) if match_nodes(m) else "rw"
                if sorted(set(nodes_of(name))) != match_nodes(m):
                    name = base if base not in names else self.fresh_name(base)
                    names.add(name)
                value = self.visit_expr(plan(m)(Emitter(self, base)))
            rebind(self, binding, value, name)

    # the builder adds kernels (call_te) to the module it is given: give it a copy
    mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs,
                       global_infos=mod.global_infos)
    rw = _Rewriter(mod)
    new_func = rw.visit_expr(mod[func])
    out = rw.builder_.get()
    out[func] = new_func
    return relax.transform.DeadCodeElimination([func])(out)
