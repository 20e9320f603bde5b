"""Profiling and NaN/Inf checks for a Session: the instrumented run path.

Off means free: a session without these options runs the plain loop in ``Session.run``;
this module is only used when ``SessionOptions.enable_profiling`` or ``check_nan`` is set.
The trace is Chrome-trace JSON (opens in Perfetto / chrome://tracing), one complete ("X")
event per kernel call.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from .dims import ShapeExpr


@dataclass
class SessionOptions:
    """Options of a Session, named as onnxruntime names them where they overlap.

    Attributes
    ----------
    enable_profiling : bool
        Time every kernel call; ``Session.end_profiling()`` writes the trace.
    profile_file_prefix : str
        The trace is written to ``<prefix>_<timestamp>.json``.
    check_nan : bool
        After each kernel, check its float outputs for NaN/Inf and raise
        :class:`NonFiniteError` at the first hit, naming the ONNX node that made them (a
        fused kernel is re-run step by step through its checked variant, only then).
    intra_op_num_threads : int
        Threads each kernel's parallel loops use; 0 (default) = the cores the model was
        compiled for, at most the CPUs available (``runtime/threads.py``).
    bind_io : bool
        True (default): kernels write the requested outputs straight into the arrays
        ``run()`` returns, and read an input in place when the caller's array is C-contiguous,
        writable and 64-byte aligned (no copy either way).  False keeps every tensor in the
        session's arena, where tools read them after a run (``onnxc debug``).  Profiling and
        NaN checks always run in the arena.
    reuse_outputs : bool
        True (default): the memory of a bound output whose returned array the caller has
        dropped (no array, view or export of it left) is written again by a later run
        instead of fresh memory (``runtime/output_pool.py``): no allocation, no page faults,
        no new TVM tensor.  False: fresh memory every run.
    """

    enable_profiling: bool = False
    profile_file_prefix: str = "onnxc_profile"
    check_nan: bool = False
    intra_op_num_threads: int = 0
    bind_io: bool = True
    reuse_outputs: bool = True


class NonFiniteError(RuntimeError):
    """A kernel produced NaN or Inf; the message names the node that made them (or says that
    they came in through a model input or param), the kernel, its nodes and the tensor."""


def _count_nonfinite(a: np.ndarray) -> tuple[int, int]:
    if a.dtype.kind != "f" or a.size == 0:
        return 0, 0
    return int(np.isnan(a).sum()), int(np.isinf(a).sum())


def inplace_inputs(graph: dict) -> list:
    """Per call, the input tensor ids whose storage an output of that call reuses (in-place
    kernels): their values must be saved before the call for a check to see them after."""
    tensors = graph["tensors"]
    at_max = {d["name"]: d["max"] for d in graph.get("dims") or []}

    def span(t):  # (buffer, first byte, end byte) of an arena tensor, else None
        tt = tensors[t]
        if tt["storage"] != "arena":
            return None
        start = tt.get("offset", 0)  # a placed concat's member sits inside its buffer
        if isinstance(start, str):  # a cache's new rows: where they start at the maxima
            start = ShapeExpr([start], at_max)(at_max)[0]
        size = math.prod(ShapeExpr(tt["shape"], at_max)(at_max)) * np.dtype(tt["dtype"]).itemsize
        return tt["index"], start, start + size

    out = []
    for call in graph["calls"]:
        nin = len(call["args"]) - call["num_outputs"]
        written = [s for s in map(span, call["args"][nin:]) if s is not None]
        out.append([i for i in call["args"][:nin] if (s := span(i)) is not None and any(
            s[0] == w[0] and s[1] < w[2] and w[1] < s[2] for w in written)])
    return out


def check_outputs(call: dict, views: list, tensors: list, kernels=None,
                  saved: dict | None = None, model_inputs=()) -> None:
    """Raise NonFiniteError if an output of ``call`` holds NaN or Inf.

    The scan is the only cost while values are finite.  On a hit, a fused kernel with a
    checked variant (``call["checked"]``, compiler/lowering/checked.py) in ``kernels`` is
    re-run step by step on the same inputs (``saved`` holds inputs that the call overwrote
    in place), and the error blames the first ONNX node that read only finite values and
    wrote NaN or Inf; a node that only passed on non-finite input is never blamed."""
    nin = len(call["args"]) - call["num_outputs"]
    saved = saved or {}
    for t in call["args"][nin:]:
        nan, inf = _count_nonfinite(views[t])
        if not (nan or inf):
            continue
        inputs = [saved.get(i, views[i]) for i in call["args"][:nin]]
        bad_inputs = []
        for i, a in zip(call["args"][:nin], inputs):
            n_i, f_i = _count_nonfinite(a)
            if n_i or f_i:
                kind = (", a model input" if i in model_inputs else
                        ", a param" if tensors[i]["storage"] == "param" else "")
                bad_inputs.append(f"{tensors[i]['name']!r} ({n_i} NaN, {f_i} Inf{kind})")
        nodes = ", ".join(call.get("nodes") or []) or "(node names not recorded)"
        kernel = f"kernel {call['kernel']} (ONNX nodes: {nodes}; ops: {call.get('ops')})"
        out = f"tensor {tensors[t]['name']!r} of shape {list(views[t].shape)}"
        if bad_inputs:
            raise NonFiniteError(
                f"{kernel} wrote {nan} NaN and {inf} Inf into {out}; its inputs already had "
                f"some: {', '.join(bad_inputs)}, so no node of this kernel created them: "
                "check the model's inputs (or its params)")
        blame = None
        if call.get("checked") and kernels is not None:
            blame = locate_nonfinite(call, inputs, views, kernels)
        elif len(call.get("nodes") or []) == 1:
            blame = (f"node {call['nodes'][0]!r} ({call.get('ops')}) read only finite values "
                     f"and wrote {nan} NaN and {inf} Inf into {out}")
        if blame:
            raise NonFiniteError(f"{blame}; inside {kernel}, whose output {out} holds {nan} "
                                 f"NaN and {inf} Inf")
        raise NonFiniteError(f"{kernel} wrote {nan} NaN and {inf} Inf into {out}; its inputs "
                             "were all finite, so this kernel produced them (it has no checked "
                             "variant to name the node inside)")


def _aligned(shape, dtype: str) -> np.ndarray:
    """A zeroed array whose data is 64-byte aligned (the kernels assume it)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.zeros(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + nbytes].view(dt).reshape(shape)


