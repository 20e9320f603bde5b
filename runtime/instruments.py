"""Profiling and NaN/Inf checks for a Session: the instrumented run path.

Off means free: a session without these options runs the plain loop in ``Session.run``;
this module is only used when ``SessionOptions.enable_profiling`` or ``check_nan`` is set.
The trace is Chrome-trace JSON (opens in Perfetto / chrome://tracing), one complete ("X")
event per kernel call.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import numpy as np


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
        :class:`NonFiniteError` at the first hit.
    intra_op_num_threads : int
        Threads each kernel's parallel loops use; 0 (default) = the cores the model was
        compiled for, at most the CPUs available (``runtime/threads.py``).
    """

    enable_profiling: bool = False
    profile_file_prefix: str = "onnxc_profile"
    check_nan: bool = False
    intra_op_num_threads: int = 0


class NonFiniteError(RuntimeError):
    """A kernel produced NaN or Inf; the message names the kernel, nodes and tensor."""


def _count_nonfinite(a: np.ndarray) -> tuple[int, int]:
    if a.dtype.kind != "f" or a.size == 0:
        return 0, 0
    return int(np.isnan(a).sum()), int(np.isinf(a).sum())


def check_outputs(call: dict, views: list, tensors: list) -> None:
    """Raise NonFiniteError if an output of ``call`` holds NaN or Inf."""
    nin = len(call["args"]) - call["num_outputs"]
    for t in call["args"][nin:]:
        nan, inf = _count_nonfinite(views[t])
        if not (nan or inf):
            continue
        bad_inputs = []
        for i in call["args"][:nin]:
            n_i, f_i = _count_nonfinite(views[i])
            if n_i or f_i:
                bad_inputs.append(f"{tensors[i]['name']} ({n_i} NaN, {f_i} Inf)")
        origin = (f"its inputs already had some: {', '.join(bad_inputs)}" if bad_inputs
                  else "its inputs were all finite, so this kernel produced them")
        nodes = ", ".join(call.get("nodes") or []) or "(node names not recorded)"
        raise NonFiniteError(
            f"kernel {call['kernel']} (ONNX nodes: {nodes}; ops: {call.get('ops')}) wrote "
            f"{nan} NaN and {inf} Inf into tensor {tensors[t]['name']!r} of shape "
            f"{list(views[t].shape)}; {origin}")


class Profiler:
    """Collects one event per kernel call; writes a Chrome trace and a summary."""

    def __init__(self, prefix: str, peak_gflops: float | None = None):
        self.prefix = prefix
        self.peak_gflops = peak_gflops  # the session's nominal fp32 peak (cpu_features)
        self.events: list = []
        self._t0 = time.perf_counter_ns()

    def record(self, call: dict, start_ns: int, end_ns: int, tensors: list, run_index: int):
        dur_us = (end_ns - start_ns) / 1e3
        nin = len(call["args"]) - call["num_outputs"]
        flops = call.get("flops", 0)
        self.events.append({
            "name": call["kernel"], "cat": "kernel", "ph": "X", "pid": os.getpid(), "tid": 0,
            "ts": (start_ns - self._t0) / 1e3, "dur": dur_us,
            "args": {"nodes": call.get("nodes", []), "op_types": call.get("ops", ""),
                     "inputs": [tensors[i]["shape"] for i in call["args"][:nin]],
                     "outputs": [tensors[o]["shape"] for o in call["args"][nin:]],
                     "flops": flops,
                     "gflops_per_s": round(flops / (dur_us * 1e3), 3) if dur_us > 0 else 0.0,
                     "run": run_index},
        })

    def write(self) -> str:
        path = f"{self.prefix}_{time.strftime('%Y%m%d_%H%M%S')}.json"
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)
        return path

    def summary(self, top: int = 10) -> str:
        """Top kernels by total time, with share, GFLOP/s and the share of the nominal peak
        (``cpu_features.nominal_peak_gflops``) they reach; then the whole run's."""
        by_kernel: dict = {}
        for e in self.events:
            k = by_kernel.setdefault(e["name"], [0.0, 0, e["args"]["flops"]])
            k[0] += e["dur"]
            k[1] += 1
        total = sum(v[0] for v in by_kernel.values()) or 1.0
        peak = self.peak_gflops

        def of_peak(gfs):
            return f"{gfs / peak:>7.1%}" if peak else f"{'-':>7}"

        lines = [f"{'kernel':<40} {'calls':>6} {'total ms':>10} {'share':>7} {'GFLOP/s':>9} "
                 f"{'% peak':>7}"]
        for name, (dur, n, flops) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
            gfs = flops * n / (dur * 1e3) if dur else 0.0
            lines.append(f"{name[:40]:<40} {n:>6} {dur / 1e3:>10.3f} {dur / total:>7.1%} "
                         f"{gfs:>9.2f} {of_peak(gfs)}")
        all_flops = sum(e["args"]["flops"] for e in self.events)
        gfs = all_flops / (total * 1e3)
        lines.append(f"{len(self.events)} kernel calls, {total / 1e3:.3f} ms in kernels, "
                     f"{gfs:.2f} GFLOP/s"
                     + (f" = {gfs / peak:.1%} of the nominal fp32 peak {peak:.0f} GFLOP/s"
                        if peak else ""))
        return "\n".join(lines)
