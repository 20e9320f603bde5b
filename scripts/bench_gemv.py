#!/usr/bin/env python3
"""One-row matmul against constant weights that do not fit in cache: onnxc vs onnxruntime.

A decode step of a decoder (GPT-2 at past 1) is one-row matmuls ``x[1, seq, K] @ W[K, N] +
b`` whose weights come from DRAM.  Here each case is that one op, exported with a symbolic
``seq`` and compiled as the decode build compiles it (``dims={"seq": (1, 128, 1)}``: opt 1),
``--copies`` sessions per engine, each with its own random weights, so that a round over
them streams ``copies x K x N x 4`` bytes (more than the L3): every call reads its weights
from DRAM, as a decode step does.  Both engines run in this process, alternating per
round, one thread by default; the figure is the median over rounds of the CPU time
(``time.thread_time``) per call, and the weight bytes per CPU second.

    python scripts/bench_gemv.py [--cases 768x2304 768x3072 3072x768 768x50257]
        [--copies 8] [--rounds 15] [--threads 1] [--so-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def model(k: int, n: int, seed: int):
    """x[1, seq, k] @ W[k, n] + b, W and b random initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((k, n), np.float32) * 0.05, "W")
    b = numpy_helper.from_array(rng.standard_normal(n, np.float32), "B")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Add", ["h", "B"], ["y"], name="bias")], "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", n])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=["768x2304", "768x3072", "3072x768",
                                                   "768x50257"])
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--so-dir", default="/tmp/bench_gemv")
    ap.add_argument("--tag", default="", help="suffix of the artifacts (rebuild per branch)")
    ap.add_argument("--static", action="store_true",
                    help="compile seq fixed at 1 (a static one-row kernel) instead of 1..128:1")
    args = ap.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    import onnxruntime as ort

    import compiler
    import runtime
    from runtime.instruments import SessionOptions

    os.makedirs(args.so_dir, exist_ok=True)
    print(f"{'case':>10} {'copies':>6} {'onnxc ms':>9} {'ORT ms':>8} {'onnxc GB/s':>10} "
          f"{'ORT GB/s':>9} {'ratio':>6}  rule")
    for case in args.cases:
        k, n = (int(v) for v in case.split("x"))
        copies = 1 if k * n * 4 > 64 << 20 else args.copies
        ours, theirs, rule = [], [], "?"
        for c in range(copies):
            m = model(k, n, c)
            so = os.path.join(args.so_dir, f"gemv_{case}_{c}{args.tag}{'_static' if args.static else ''}.so")
            if not os.path.exists(so):
                cm = compiler.compile(m, input_shapes={"x": [1, 1, k]}) if args.static \
                    else compiler.compile(m, dims={"seq": (1, 128, 1)})
                cm.export(so)
                rows = cm.report.get("kernel_table") or []
                if rows:
                    rule = max(rows, key=lambda r: r.get("flops") or 0).get("rule", "?")
            ours.append(runtime.load(so, SessionOptions(intra_op_num_threads=args.threads)))
            so_opts = ort.SessionOptions()
            so_opts.intra_op_num_threads = args.threads
            so_opts.inter_op_num_threads = 1
            theirs.append(ort.InferenceSession(m.SerializeToString(), so_opts,
                                               providers=["CPUExecutionProvider"]))
        x = np.random.default_rng(1).standard_normal((1, 1, k)).astype(np.float32)
        ref = theirs[0].run(None, {"x": x})[0]
        got = ours[0].run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        med = {}
        for name, sessions in (("onnxc", ours), ("ort", theirs)):
            for s in sessions:  # warm-up
                s.run(None, {"x": x})
        per = {"onnxc": [], "ort": []}
        for _ in range(args.rounds):
            for name, sessions in (("onnxc", ours), ("ort", theirs)):
                reps = max(1, 8 // copies)
                t0 = time.thread_time() if args.threads == 1 else time.perf_counter()
                for _ in range(reps):
                    for s in sessions:
                        s.run(None, {"x": x})
                t1 = time.thread_time() if args.threads == 1 else time.perf_counter()
                per[name].append((t1 - t0) / (reps * copies))
        med = {kk: float(np.median(v)) * 1e3 for kk, v in per.items()}
        gb = k * n * 4 / 1e9
        print(f"{case:>10} {copies:>6} {med['onnxc']:9.3f} {med['ort']:8.3f} "
              f"{gb / med['onnxc'] * 1e3:10.2f} {gb / med['ort'] * 1e3:9.2f} "
              f"{med['onnxc'] / med['ort']:6.2f}  {rule}", flush=True)


if __name__ == "__main__":
    main()