def run_checked(call: dict, inputs: list, views: list, kernels) -> list:
    """Run the checked variant of ``call`` on ``inputs``; returns each step's result (numpy
    arrays, fresh: the session's memory is not written)."""
    import tvm

    nin = len(call["args"]) - call["num_outputs"]
    checked = call["checked"]
    outs = [_aligned(views[o].shape, views[o].dtype.name) for o in call["args"][nin:]]
    temps = [_aligned(t["shape"], t["dtype"]) for t in checked["temps"]]
    args = [a if a.flags.c_contiguous and a.ctypes.data % 64 == 0 else _copy_aligned(a)
            for a in inputs]
    kernels[checked["kernel"]](*[tvm.runtime.from_dlpack(a) for a in args + outs + temps])
    return [outs[k] if kind == "out" else temps[k] for kind, k in
            (s["place"] for s in checked["steps"])]


def _copy_aligned(a: np.ndarray) -> np.ndarray:
    out = _aligned(a.shape, a.dtype.name)
    np.copyto(out, a)
    return out


def locate_nonfinite(call: dict, inputs: list, views: list, kernels) -> str | None:
    """The first step of ``call``'s checked variant that read only finite values and wrote
    NaN or Inf, described for the error; None if every non-finite step read non-finite
    values (then the kernel's inputs are to blame)."""
    results = run_checked(call, inputs, views, kernels)
    finite_in = [_count_nonfinite(a) == (0, 0) for a in inputs]
    finite_step: list = []
    for step, value in zip(call["checked"]["steps"], results):
        nan, inf = _count_nonfinite(value)
        reads_finite = all(finite_in[k] if kind == "in" else finite_step[k]
                           for kind, k in step["reads"])
        finite_step.append(not (nan or inf))
        if (nan or inf) and reads_finite:
            tensor = step.get("tensor") or step.get("binding")
            node = step.get("node") or "(an unnamed node)"
            return (f"node {node!r} ({step.get('op') or '?'}) read only finite values and wrote "
                    f"{nan} NaN and {inf} Inf into tensor {tensor!r} of shape "
                    f"{list(value.shape)}")
    return None


