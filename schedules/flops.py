"""How many floating-point operations a kernel does: TVM's estimator, readable with Lets.

``tvm.s_tir.analysis.estimate_tir_flops`` has no rule for ``tirx.Let``, and kernels bind
values with Let where an expression would otherwise be copied into every use (the stable
sigmoid: inlining its input into each use of the exp polynomial made a conv + swish kernel
17x slower).  For counting, each ``Let(v, value, body)`` is substituted out, so the count is
what it was before the binding (the estimator does not see that the value is computed
once: elementwise math stays generously counted).  Used by the kernel table
(``compiler/lowering/graph.py``) and tuning (``schedules/tuning.py``).
"""

from __future__ import annotations


def estimate(func) -> int:
    """TVM's estimate of ``func``'s arithmetic (a multiply-add counts 2); 0 if it has none
    or the estimator cannot read it."""
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir.analysis import estimate_tir_flops

    def on_let(let, mutator):
        value, body = mutator.mutate(let.value), mutator.mutate(let.body)
        var = let.var
        return tvm_ffi.structural_mutate(
            body, [(tirx.Var, lambda v, _: value if v.same_as(var) else v)])

    try:
        countable = tvm_ffi.structural_mutate(func, [(tirx.Let, on_let)])
        return int(estimate_tir_flops(tvm.IRModule({"main": countable})))
    except Exception:  # estimation is best effort: a kernel it cannot read reports 0
        return 0
