"""present = concat(past, new, axis=2) => a sequence-major cache appended in place.

A decoder exported with its key/value cache (Optimum's layout: ``past`` a model input
``[B, H, P, D]``, ``present = Concat(past, new, axis=2)`` a model output that the attention
reads) copies the whole cache into ``present`` on every step: ``[B, H, P, D]`` rows cannot
grow in place, each head's rows move.  Stored sequence-major, ``[P, B, H, D]``, the cache
grows at its end: present's first P rows *are* past's, only the S new rows are written.
This pass rewrites, per cache::

    past_sm    = permute(past, [2, 0, 1, 3])       # kernel marked KV_ATTR "past": extraction
                                                   # drops it, the input is stored so
    new_sm     = permute(new, [2, 0, 1, 3])        # the S new rows (fuses into new's producer)
    present_sm = concat(past_sm, new_sm, axis=0)   # marked KV_ATTR "append": extraction
                                                   # places new_sm after past_sm in past's
                                                   # buffer and drops the call
    scores     = sum_k q[b, h, i, k] * present_sm[j, b, h // rep, k]   # was q @ present^T
    context    = sum_k p[b, h, i, k] * present_sm[k, b, h // rep, j]   # was p @ present

and returns ``present_sm`` where ``present`` was (the graph records the permutation back to
``[B, H, P, D]``: ``compiler/lowering/graph.py`` ``place_kv_caches``, the runtime presents
that strided view).  ``rep`` is grouped-query attention's repeat_kv
(``reshape(broadcast_to(expand_dims(present, 2)))``, LLaMA's export): read through the index,
no repeated copy of the cache.

Fires only when safe: ``past`` is a model input whose only use is the concat (through the
exporters' one-input ``Concat``), the concat is on the sequence axis of rank-4 float32
tensors, ``present`` is returned once and read otherwise only by those matmuls (directly,
transposed, or through repeat_kv), and a cache row (``H * D`` elements) is a multiple of 64
bytes (kernels assume aligned buffers: the new rows start at ``P`` rows).  Anything else
keeps the copying concat; the reason is logged and counted in the report.  Runs before
fold_transpose_matmul (which would take the transposed read first).
"""

from __future__ import annotations

import logging

from tvm import relax, te, tirx, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from .context import GraphPass, PassReport
from .dataflow import Dataflow, dtype_of, nodes_of
from .place_concat import OPAQUE

log = logging.getLogger("onnxc.passes")

# the PrimFunc attribute extraction looks for: "past" (the input permute) or "append"
KV_ATTR = "onnxc.kv_cache"
RULE = "present = concat(past, new, axis=2) => sequence-major cache appended in place"
# storage [P, B, H, D] seen as the model's [B, H, P, D]
TO_SEQ_MAJOR = [2, 0, 1, 3]
ALIGN = 64


class SeqMajorCache(GraphPass):
    """Key/value caches concat(past, new) on the sequence axis => sequence-major, in place."""

    name = "seq_major_cache"
    opt_level = 1
    # cpu: False on targets whose runtime cannot hold a permuted cache (the driver sets it)
    options = {"cpu": True}

    def rewrite(self, mod, report: PassReport, options: dict):
        if not options["cpu"]:
            return mod
        df = Dataflow(mod)
        caches, refused = [], {}
        for p in mod["main"].params:
            found = _match(df, p)
            if isinstance(found, str):
                if found:
                    refused[found] = refused.get(found, 0) + 1
                    log.info("seq_major_cache: %s kept copying: %s", p.name, found)
                continue
            caches.append(found)
        for reason, n in refused.items():
            report.rewrites[f"kept copying: {reason}"] = n
        if not caches:
            return mod
        report.rewrites[RULE] = len(caches)
        names = report.node_names
        for c in caches:
            for k in nodes_of(c["concat"].name):
                label = names[k] if k < len(names) else f"n{k}"
                if label not in report.nodes:
                    report.nodes.append(label)
        return _Rewriter(mod, caches).run()


# -- matching ---------------------------------------------------------------------------
def _is_result(df: Dataflow, u) -> bool:
    """``u`` (a user) is the function's result or a tuple of it."""
    return u is None or isinstance(df.value(u), relax.Tuple)


