"""cpu.recurrence (schedules/cpu/recurrence.py): an LSTM / GRU / RNN layer's recurrence as one
kernel over every step, written already scheduled, against numpy's recurrence."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from schedules import apply_schedules
from schedules.cpu.recurrence import GATES, RULE, chunk, pack, recurrence_kernel
from tests.schedules.util import TARGET


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _reference(kind, xw, r, rb, h0, c0, reverse):
    steps, hidden = xw.shape[0], h0.shape[1]
    h, c, ys = h0.copy(), c0.copy(), np.zeros(xw.shape[:2] + (hidden,), np.float32)
    for i in range(steps):
        t = steps - 1 - i if reverse else i
        acc = h @ r.T + rb.reshape(-1)
        x = xw[t]
        if kind == "LSTM":
            gi, go, gf, gc = (acc[:, k * hidden:(k + 1) * hidden] + x[:, k * hidden:(k + 1) * hidden]
                              for k in range(4))
            c = _sigmoid(gf) * c + _sigmoid(gi) * np.tanh(gc)
            h = _sigmoid(go) * np.tanh(c)
        elif kind == "GRU":
            z = _sigmoid(acc[:, :hidden] + x[:, :hidden])
            rr = _sigmoid(acc[:, hidden:2 * hidden] + x[:, hidden:2 * hidden])
            h = (1 - z) * np.tanh(x[:, 2 * hidden:] + rr * acc[:, 2 * hidden:]) + z * h
        else:
            h = np.tanh(acc + x)
        ys[t] = h
    return ys, h, c


def test_kept_as_written_parallel_vectorised_no_libm_calls():
    """The rules leave the kernel as written (its rule named in the kernel table), with its
    per-step loop parallel and the gates vectorised; tanh and sigmoid are arithmetic (TVM
    lowered them to a scalar expf call per lane: most of a step's time)."""
    func = recurrence_kernel("LSTM", 256, False, 16)
    mod, rules = apply_schedules(tvm.IRModule({"rec": func}), _Target())
    assert rules == {"rec": RULE}
    text = mod["rec"].script()
    assert "T.parallel" in text and "T.vectorized" in text
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), TARGET)
    asm = lib.mod.inspect_source("asm")
    assert "vfmadd" in asm and "expf" not in asm and "tanhf" not in asm


class _Target:
    """What apply_schedules reads of a targets.TargetInfo."""

    def tvm_target(self):
        return TARGET


@pytest.mark.parametrize("kind", list(GATES))
@pytest.mark.parametrize("hidden,reverse", [(64, False), (32, True), (21, False)])
def test_matches_numpy(kind, hidden, reverse):
    """Every kind, both directions, hidden sizes of whole vector chunks (64: 2 x 32) and
    none (21: one task per batch entry), over 13 steps of a batch of 3."""
    g = GATES[kind]
    rng = np.random.default_rng(hidden)
    steps, batch = 13, 3
    xw = rng.standard_normal((steps, batch, g * hidden)).astype(np.float32)
    r = (rng.standard_normal((g * hidden, hidden)) * 0.2).astype(np.float32)
    rb = (rng.standard_normal((g, hidden)) * 0.2).astype(np.float32)
    h0, c0 = (rng.standard_normal((batch, hidden)).astype(np.float32) for _ in range(2))
    host = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    lib = tvm.compile(tvm.IRModule({"main": recurrence_kernel(kind, hidden, reverse, 16)
                                    .with_attr("global_symbol", "main")}), host)
    outs = [np.zeros((steps, batch, hidden), np.float32), np.zeros((batch, hidden), np.float32),
            np.zeros((batch, hidden), np.float32)]
    args = [tvm.runtime.tensor(a) for a in (xw, pack(r, kind, 16), rb, h0, c0, *outs)]
    lib["main"](*args)
    want = _reference(kind, xw, r, rb, h0, c0, reverse)
    for got, w in zip(args[5:], want if kind == "LSTM" else want[:2]):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-5, atol=2e-6)


def test_chunks_are_whole_vectors_or_the_layer():
    assert chunk(256, 16) == 32 and chunk(48, 16) == 16 and chunk(40, 8) == 8
    assert chunk(21, 16) == 21 and chunk(16, 16) == 16  # one chunk: the whole layer
