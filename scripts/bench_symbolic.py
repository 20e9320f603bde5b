#!/usr/bin/env python3
"""Symbolic (batch, seq) against per-shape static builds and onnxruntime.

One artifact compiled with symbolic dims serves every shape: this measures its first call
at a new shape (views prepared, no compile) against a repeat call, its latency against a
static build at the same shape, and onnxruntime's, e.g.::

    PYTHONPATH=. python scripts/bench_symbolic.py                     # zoo BERT-base stack
    PYTHONPATH=. python scripts/bench_symbolic.py --model bert.onnx --seqs 16 128

Medians over ``--runs`` runs after one warm-up; single process, so on a shared host the
numbers move with the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _feeds(model, batch, seq, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else
                (batch if d.dim_param == "batch" else seq) for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == 1:
            feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
        elif "mask" in vi.name:
            feeds[vi.name] = np.ones(dims, np.int64)
        else:
            feeds[vi.name] = rng.integers(0, 8, dims).astype(np.int64)
    return feeds


def _median_ms(fn, runs):
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an ONNX model with dims batch / seq "
                    "(default: zoo.bert with symbolic batch and seq and an attention mask)")
    ap.add_argument("--seqs", type=int, nargs="+", default=[16, 128, 384])
    ap.add_argument("--max-seq", type=int, default=384)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort

    import compiler
    import runtime
    import zoo

    model = onnx.load(args.model) if args.model else zoo.bert(seq="seq", batch="batch",
                                                              mask=True)
    tmp = tempfile.mkdtemp(prefix="bench-sym-")
    path = os.path.join(tmp, "m.onnx")
    onnx.save(model, path)
    t = time.perf_counter()
    cm = compiler.compile(path, dims={"batch": (1, 4, 1), "seq": (1, args.max_seq, 128)})
    print(f"symbolic compile: {time.perf_counter() - t:.1f}s ({type(cm).__name__}), arena "
          f"{cm.report['memory']['arena_bytes'] / 2**20:.1f} MiB, rules {cm.report['schedules']}")
    so = os.path.join(tmp, "m.so")
    cm.export(so)
    sess = runtime.load(so)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    print("seq | first call (new shape) ms | repeat ms | static build ms (compile s) | "
          "onnxruntime ms | max |diff| vs ort")
    for seq in args.seqs:
        feeds = _feeds(model, 1, seq, seed=seq)
        t = time.perf_counter()
        out = sess.run(None, feeds)
        first = 1e3 * (time.perf_counter() - t)
        rep = _median_ms(lambda: sess.run(None, feeds), args.runs)
        t = time.perf_counter()
        static = compiler.compile(path, input_shapes={k: list(v.shape) for k, v in feeds.items()})
        cs = time.perf_counter() - t
        ssess = static.session()
        st = _median_ms(lambda: ssess.run(None, feeds), args.runs)
        ot = _median_ms(lambda: ref.run(None, feeds), args.runs)
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(out, ref.run(None, feeds)))
        print(f"{seq} | {first:.1f} | {rep:.1f} | {st:.1f} ({cs:.1f}) | {ot:.1f} | {diff:.2e}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