def _first_in_concat(df: Dataflow, x):
    """(binding var, concat call) of a concat whose first input is ``x``, else None."""
    for u in df.users(x):
        call = df.call(u, "concat") if u is not None else None
        if call is not None and df.source(df.value(call.args[0]).fields[0]).same_as(
                df.source(x)):
            return u, call
    return None


def _match(df: Dataflow, p):
    """The cache rooted at model input ``p`` ({past, concat, new, reads, drop}), or why not
    ("" when ``p`` is no candidate at all: not a rank-4 input concatenated first into a
    model output)."""
    ty = p.ty
    if not isinstance(ty, relax.TensorType) or getattr(ty, "ndim", -1) != 4:
        return ""
    drop, x = [], p
    while True:  # the exporters' one-input Concat(past) is an identity
        found = _first_in_concat(df, x)
        if found is None:
            return ""
        concat, call = found
        fields = df.value(call.args[0]).fields
        if len(fields) == 1 and len(df.users(x)) == 1:
            drop.append(concat)
            x = concat
            continue
        break
    if not df.returned(concat):
        return ""  # no present: not a cache
    if len(df.users(x)) != 1:
        return "past is read by something other than the concat"
    if int(call.attrs.axis) % 4 != 2:
        return "the concat is not on the sequence axis (2)"
    if len(fields) != 2:
        return "the concat is not (past, new)"
    if dtype_of(concat) != "float32" or any(dtype_of(f) != "float32" for f in fields):
        return "not float32"
    shape = list(concat.ty.shape.values)
    row = [shape[1], shape[3]]
    if not all(isinstance(d, tirx.IntImm) for d in row) or \
            (row[0].value * row[1].value * 4) % ALIGN:
        return f"a cache row (heads x head_dim floats) is not a multiple of {ALIGN} bytes"
    users = df.users(concat)
    if sum(_is_result(df, u) for u in users) != 1:
        return "present is returned more than once"
    reads = []
    for u in users:
        if _is_result(df, u):
            continue
        found = _reads(df, u, concat, shape)
        if found is None:
            return "present is read by something other than the attention matmuls"
        drop += found[0]
        reads += found[1]
    return {"past": p, "concat": concat, "new": fields[1], "reads": reads, "drop": drop}


def _reads(df: Dataflow, u, present, shape) -> tuple | None:
    """How binding ``u`` reads ``present``: (the bindings between that the rewrite drops,
    [{matmul var, operand a, transposed, rep}]) when only attention matmuls read it (through
    repeat_kv, possibly transposed); else None."""
    e = df.call(u, "expand_dims")
    if e is None:
        one = _matmul_read(df, u, present, shape, 1)
        return None if one is None else (one[0], [one[1]])
    # repeat_kv: expand_dims(2) -> broadcast_to [B, KV, rep, T, D] -> reshape [B, H, T, D]
    if [int(a) for a in e.attrs.axis] != [2] or len(df.users(u)) != 1:
        return None
    b = df.users(u)[0]
    bc = df.call(b, "broadcast_to") if b is not None else None
    if bc is None or len(df.users(b)) != 1:
        return None
    r = df.users(b)[0]
    bshape = list(bc.ty.shape.values)
    if r is None or df.call(r, "reshape") is None or len(bshape) != 5 or \
            not isinstance(bshape[2], tirx.IntImm):
        return None
    rep = bshape[2].value
    rshape = list(df.value(r).ty.shape.values)
    if len(rshape) != 4 or not isinstance(rshape[1], tirx.IntImm) or \
            rshape[1].value != shape[1].value * rep:
        return None
    chain, reads = [u, b, r], []
    for v in df.users(r):
        one = _matmul_read(df, v, r, shape, rep) if v is not None else None
        if one is None:
            return None
        chain += one[0]
        reads.append(one[1])
    return chain, reads


