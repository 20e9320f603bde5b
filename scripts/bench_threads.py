#!/usr/bin/env python3
"""Concurrent ``run()``: one session behind its lock vs per-thread arenas.

Concurrent ``run()`` calls on one :class:`runtime.Session` either wait for its one
planned arena (a lock), or each get an arena (and prepared argument tuples) of their own.
This measures the options on the same compiled model, with ``--threads`` Python threads
each doing ``--runs`` runs:

* ``sequential``  one thread, ``threads * runs`` runs (the baseline);
* ``lock``        one shared session limited to one arena (``max_arenas = 1``);
* ``per-thread``  one session per thread -- exactly what per-thread arenas would cost
                  and gain (params are copied per session here, which does not change
                  run time);
* ``pool``        one shared session with its arena pool (what ``Session`` does now:
                  up to one arena per CPU, created when all others are busy).

It also checks every result against the sequential one.  TVM's kernels already spread
each call over the cores (its thread pool), so per-thread arenas only pay off where the
kernels leave cores idle (tiny models) and the GIL is released during the calls.

    python scripts/bench_threads.py --model cnn --threads 8 --runs 20
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

MODELS = {
    "mlp": {"batch": 1},
    "cnn": {"image": 32},
    "transformer": {"seq": 16, "hidden": 64, "heads": 4, "ffn": 256},
    "dwsep": {},
}


def _threads(target_sessions, feeds, runs: int):
    """Run ``runs`` runs in each thread (thread i uses target_sessions[i]); wall seconds."""
    results = [None] * len(target_sessions)
    barrier = threading.Barrier(len(target_sessions) + 1)

    def work(i):
        sess = target_sessions[i]
        barrier.wait()
        out = None
        for _ in range(runs):
            out = sess.run(None, feeds[i])
        results[i] = out

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(target_sessions))]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, results


def bench(name: str, threads: int, runs: int, repeats: int = 3) -> dict:
    import zoo

    import compiler

    model = zoo.build(name, **MODELS.get(name, {}))
    cm = compiler.compile(model)
    feeds = [zoo.random_inputs(model, seed=i) for i in range(threads)]
    shared = cm.session()
    shared.max_arenas = 1  # one arena: concurrent runs wait for it (the old lock)
    pooled = cm.session()  # the session's arena pool (grows up to one arena per CPU)
    expected = [shared.run(None, f) for f in feeds]
    own = [cm.session() for _ in range(threads)]
    for s in own:  # warm up
        s.run(None, feeds[0])

    pool = pooled.max_arenas
    best = {"sequential": float("inf"), "lock": float("inf"), "per-thread": float("inf"),
            "pool": float("inf")}
    for _ in range(repeats):
        t0 = time.perf_counter()
        for f in feeds:
            for _ in range(runs):
                shared.run(None, f)
        best["sequential"] = min(best["sequential"], time.perf_counter() - t0)
        for kind, sessions in (("lock", [shared] * threads), ("per-thread", own),
                               ("pool", [pooled] * threads)):
            dt, outs = _threads(sessions, feeds, runs)
            best[kind] = min(best[kind], dt)
            for got, want in zip(outs, expected):
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g, w)
    n = threads * runs
    return {"model": name, "threads": threads, "runs": n,
            **{f"{k}_ms_per_run": round(v / n * 1e3, 4) for k, v in best.items()},
            "pool_size": pool,
            "per_thread_speedup_vs_lock": round(best["lock"] / best["per-thread"], 3),
            "pool_speedup_vs_lock": round(best["lock"] / best["pool"], 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", default=None, choices=sorted(MODELS))
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--runs", type=int, default=20, help="runs per thread")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"host: {os.cpu_count()} CPUs; TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}")
    for name in args.model or ["mlp", "cnn", "transformer", "dwsep"]:
        r = bench(name, args.threads, args.runs, args.repeats)
        print(f"{r['model']:<12} {r['threads']} threads x {r['runs'] // r['threads']} runs: "
              f"sequential {r['sequential_ms_per_run']:.3f} ms/run, "
              f"lock {r['lock_ms_per_run']:.3f} ms/run, "
              f"per-thread arenas {r['per-thread_ms_per_run']:.3f} ms/run "
              f"(per-thread / lock speedup {r['per_thread_speedup_vs_lock']:.2f}x), "
              f"session pool (<= {r['pool_size']} arenas) {r['pool_ms_per_run']:.3f} ms/run "
              f"({r['pool_speedup_vs_lock']:.2f}x); "
              "results identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
