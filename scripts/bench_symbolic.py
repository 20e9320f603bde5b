#!/usr/bin/env python3
"""Symbolic (batch, seq) against per-shape static builds and onnxruntime.

One artifact compiled with symbolic dims serves every shape: this measures its first call
at a new shape (views prepared, no compile) against a repeat call (in this process, which
runs no onnxruntime), then, at each sequence length, the symbolic artifact, a static build
at that shape and onnxruntime, each engine in its own worker processes, alternating
(``compiler.tools.bench.measure``: onnxruntime's spinning workers never share a process
with onnxc), e.g.::

    PYTHONPATH=. python scripts/bench_symbolic.py                     # zoo BERT-base stack
    PYTHONPATH=. python scripts/bench_symbolic.py --model bert.onnx --seqs 16 20 128 384

A ``--model`` is a transformers-style export with inputs of dims ``batch`` / ``seq``
(``input_ids``, ``attention_mask``, ``token_type_ids``...); it is compiled for batch
1..8 and seq 1..``--max-seq`` at opt 128.  Medians over ``--rounds`` x ``--runs``.
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
    """Seeded feeds at (batch, seq): masks of ones, other ints within the axes they index
    (the session refuses token type 7 for a table of 2)."""
    from compiler.frontend.importer import index_bounds
    from compiler.tools.bench import index_limits

    limits = index_limits(index_bounds(model))
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
            feeds[vi.name] = rng.integers(0, min(8, limits.get(vi.name, 8)), dims).astype(
                np.int64)
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
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)

    import onnx

    import compiler
    import runtime
    import zoo
    from compiler.tools.bench import host_cpu, measure

    tmp = tempfile.mkdtemp(prefix="bench-sym-")
    if args.model:
        path = args.model
        model = onnx.load(path, load_external_data=False)
    else:
        model = zoo.bert(seq="seq", batch="batch", mask=True)
        path = os.path.join(tmp, "m.onnx")
        onnx.save(model, path)
    t = time.perf_counter()
    cm = compiler.compile(path, dims={"batch": (1, 8, 1), "seq": (1, args.max_seq, 128)})
    so = os.path.join(tmp, "m.so")
    cm.export(so)
    print(f"{host_cpu()}; symbolic compile {time.perf_counter() - t:.1f} s, arena "
          f"{cm.report['memory']['arena_bytes'] / 2**20:.1f} MiB, row variants "
          f"{len(cm.report.get('row_variants', []))}")
    sess = runtime.load(so)
    print("seq | first call (new shape) ms | repeat ms | symbolic ms | static ms (compile s) "
          "| onnxruntime ms | symbolic / static | symbolic / onnxruntime | outputs match")
    for seq in args.seqs:
        feeds = _feeds(model, 1, seq, seed=seq)
        t = time.perf_counter()
        sess.run(None, feeds)
        first = 1e3 * (time.perf_counter() - t)
        rep = _median_ms(lambda: sess.run(None, feeds), args.runs)
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        t = time.perf_counter()
        static = os.path.join(tmp, f"s{seq}.so")
        compiler.compile(path, input_shapes=shapes).export(static)
        cs = time.perf_counter() - t
        sym = measure(path, so, rounds=args.rounds, runs=args.runs, shapes=shapes)
        st = measure(path, static, rounds=args.rounds, runs=args.runs, shapes=shapes,
                     compare=False)
        a, b, o = (sym["onnxc"]["median_ms"], st["onnxc"]["median_ms"],
                   sym["onnxruntime"]["median_ms"])
        print(f"{seq} | {first:.1f} | {rep:.1f} | {a:.1f} | {b:.1f} ({cs:.1f}) | {o:.1f} | "
              f"{a / b:.2f} | {a / o:.2f} | {sym['allclose']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
