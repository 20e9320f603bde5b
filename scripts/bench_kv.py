#!/usr/bin/env python3
"""Per-step decode latency of a decoder with a key/value cache, onnxc vs onnxruntime.

For each past length (default 1, 128, 512, 1023: GPT-2 has 1024 positions, so a step at
past 1023 is its last) a step of one token over a random past of that length is run
repeatedly, each engine through its IOBinding loop of ``examples/generate.py`` (onnxc:
the past bound in place, presents in runtime-owned buffers, after one step the past is
that step's present, as when decoding: ``OnnxcDecoder.settle``; onnxruntime: OrtValues), in
its own worker process; engines alternate over ``--rounds``; the figure is the median over
rounds of each round's median step.  ``--profile`` adds onnxc's top kernels at each
length (the session's profiler, ``SessionOptions(enable_profiling=True)``).

    python scripts/bench_kv.py --onnx /tmp/gpt2_kv.onnx --so /tmp/gpt2_kv.so --threads 2 \\
        [--past 1 128 512 1023] [--steps 10] [--rounds 3] [--profile] [--so-base OLD.so]

``--so`` is compiled from ``--onnx`` when missing (examples/generate.py's ranges).
``--so-base`` runs a second onnxc build (e.g. one compiled before a change) in the same
rounds, so both are measured under the same load.  Besides wall-clock medians the table
gives each engine's process CPU time per step (median): on a shared host the wall time of a
single-threaded step grows with the load, its CPU time much less.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def worker(args) -> dict:
    """One engine, every past length: {past: median step ms} (+ profiles)."""
    from examples.generate import OnnxcDecoder, OrtDecoder

    def make():
        if args.engine == "onnxc":  # profiled: a fresh session per length, its own summary
            return OnnxcDecoder(args.so, args.threads, profile=args.profile)
        if args.engine == "onnxc-base":
            return OnnxcDecoder(args.so_base, args.threads)
        return OrtDecoder(args.onnx, args.threads)

    dec = make()
    rng = np.random.default_rng(0)
    result, cpu, profiles = {}, {}, {}
    for past_len in args.past:
        if args.profile and args.engine == "onnxc" and profiles:
            dec = make()
        past = [rng.standard_normal((1, dec.heads, past_len, dec.head_dim)).astype(np.float32)
                for _ in dec.past]
        dec.start(np.array([[1]], np.int64), past)
        if hasattr(dec, "settle"):  # onnxc: the past is the previous step's present
            dec.settle()
        for _ in range(2):
            dec.repeat()
        times, cpu_times = [], []
        for _ in range(args.steps):
            start, start_cpu = time.perf_counter(), time.process_time()
            dec.repeat()
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - start_cpu)
        result[str(past_len)] = float(np.median(times)) * 1e3
        cpu[str(past_len)] = float(np.median(cpu_times)) * 1e3
        if args.profile and args.engine == "onnxc":
            profiles[str(past_len)] = dec.sess.profile_summary(8)
    return {"engine": args.engine, "ms": result, "cpu_ms": cpu, "profiles": profiles}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--so", required=True)
    ap.add_argument("--past", type=int, nargs="*", default=[1, 128, 512, 1023])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="onnxc's top kernels per length")
    ap.add_argument("--so-base", help="a second onnxc build measured in the same rounds")
    ap.add_argument("--engine", choices=("onnxc", "onnxc-base", "onnxruntime"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine:
        print(json.dumps(worker(args)))
        return 0
    if not os.path.exists(args.so):
        from examples.generate import compile_so

        compile_so(args.onnx, args.so, 128, max(args.past))
    from compiler.tools.bench import host_cpu

    def run_worker(engine: str, profile: bool = False) -> dict:
        cmd = [sys.executable, os.path.abspath(__file__), "--engine", engine,
               "--onnx", args.onnx, "--so", args.so, "--steps", str(args.steps),
               "--threads", str(args.threads), "--past", *map(str, args.past)]
        cmd += ["--so-base", args.so_base] if args.so_base else []
        out = subprocess.run(cmd + (["--profile"] if profile else []), capture_output=True,
                             text=True)
        if out.returncode:
            raise SystemExit(f"{engine} worker failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    runs = {"onnxc": [], **({"onnxc-base": []} if args.so_base else {}), "onnxruntime": []}
    for _ in range(args.rounds):
        for engine in runs:
            runs[engine].append(run_worker(engine))
    # profiled separately: the profiler's per-call timing is not in the figures above
    profiles = run_worker("onnxc", profile=True)["profiles"] if args.profile else {}
    print(f"CPU: {host_cpu()}; {args.threads} threads; {args.rounds} rounds x {args.steps} "
          f"steps; load average {os.getloadavg()[0]:.1f}; ms per decode step (1 token), "
          "median; wall (process CPU time)")
    print(f"{'past':>6} " + " ".join(f"{e:>20}" for e in runs) + "   ratio to onnxruntime")

    def med(engine, key, p):
        return float(np.median([r[key][p] for r in runs[engine]]))

    for p in map(str, args.past):
        ort_ms = med("onnxruntime", "ms", p)
        cells = [f"{med(e, 'ms', p):9.2f} ({med(e, 'cpu_ms', p):7.2f})" for e in runs]
        ratios = [f"{med(e, 'ms', p) / ort_ms:.2f}" for e in runs if e != "onnxruntime"]
        print(f"{p:>6} " + " ".join(f"{c:>20}" for c in cells) + "   " + " ".join(ratios))
    for p, text in profiles.items():
        print(f"\nonnxc profile at past {p} ({args.steps + 2} profiled steps):\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