class Profiler:
    """Collects one event per kernel call; writes a Chrome trace and a summary."""

    def __init__(self, prefix: str, peak_gflops: float | None = None, placed=()):
        self.prefix = prefix
        self.peak_gflops = peak_gflops  # the session's nominal fp32 peak (cpu_features)
        self.placed = list(placed)      # the graph's placed_concats: ONNX nodes with no call
        self.events: list = []
        self._t0 = time.perf_counter_ns()

    def record(self, call: dict, start_ns: int, end_ns: int, tensors: list, run_index: int,
               binding: dict | None = None):
        """One kernel call.  ``binding``: the run's symbolic dims; a call counted at other
        values (``flops_at``, the compile's opt) has unknown FLOPs (None), not that count."""
        dur_us = (end_ns - start_ns) / 1e3
        nin = len(call["args"]) - call["num_outputs"]
        flops = call.get("flops", 0)
        at = call.get("flops_at")
        if at and any((binding or {}).get(d) != v for d, v in at.items()):
            flops = None
        self.events.append({
            "name": call["kernel"], "cat": "kernel", "ph": "X", "pid": os.getpid(), "tid": 0,
            "ts": (start_ns - self._t0) / 1e3, "dur": dur_us,
            "args": {"nodes": call.get("nodes", []), "op_types": call.get("ops", ""),
                     "inputs": [tensors[i]["shape"] for i in call["args"][:nin]],
                     "outputs": [tensors[o]["shape"] for o in call["args"][nin:]],
                     "flops": flops,
                     "gflops_per_s": None if flops is None else (
                         round(flops / (dur_us * 1e3), 3) if dur_us > 0 else 0.0),
                     "run": run_index},
        })

    def write(self) -> str:
        path = f"{self.prefix}_{time.strftime('%Y%m%d_%H%M%S')}.json"
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)
        return path

    def summary(self, top: int = 10) -> str:
        """Top kernels by total time, with share, GFLOP/s and the share of the nominal peak
        (``cpu_features.nominal_peak_gflops``) they reach; then the whole run's.  Calls whose
        FLOPs are unknown (symbolic dims at other values than the compile's opt) show "-",
        and the run's rate covers the other calls only, saying so."""
        by_kernel: dict = {}  # name -> [us, calls, us of known FLOPs, FLOPs]
        for e in self.events:
            k = by_kernel.setdefault(e["name"], [0.0, 0, 0.0, 0])
            k[0] += e["dur"]
            k[1] += 1
            if e["args"]["flops"] is not None:
                k[2] += e["dur"]
                k[3] += e["args"]["flops"]
        total = sum(v[0] for v in by_kernel.values()) or 1.0
        peak = self.peak_gflops

        def rate(flops, us):
            if not us:
                return f"{'-':>9} {'-':>7}"
            gfs = flops / (us * 1e3)
            return f"{gfs:>9.2f} " + (f"{gfs / peak:>7.1%}" if peak else f"{'-':>7}")

        lines = [f"{'kernel':<40} {'calls':>6} {'total ms':>10} {'share':>7} {'GFLOP/s':>9} "
                 f"{'% peak':>7}"]
        for name, (dur, n, known_us, flops) in sorted(by_kernel.items(),
                                                       key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"{name[:40]:<40} {n:>6} {dur / 1e3:>10.3f} {dur / total:>7.1%} "
                         f"{rate(flops, known_us)}")
        known = [e for e in self.events if e["args"]["flops"] is not None]
        known_us = sum(e["dur"] for e in known)
        gfs = sum(e["args"]["flops"] for e in known) / (known_us * 1e3) if known_us else 0.0
        line = f"{len(self.events)} kernel calls, {total / 1e3:.3f} ms in kernels"
        if known:
            line += (f", {gfs:.2f} GFLOP/s"
                     + (f" = {gfs / peak:.1%} of the nominal fp32 peak {peak:.0f} GFLOP/s"
                        if peak else ""))
        if len(known) < len(self.events):
            line += (f" ({'over ' + str(len(known)) + ' calls: ' if known else ''}"
                     f"{len(self.events) - len(known)} ran at symbolic dims other than the "
                     "compile's opt, where their FLOPs were counted: GFLOP/s unknown)")
        lines.append(line)
        if self.placed:
            lines.append(f"{len(self.placed)} Concat nodes by placement, no kernel call (their "
                         "inputs are written in place inside the output's buffer): "
                         + ", ".join(n for p in self.placed for n in p["nodes"]))
        return "\n".join(lines)
