"""Benchmarks against ONNX Runtime on the model zoo, run by hand (never by the unit tests).

For each model: compile time, kernel count, latency of onnxc and onnxruntime measured in the
same run (alternating worker processes, medians; see compiler/bench.py), the ratio, whether
outputs match, and the memory plan: arena vs the liveness lower bound vs no reuse.
Then the graph runtime's dispatch overhead per kernel call.

    python scripts/bench.py                         # the default set
    python scripts/bench.py --models resnet50 bert --rounds 3 --runs 50

Use many runs per worker process: onnxc's first runs in a fresh process are slow (thread
pool start-up, cold caches), and with ``--runs 5`` they weighed on the median (MobileNetV2
1.65x onnxruntime with 5 runs per process, 1.01x with 50, same machine, same hour).
    python scripts/bench.py --dispatch-only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo  # noqa: E402

# name -> zoo kwargs; "bert" is BERT-base-shaped (12 layers, hidden 768, seq 128)
MODELS = {
    "cnn": {}, "mlp": {}, "transformer": {}, "dwsep": {},
    "resnet50": {}, "mobilenetv2": {}, "squeezenet": {}, "inception": {}, "densenet": {},
    "bert": {},
}
DEFAULT = ["cnn", "mlp", "transformer", "resnet50", "bert"]


def bench_model(name: str, rounds: int, runs: int, tmp: str) -> dict:
    import onnx

    import compiler
    from compiler.tools.bench import measure

    model = zoo.build(name, **MODELS[name])
    path = os.path.join(tmp, f"{name}.onnx")
    onnx.save(model, path)
    t0 = time.perf_counter()
    cm = compiler.compile(path)
    compile_s = time.perf_counter() - t0
    so = cm.export(os.path.join(tmp, f"{name}.so"))
    r = measure(path, so, rounds=rounds, runs=runs, warmup=1 if runs < 5 else 3)
    mem = cm.report["memory"]
    return {
        "model": name, "kernels": cm.report["kernels"], "compile_s": round(compile_s, 1),
        "onnxc_ms": r["onnxc"]["median_ms"], "ort_ms": r["onnxruntime"]["median_ms"],
        "ratio": r["ratio"], "match": r["allclose"], "max_abs_diff": max(r["max_abs_diff"]),
        "arena_mib": mem["arena_bytes"] / 2**20, "lower_bound_mib": mem["lower_bound_bytes"] / 2**20,
        "no_reuse_mib": mem["no_reuse_bytes"] / 2**20,
        "arena_vs_lb": mem["arena_bytes"] / max(mem["lower_bound_bytes"], 1),
        "inplace_outputs": mem["inplace_outputs"],
    }


def _chain(n: int):
    """A model of n kernels that do almost nothing: ReduceMax chains do not fuse."""
    from onnx import TensorProto, helper

    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("ReduceMax", [prev], [f"t{i}"], name=f"r{i}", keepdims=1))
        prev = f"t{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 1])], [helper.make_tensor_value_info(prev, TensorProto.FLOAT,
                                                                         [1, 1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def dispatch_overhead(repeats: int = 2000) -> dict:
    """Per-call cost of the runtime loop: slope of run() time over chains of trivial kernels
    (so fixed per-run work, input and output copies, cancels out)."""
    import compiler

    x = np.zeros((1, 1), np.float32)
    points = {}
    for n in (50, 400):
        cm = compiler.compile(_chain(n))
        sess = cm.session()
        calls = cm.report["kernels"]
        for _ in range(50):
            sess.run(None, {"x": x})
        samples = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(repeats // 10):
                sess.run(None, {"x": x})
            samples.append((time.perf_counter() - t0) / (repeats // 10))
        points[calls] = statistics.median(samples)
    (n1, t1), (n2, t2) = sorted(points.items())
    return {"per_call_us": (t2 - t1) / (n2 - n1) * 1e6, "calls": [n1, n2],
            "run_us": [t1 * 1e6, t2 * 1e6]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=DEFAULT, choices=list(MODELS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--dispatch-only", action="store_true")
    p.add_argument("--json", default=None, help="write the results here too")
    args = p.parse_args()

    results = {"models": [], "dispatch": dispatch_overhead()}
    d = results["dispatch"]
    print(f"dispatch overhead: {d['per_call_us']:.3f} us per kernel call "
          f"(run() of {d['calls'][0]} / {d['calls'][1]} trivial kernels: "
          f"{d['run_us'][0]:.1f} / {d['run_us'][1]:.1f} us)")
    if not args.dispatch_only:
        hdr = (f"{'model':<12} {'kern':>5} {'comp s':>7} {'onnxc ms':>10} {'ort ms':>9} "
               f"{'ratio':>7} {'match':>5} {'arena MiB':>9} {'lb MiB':>8} {'a/lb':>5} "
               f"{'noreuse':>8}")
        print(hdr)
        with tempfile.TemporaryDirectory(prefix="onnxc-bench-") as tmp:
            for name in args.models:
                r = bench_model(name, args.rounds, args.runs, tmp)
                results["models"].append(r)
                print(f"{r['model']:<12} {r['kernels']:>5} {r['compile_s']:>7.1f} "
                      f"{r['onnxc_ms']:>10.3f} {r['ort_ms']:>9.3f} {r['ratio']:>7.2f} "
                      f"{'yes' if r['match'] else 'NO':>5} {r['arena_mib']:>9.2f} "
                      f"{r['lower_bound_mib']:>8.2f} {r['arena_vs_lb']:>5.2f} "
                      f"{r['no_reuse_mib']:>8.2f}", flush=True)
        ratios = [r["ratio"] for r in results["models"]]
        if ratios:
            geo = float(np.exp(np.mean(np.log(ratios))))
            results["geomean_ratio"] = geo
            print(f"geomean onnxc/onnxruntime latency: {geo:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
