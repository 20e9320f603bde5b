"""How many floating-point operations a kernel does: TVM's estimator, read per block.

* A block with a reduction (matmul, conv, pooling, a norm's or softmax's sums) counts as
  TVM's ``tvm.s_tir.analysis.estimate_tir_flops`` counts it: every arithmetic operation
  of its body per iteration (a multiply-add is 2).  The estimator has no rule for
  ``tirx.Let``, which kernels use to bind a value read several times, so each
  ``Let(v, value, body)`` is substituted out first.
* A block without one (an elementwise op: a bias add, an activation) counts one operation
  per element it writes where its value does floating-point work, none where it only
  moves data (a copy, a cast, a transpose, a padding or masking select).  TVM's estimator
  counts no call (``T.exp``: 0) but every operation of a polynomial: a Mish written as
  vectorisable arithmetic (``passes/math_f32``) counted 56.9 GFLOP in CSPDarknet53, whose
  convs do 13.6, and the benchmark printed 220% of the machine's peak.  One per
  elementwise op per element is the convention of FLOP counters (fvcore and thop count
  activations so or not at all).

Used by the kernel table (``compiler/lowering/graph.py``) and tuning
(``schedules/tuning.py``).
"""

from __future__ import annotations

_REDUCE = 2  # IterVar.iter_type of a reduction axis (kCommReduce)


def estimate(func) -> int:
    """The arithmetic of ``func`` as above (reductions by TVM's estimate, elementwise ops
    one per element written); 0 if it has none or the estimator cannot read it."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx
    from tvm.s_tir.analysis import estimate_tir_flops

    def on_let(let, mutator):
        value, body = mutator.mutate(let.value), mutator.mutate(let.body)
        var = let.var
        return tvm_ffi.structural_mutate(
            body, [(tirx.Var, lambda v, _: value if v.same_as(var) else v)])

    spatial = []  # per enclosing block: whether it has no reduction axis

    def on_block(block, mutator):
        spatial.append(not any(int(iv.iter_type) == _REDUCE for iv in block.iter_vars))
        try:
            return mutator.default_mutate(block)
        finally:
            spatial.pop()

    def on_store(store, mutator):
        if not (spatial and spatial[-1]) or not _computes(store.value):
            return mutator.default_mutate(store)
        one = tirx.const(0, str(store.value.ty))
        return tirx.BufferStore(store.buffer, tirx.Add(one, one), store.indices)

    try:
        countable = tvm_ffi.structural_mutate(func, [(tirx.Let, on_let),
                                                     (s_tir.SBlock, on_block),
                                                     (tirx.BufferStore, on_store)])
        return int(estimate_tir_flops(tvm.IRModule({"main": countable})))
    except Exception:  # estimation is best effort: a kernel it cannot read reports 0
        return 0


def _computes(value) -> bool:
    """Whether an elementwise value does floating-point work: an operation or call whose
    result is a float, or a comparison of floats (a ReLU as a select).  Reads, constants,
    casts and selects themselves move data (a padding select, a masked fill); index
    arithmetic is integer."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    load = tvm.ir.TensorLoad  # what tirx.BufferLoad builds (TVM 0.27)
    compares = (tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE)
    found = []

    def floating(e) -> bool:
        return str(getattr(e, "ty", "")).startswith(("float", "bfloat"))

    def visit(node, visitor):
        if isinstance(node, load) or found:
            return None  # a load's indices address, they do not compute
        if isinstance(node, compares):
            work = floating(node.a)
        elif isinstance(node, (tirx.Var, tirx.IntImm, tirx.FloatImm, tirx.Cast, tirx.Select)):
            work = False
        elif isinstance(node, tvm.ir.Call) and \
                getattr(node.op, "name", "").endswith(".if_then_else"):
            work = False
        else:
            work = isinstance(node, tvm.ir.Expr) and floating(node)
        if work:
            found.append(node)
            return None
        return visitor.default_visit(node)

    tvm_ffi.structural_visit(value, visit)
    return bool(found)
