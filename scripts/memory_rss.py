#!/usr/bin/env python3
"""Peak memory and load time: onnxruntime against onnxc, each in a fresh child process.

For one model, a child process per engine (and per ``--repeat``) does exactly this and
reports its own figures:

* ``onnxruntime``  ``InferenceSession(model.onnx)`` (CPU provider), then one ``run``;
* ``onnxc``        ``runtime.load(model.so)``, then one ``run``.

``load`` is the wall time of that one call (session creation / artifact load); ``peak``
is the child's peak resident set (``VmHWM`` of ``/proc/self/status``; ``ru_maxrss`` where
that is missing), measured after the run, and ``after imports`` the resident set before
the session is created (Python, numpy and the engine's library).  ``file`` / ``anon``
split the resident set at the end into file-backed pages (mappings of the model or
artifact, shared with the page cache) and anonymous memory.  The model is compiled once
(``compiler.compile`` in a child process) to ``--so``, or ``--so`` is used as it is.

    python scripts/memory_rss.py /work/real_models/bert_base.onnx
    python scripts/memory_rss.py MODEL.onnx --so /tmp/model.so --repeat 3
    python scripts/memory_rss.py MODEL.onnx --so /tmp/model.so --onnxc-root /work/main

``--onnxc-root`` measures the runtime of another checkout (its ``runtime`` package) on
the same artifact: before/after comparisons of the loader.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _peak_mib() -> float:
    hwm = _status_kib("VmHWM")
    if hwm is None:
        import resource

        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return hwm / 1024


def _feeds(inputs):
    """Seeded inputs from [(name, shape, numpy dtype)]: small non-negative ints (ids,
    masks) and normal floats."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for name, shape, dtype in inputs:
        if any(not isinstance(d, int) for d in shape):
            raise SystemExit(f"input {name!r} has symbolic dims {shape}: this script measures "
                             "static models only")
        if np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype == np.bool_:
            out[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def child(engine: str, model: str, so: str) -> dict:
    """One measurement, in this (fresh) process."""
    import time

    import numpy as np

    if engine == "onnxruntime":
        import onnxruntime as ort

        types = {"tensor(float)": np.float32, "tensor(int64)": np.int64,
                 "tensor(int32)": np.int32, "tensor(bool)": np.bool_,
                 "tensor(float16)": np.float16, "tensor(double)": np.float64}
        base = _status_kib("VmRSS") / 1024
        t = time.perf_counter()
        sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        load = time.perf_counter() - t
        inputs = [(i.name, i.shape, types[i.type]) for i in sess.get_inputs()]
    else:
        import runtime
        import tvm  # noqa: F401 - its import is part of "after imports", not of "load"

        base = _status_kib("VmRSS") / 1024
        t = time.perf_counter()
        sess = runtime.load(so)
        load = time.perf_counter() - t
        inputs = [(i.name, i.shape, np.dtype(i.dtype)) for i in sess.get_inputs()]
    feeds = _feeds(inputs)
    t = time.perf_counter()
    sess.run(None, feeds)
    run = time.perf_counter() - t
    return {"engine": engine, "load_s": load, "run_s": run, "base_mib": base,
            "peak_mib": _peak_mib(), "file_mib": (_status_kib("RssFile") or 0) / 1024,
            "anon_mib": (_status_kib("RssAnon") or 0) / 1024}


def measure(engine: str, model: str, so: str, onnxc_root: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [onnxc_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", engine, model,
                        "--so", so], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{engine} child failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compile_model(model: str, so: str) -> None:
    sys.path.insert(0, ROOT)
    import compiler

    print(f"compiling {model} -> {so} ...", file=sys.stderr, flush=True)
    compiler.compile(model, isolate=True).export(so)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="the ONNX model (static input shapes)")
    ap.add_argument("--so", help="its onnxc artifact; compiled to this path if missing "
                    "(default: a file in the temporary directory, named after the model)")
    ap.add_argument("--repeat", type=int, default=1, help="children per engine (best load, "
                    "largest peak reported)")
    ap.add_argument("--onnxc-root", default=ROOT, help="checkout whose runtime loads the .so")
    ap.add_argument("--child", choices=["onnxruntime", "onnxc"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.model, args.so)))
        return 0

    so = args.so or os.path.join(tempfile.gettempdir(), os.path.splitext(
        os.path.basename(args.model))[0] + ".onnxc.so")
    if not os.path.exists(so):
        compile_model(args.model, so)
    sys.path.insert(0, ROOT)
    from compiler.tools.bench import host_cpu

    print(f"model {args.model}; artifact {so}; runtime from {args.onnxc_root}")
    print(f"host {host_cpu()}, {os.cpu_count()} CPUs")
    results = {}
    for engine in ("onnxruntime", "onnxc"):
        runs = [measure(engine, args.model, so, args.onnxc_root) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["load_s"])
        results[engine] = dict(best, peak_mib=max(r["peak_mib"] for r in runs))
    print(f"{'engine':<12} {'peak MiB':>9} {'load s':>8} {'run s':>8} {'after imports':>14} "
          f"{'file MiB':>9} {'anon MiB':>9}")
    for engine, r in results.items():
        print(f"{engine:<12} {r['peak_mib']:9.0f} {r['load_s']:8.3f} {r['run_s']:8.3f} "
              f"{r['base_mib']:14.0f} {r['file_mib']:9.0f} {r['anon_mib']:9.0f}")
    o, c = results["onnxruntime"], results["onnxc"]
    print(f"onnxc / onnxruntime: peak RSS {c['peak_mib'] / o['peak_mib']:.2f}x, "
          f"load time {c['load_s'] / o['load_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