def _matmul_read(df: Dataflow, x, operand, shape, rep: int) -> tuple | None:
    """(dropped bindings, {matmul, a, transposed, rep}) when binding ``x`` is
    ``matmul(a, operand)`` or ``matmul(a, permute_dims(operand, [0, 1, 3, 2]))``."""
    chain, transposed = [], False
    pd = df.call(x, "permute_dims")
    if pd is not None:
        if pd.attrs.axes is None or [int(a) for a in pd.attrs.axes] != [0, 1, 3, 2]:
            return None
        users = df.users(x)
        if len(users) != 1 or users[0] is None:
            return None
        chain.append(x)
        transposed, operand, x = True, x, users[0]
    mm = df.call(x, "matmul")
    if mm is None or not df.source(mm.args[1]).same_as(df.source(operand)):
        return None
    a = mm.args[0]
    if df.source(a).same_as(df.source(operand)) or df.source(a).same_as(df.source(x)):
        return None  # the cache on both sides: not attention
    ash = list(a.ty.shape.values) if isinstance(a.ty, relax.TensorType) and a.ty.shape else []
    if len(ash) != 4 or dtype_of(a) != "float32" or dtype_of(x) != "float32":
        return None
    if not isinstance(ash[1], tirx.IntImm) or ash[1].value != shape[1].value * rep:
        return None
    return chain, {"matmul": x, "a": a, "transposed": transposed, "rep": rep}


# -- the computes -----------------------------------------------------------------------
def to_seq_major(x):
    """``[B, H, P, D] -> [P, B, H, D]``."""
    return topi.transpose(x, TO_SEQ_MAJOR)


def scores_sm(q, cache, rep: int):
    """``out[b, h, i, j] = sum_k q[b, h, i, k] * cache[j, b, h // rep, k]`` (Q @ K^T over a
    sequence-major key cache; ``rep`` query heads share a key head)."""
    bq, hq, m, kk = q.shape
    n = cache.shape[0]
    k = te.reduce_axis((0, kk), "k")
    return te.compute((bq, hq, m, n), lambda b, h, i, j: te.sum(
        q[b, h, i, k] * cache[j, b, h // rep if rep > 1 else h, k], axis=k), name="scores_sm")


def context_sm(p, cache, rep: int):
    """``out[b, h, i, j] = sum_k p[b, h, i, k] * cache[k, b, h // rep, j]`` (P @ V over a
    sequence-major value cache)."""
    bp, hp, m, kk = p.shape
    d = cache.shape[3]
    k = te.reduce_axis((0, kk), "k")
    return te.compute((bp, hp, m, d), lambda b, h, i, j: te.sum(
        p[b, h, i, k] * cache[k, b, h // rep if rep > 1 else h, j], axis=k), name="context_sm")


# -- rewriting --------------------------------------------------------------------------
@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod, caches):
        super().__init__(mod)
        self.mod_in = mod
        self.caches = {c["concat"]: c for c in caches}
        self.reads = {r["matmul"]: (c, r) for c in caches for r in c["reads"]}
        self.drop = {v for c in caches for v in c["drop"]}
        self.present = {}  # concat var -> the new sequence-major var

    def run(self):
        func = self.mod_in["main"]
        body = self.visit_expr(func.body)
        new = relax.Function(func.params, body, body.ty, func.is_pure, func.attrs)
        out = self.builder_.get()
        out["main"] = new
        return relax.transform.DeadCodeElimination(["main"])(out)

    def visit_var_binding_(self, binding):
        var = binding.var
        if var in self.drop:
            return
        bb = self.builder_
        if var in self.caches:
            c = self.caches[var]
            past = bb.emit(bb.call_te(to_seq_major, self.visit_expr(c["past"]),
                                      primfunc_name_hint="kv_past",
                                      primfunc_attrs={"op_pattern": OPAQUE, KV_ATTR: "past"}),
                           name_hint=f"{var.name}_past")
            new = bb.emit(bb.call_te(to_seq_major, self.visit_expr(c["new"]),
                                     primfunc_name_hint="kv_rows"),
                          name_hint=f"{var.name}_rows")
            out = bb.call_te(topi.concatenate, [past, new], 0, primfunc_name_hint="kv_append",
                             primfunc_attrs={"op_pattern": OPAQUE, KV_ATTR: "append"})
            sm = bb.emit(out, name_hint=var.name)
            self.present[var] = sm
            self.set_var_remap(var, sm)  # the result tuple returns the new cache
            return
        if var in self.reads:
            c, r = self.reads[var]
            fn = scores_sm if r["transposed"] else context_sm
            value = bb.call_te(fn, self.visit_expr(r["a"]), self.present[c["concat"]],
                               r["rep"], primfunc_name_hint="matmul")
            new = bb.emit(value, name_hint=var.name)
            self.set_var_remap(var, new)
            return
        super().visit_var_binding_(binding)
