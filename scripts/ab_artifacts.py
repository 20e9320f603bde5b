#!/usr/bin/env python3
"""Paired single-thread A/B of two onnxc artifacts of one model, in one process.

Both sessions run on one thread (``TVM_NUM_THREADS=1``), alternating call by call, each call
timed with ``time.thread_time`` (CPU time of this thread: other jobs on a shared host do not
count); prints min / median per artifact and the median of the paired ratios B/A, and the
largest output difference (seeded random feeds, ``compiler.tools.bench.random_feeds``;
symbolic dims at their OPT).
A ``B`` that is an ``.onnx`` file runs in onnxruntime (one intra-op thread), paired the
same way: onnxc's artifact against onnxruntime on the model it was compiled from.
``--threads N`` (two onnxc artifacts only: onnxruntime's spinning workers would steal the
cores from the other engine) runs both on N threads and times each call by the wall clock.

    python scripts/ab_artifacts.py before.so after.so [--runs 10] [--threads 2]
    python scripts/ab_artifacts.py model.so model.onnx
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if "--threads" in sys.argv[:-1]:  # before TVM's pool starts
    os.environ["TVM_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]
os.environ.setdefault("TVM_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import runtime  # noqa: E402
from compiler.tools.bench import host_cpu, random_feeds  # noqa: E402
from runtime.instruments import SessionOptions  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="artifact A (.so)")
    ap.add_argument("b", help="artifact B (.so), or the .onnx model for onnxruntime")
    ap.add_argument("--runs", type=int, default=10, help="paired calls")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads per session (two onnxc artifacts only; wall-clock times)")
    args = ap.parse_args(argv)
    if args.threads > 1 and args.b.endswith(".onnx"):
        ap.error("--threads > 1 pairs two onnxc artifacts only")
    opts = SessionOptions(intra_op_num_threads=args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    sa = runtime.load(args.a, opts)
    if args.b.endswith(".onnx"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        sb = ort.InferenceSession(args.b, so, providers=["CPUExecutionProvider"])
    else:
        sb = runtime.load(args.b, opts)
    opt = {d["name"]: d["opt"] for d in getattr(sa, "dims", ())}  # symbolic dims: at OPT
    feeds = random_feeds([(i.name, [int(opt.get(d, d)) for d in i.shape], i.dtype)
                          for i in sa.get_inputs()], seed=0)
    ra, rb = sa.run(None, feeds), sb.run(None, feeds)
    diff = max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(ra, rb))
    ta, tb = [], []
    for _ in range(args.runs):
        t = clock()
        sa.run(None, feeds)
        ta.append(clock() - t)
        t = clock()
        sb.run(None, feeds)
        tb.append(clock() - t)
    ta, tb = np.array(ta) * 1e3, np.array(tb) * 1e3
    print(f"{host_cpu()}, {args.threads} thread(s), {args.runs} paired runs, "
          f"max |A - B| {diff:.3g}")
    print(f"A {ta.min():.2f} / {np.median(ta):.2f} ms  B {tb.min():.2f} / {np.median(tb):.2f} ms"
          f" (min / median)  paired B/A {np.median(tb / ta):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
