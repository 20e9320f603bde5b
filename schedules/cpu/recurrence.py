"""The recurrence of an LSTM / GRU / RNN layer as one CPU kernel over every step.

``compiler/frontend/converters/rnn.py`` computes a layer's input projection for all steps
at once (``xw = X W^T + biases``: one matmul, ``cpu.matmul_packed``) and hands the
recurrence to this kernel, written here already scheduled (``PRESCHEDULED``: the rules
leave it as it is)::

    for t in steps (forward or reverse):              # serial: h_t needs h_{t-1}
        parallel over (batch entry b, chunk of CH hidden units j):
            hl = h_{t-1}[b, :]                        # copied once per task
            acc[g, j] = rb[g, j] + sum_k hl[k] * rp[k, g, j]     # gates g, CH units as
                                                                   # vectors, k serial
            cell update of the CH units (ONNX's gate order and equations)
            y[t, b, j] = h_t[b, j]

``rp[j // CH, k, g, j % CH] = R[g * H + j, k]`` (packed at import: a task streams one
contiguous block of its units' weights; laid out ``[k, g, j]`` each task read four
strided streams and a step of a 256-unit LSTM took 38 us instead of 18), ``rb`` the recurrent bias where the equations keep it apart (GRU's
``linear_before_reset``), else zeros.  Each step's parallel loop is one launch of the
runtime's pool, its join the barrier between steps: the chunk's tasks read ``h_{t-1}``
from the previous row of ``y`` while writing row ``t``, and the cell state ``c`` is
updated in place, each unit by its own task only.  The number of steps and the batch are
the buffers' (symbolic) extents: one kernel serves every sequence length.

Unrolled (the previous form, kept for what this kernel does not cover), a layer was a
few kernels per step: compile time grew with the length (500 steps of an LSTM: 2000
kernel calls, 23 s) and a symbolic length compiled per shape.
"""

from __future__ import annotations

# the attribute marking a kernel written already scheduled (schedules.apply_schedules
# leaves it alone), its value the rule name the kernel table shows
PRESCHEDULED = "onnxc.prescheduled"
RULE = "cpu.recurrence"

_TEMPLATE = '''
@T.prim_func(private=True)
def main(var_xw: T.handle, rp: T.Buffer(({NJ}, {H}, {G}, {CH}), "float32"),
         rb: T.Buffer(({G}, {H}), "float32"), var_h0: T.handle, var_c0: T.handle,
         var_y: T.handle, var_hT: T.handle, var_cT: T.handle):
    T.func_attr({{"tirx.noalias": True, "{attr}": "{rule}"}})
    S = T.int64()
    B = T.int64()
    xw = T.match_buffer(var_xw, (S, B, {GH}), "float32")
    h0 = T.match_buffer(var_h0, (B, {H}), "float32")
    c0 = T.match_buffer(var_c0, (B, {H}), "float32")
    y = T.match_buffer(var_y, (S, B, {H}), "float32")
    hT = T.match_buffer(var_hT, (B, {H}), "float32")
    cT = T.match_buffer(var_cT, (B, {H}), "float32")
    for t in range(S):
        for bj in T.parallel(B * {NJ}):
            hl = T.alloc_buffer(({H},), "float32", scope="local")
            acc = T.alloc_buffer(({G}, {CH}), "float32", scope="local")
            for k in range({H}):
                hl[k] = T.if_then_else(t == T.int64(0), h0[bj // {NJ}, k],
                                       y[{prev}, bj // {NJ}, k])
            for g in T.unroll({G}):
                for v in T.vectorized({CH}):
                    acc[g, v] = rb[g, bj % {NJ} * {CH} + v]
            for k in range({H}):
                for g in T.unroll({G}):
                    for v in T.vectorized({CH}):
                        acc[g, v] = acc[g, v] + hl[k] * rp[bj % {NJ}, k, g, v]
            for v in T.vectorized({CH}):
{cell}
    for b, j in T.grid(B, {H}):
        hT[b, j] = y[{last}, b, j]
'''

# the cell update of CH units (``v``), per kind: ONNX's equations with the default
# activations; ``x(g)`` is the input projection of gate g at this step
_INDENT = " " * 16


