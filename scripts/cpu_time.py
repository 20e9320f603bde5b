"""Single-thread CPU time per inference, onnxc against onnxruntime, run by hand.

This measures how much work each engine does per inference on one thread (kernel
efficiency, without multi-thread scaling), alternating the two engines, median of
``--rounds``.  CPU time moves less with other jobs than wall-clock time, but it still
moves: on this machine, under a load of 4-5, Inception read 8.8 ms against onnxruntime's
8.7, and 10.8 against 8.3 when the machine was quiet.  Report numbers taken when nothing
else runs.  ``scripts/bench.py`` (wall clock, both on 2 threads) is the headline number.

    python scripts/cpu_time.py resnet50 mobilenetv2 squeezenet inception densenet bert
    python scripts/cpu_time.py --disable-pass convert_layout resnet50
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def cpu_per_run(fn, seconds: float) -> float:
    """CPU seconds per call of ``fn`` (this process), over at least ``seconds``."""
    fn()
    n, c0 = 0, time.process_time()
    while time.process_time() - c0 < seconds:
        fn()
        n += 1
    return (time.process_time() - c0) / n


def model_path(name: str, tmp: str) -> str:
    """``name`` if it is a file, else the zoo model of that name saved under ``tmp``."""
    if os.path.exists(name):
        return name
    import onnx
    import zoo

    path = os.path.join(tmp, f"{name}.onnx")
    onnx.save(zoo.build(name), path)
    return path


def measure(path: str, rounds: int, seconds: float, compile_kw: dict) -> dict:
    import onnxruntime as ort

    import compiler
    import runtime

    t0 = time.perf_counter()
    cm = compiler.compile(path, **compile_kw)
    compile_s = time.perf_counter() - t0
    sess = cm.session(runtime.SessionOptions(intra_op_num_threads=1))
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    import zoo
    import onnx

    feeds = zoo.random_inputs(onnx.load(path, load_external_data=False))
    got, want = sess.run(None, feeds), ref.run(None, feeds)
    diff = max(float(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)).max())
               for g, w in zip(got, want))
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(cpu_per_run(lambda: sess.run(None, feeds), seconds))
        theirs.append(cpu_per_run(lambda: ref.run(None, feeds), seconds))
    a, b = float(np.median(ours)) * 1e3, float(np.median(theirs)) * 1e3
    return {"onnxc_ms": a, "ort_ms": b, "ratio": a / b, "max_abs_diff": diff,
            "kernels": cm.report["kernels"], "compile_s": compile_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="zoo names (scripts/zoo.py --list) or .onnx paths")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5, help="CPU seconds per round")
    ap.add_argument("--disable-pass", action="append", default=[])
    ap.add_argument("--layout", default="auto")
    args = ap.parse_args(argv)
    kw = {"disabled_passes": args.disable_pass, "layout": args.layout}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'model':14s} {'kernels':>7s} {'onnxc ms':>9s} {'ORT ms':>9s} {'ratio':>6s} "
              f"{'max|diff|':>9s}  (1 thread, CPU time per run)")
        for name in args.models:
            r = measure(model_path(name, tmp), args.rounds, args.seconds, kw)
            ratios.append(r["ratio"])
            print(f"{name:14s} {r['kernels']:7d} {r['onnxc_ms']:9.2f} {r['ort_ms']:9.2f} "
                  f"{r['ratio']:6.2f} {r['max_abs_diff']:9.1e}", flush=True)
    if len(ratios) > 1:
        print(f"geomean ratio {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