def _cell(kind: str, hidden: int, nj: int, ch: int, step: str) -> str:
    unit = f"bj % {nj} * {ch} + v"
    b = f"bj // {nj}"

    def x(g):
        return f"xw[{step}, {b}, {g * hidden} + {unit}]"

    # statements on the accumulators in place, no Let bindings (TVM's vectoriser
    # computed a vectorised loop's Let values wrongly: LSTM outputs off by 1.5), and the
    # activations of plain loads (``_vector_math`` reads their argument several times)
    if kind == "LSTM":  # gates i, o, f, c
        cp = f"T.if_then_else(t == T.int64(0), c0[{b}, {unit}], cT[{b}, {unit}])"
        lines = [f"acc[{g}, v] = acc[{g}, v] + {x(g)}" for g in range(4)] + [
            "acc[0, v] = T.sigmoid(acc[0, v])",
            "acc[1, v] = T.sigmoid(acc[1, v])",
            "acc[2, v] = T.sigmoid(acc[2, v])",
            "acc[3, v] = T.tanh(acc[3, v])",
            f"cT[{b}, {unit}] = acc[2, v] * {cp} + acc[0, v] * acc[3, v]",
            f"y[{step}, {b}, {unit}] = acc[1, v] * T.tanh(cT[{b}, {unit}])",
        ]
    elif kind == "GRU":  # gates z, r, h; linear_before_reset: r scales (h R_h^T + Rb_h)
        lines = [f"acc[{g}, v] = acc[{g}, v] + {x(g)}" for g in range(2)] + [
            "acc[0, v] = T.sigmoid(acc[0, v])",
            "acc[1, v] = T.sigmoid(acc[1, v])",
            f"acc[2, v] = {x(2)} + acc[1, v] * acc[2, v]",
            "acc[2, v] = T.tanh(acc[2, v])",
            f"y[{step}, {b}, {unit}] = (T.float32(1) - acc[0, v]) * acc[2, v] "
            f"+ acc[0, v] * hl[{unit}]",
        ]
    else:  # RNN, tanh
        lines = [f"acc[0, v] = acc[0, v] + {x(0)}",
                 f"y[{step}, {b}, {unit}] = T.tanh(acc[0, v])"]
    return "\n".join(_INDENT + line for line in lines)


GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def chunk(hidden: int, lanes: int) -> int:
    """Hidden units per task: one or two vectors, else the whole layer (odd sizes)."""
    for ch in (2 * lanes, lanes):
        if hidden % ch == 0 and hidden // ch >= 2:
            return ch
    return hidden


def pack(r, kind: str, lanes: int):
    """``rp`` of one direction's recurrent weight ``r`` [G*H, H] (numpy)."""
    import numpy as np

    g = GATES[kind]
    hidden = r.shape[1]
    ch = chunk(hidden, lanes)
    # r[g*H + jc*CH + v, k] -> rp[jc, k, g, v]
    return np.ascontiguousarray(
        r.reshape(g, hidden // ch, ch, hidden).transpose(1, 3, 0, 2)).astype(np.float32)


def recurrence_kernel(kind: str, hidden: int, reverse: bool, lanes: int):
    """The PrimFunc of one direction of a ``kind`` layer (``GATES``) of ``hidden`` units:
    arguments (xw [S, B, G*H], rp [H / CH, H, G, CH] (``pack``), rb [G, H], h0 [B, H],
    c0 [B, H]) and outputs
    (y [S, B, H], hT [B, H], cT [B, H]: the last cell state, LSTM only; the others
    leave it as c0 had it)."""
    import tvm

    g = GATES[kind]
    ch = chunk(hidden, lanes)
    nj = hidden // ch
    step = "S - T.int64(1) - t" if reverse else "t"
    prev = "S - t" if reverse else "t - T.int64(1)"
    last = "T.int64(0)" if reverse else "S - T.int64(1)"
    cell = _cell(kind, hidden, nj, ch, step)
    if kind != "LSTM":  # the cell state output carries c0 (the converter drops it)
        cell += "\n" + _INDENT + f"cT[bj // {nj}, bj % {nj} * {ch} + v] = " \
                                 f"c0[bj // {nj}, bj % {nj} * {ch} + v]"
    src = _TEMPLATE.format(H=hidden, G=g, GH=g * hidden, NJ=nj, CH=ch, prev=prev, last=last,
                           cell=cell, attr=PRESCHEDULED, rule=RULE)
    return _vector_math(tvm.script.from_source(src))


def _vector_math(func):
    """``func`` with tanh and sigmoid as the vectorisable float32 arithmetic of
    ``passes/math_f32.py`` (``sigmoid(x) = tanh(x / 2) / 2 + 1 / 2``): TVM lowers both to a
    scalar libm ``expf`` per vector lane (224 calls per step of a 256-unit LSTM, most of
    its time)."""
    import tvm
    import tvm_ffi
    from tvm.ir.expr import Call

    from passes.math_f32 import const, tanh_f32

    tanh, sigmoid = tvm.ir.Op.get("tirx.tanh"), tvm.ir.Op.get("tirx.sigmoid")

    def on_call(call, mutator):
        # (the template nests no activation inside another call)
        if call.op.same_as(tanh):
            return tanh_f32(call.args[0])
        if call.op.same_as(sigmoid):
            return tanh_f32(call.args[0] * const(0.5)) * const(0.5) + const(0.5)
        return call

    return tvm_ffi.structural_mutate(func, [(Call, on_call)])
