"""Per-kernel time of a compiled model against onnxruntime's per-node profile, one thread.

    python scripts/profile_vs_ort.py MODEL.onnx MODEL.so [--runs 20] [--top 25] [--threads N]

Both engines run single-threaded in this process: each onnxc kernel call timed by this
thread's CPU time (``--threads N``: both engines on N threads, each call timed by the
wall clock, which then counts the host's other load too), onnxruntime by its per-node
profile (wall), the first
run of each dropped.  Each onnxc kernel call names the ONNX nodes it computes; an
onnxruntime node (after its own fusions: ``Conv_12`` fused with its ReLU keeps the conv's
name, NCHWc nodes add a ``_nchwc`` suffix, QuickGelu fusions ``<node>/QuickGeluFusion/``) is charged to the onnxc kernel holding a node of
the same name, and reorders / transposes it adds stay in a row of their own.  Rows are
sorted by (onnxc - onnxruntime) microseconds per run, the minimum over runs of each (a shared host: the least disturbed run)."""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time

THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
os.environ.setdefault("TVM_NUM_THREADS", str(THREADS))
# one thread: this thread's CPU time (descheduling by other jobs does not count); more:
# the wall clock (worker threads' time is not this thread's)
CLOCK = time.thread_time_ns if THREADS == 1 else time.perf_counter_ns

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import runtime  # noqa: E402
from runtime.instruments import SessionOptions  # noqa: E402


def ours(so, feeds, runs):
    """{(kernel, nodes): (flops, min thread-CPU us over runs)}: each call of the plan timed
    with time.thread_time_ns (this thread's CPU time: descheduling by other jobs does not
    count), inputs refilled before each run."""
    sess = runtime.load(so, SessionOptions(intra_op_num_threads=THREADS, bind_io=False))
    sess.run(None, feeds)
    inputs = [(sess._np[t], feeds[n]) for t, n in zip(sess._input_tensors, sess._input_names)]
    calls = sess.graph["calls"]
    best = [float("inf")] * len(calls)
    for _ in range(runs):
        for view, value in inputs:
            view[...] = value
        for i, (fn, args) in enumerate(sess._calls):
            t = CLOCK()
            fn(*args)
            best[i] = min(best[i], (CLOCK() - t) / 1e3)
    per = {}
    for call, us in zip(calls, best):
        key = (call["kernel"], tuple(call.get("nodes", [])))
        flops, acc = per.get(key, (call.get("flops", 0), 0.0))
        per[key] = (flops, acc + us)
    return per


def ort_run_cpu_ms(model, feeds, runs):
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = THREADS, 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    ts = []
    for _ in range(runs):
        t = CLOCK()
        sess.run(None, feeds)
        ts.append((CLOCK() - t) / 1e6)
    return min(ts)


def theirs(model, feeds, runs):
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    runs_seen, per, run = [], {}, -1
    for e in events:
        if e.get("cat") == "Session" and e["name"] == "model_run":
            continue
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][:-len("_kernel_time")]
        per.setdefault(name, []).append(e["dur"])
    out = {}
    for name, durs in per.items():
        durs = durs[len(durs) // (runs + 1):]  # drop the first run's call(s)
        k = len(durs) // runs or 1
        out[name] = sum(min(durs[i::k]) for i in range(k))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("so")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--threads", type=int, default=1,
                   help="both engines on this many threads (wall-clock kernel times)")
    a = p.parse_args()
    sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
    from compiler.tools.bench import random_feeds  # int64 ids and masks as bench_models'

    ins = runtime.load(a.so).get_inputs()
    feeds = random_feeds([(i.name, i.shape, i.dtype) for i in ins], seed=0)
    mine = ours(a.so, feeds, a.runs)
    ref = theirs(a.model, feeds, a.runs)
    node_to_kernel = {}
    for key in mine:
        for n in key[1]:
            node_to_kernel[n] = key
    # onnxruntime's NCHWc rewrite names a node after its output tensor
    for node in onnx.load(a.model, load_external_data=False).graph.node:
        for o in node.output:
            if node.name in node_to_kernel:
                node_to_kernel.setdefault(o, node_to_kernel[node.name])
    charged = {k: 0.0 for k in mine}
    unmatched = {}
    for name, us in ref.items():
        base = re.sub(r"(_nchwc|_token_\d+)+$", "", name)
        key = node_to_kernel.get(name) or node_to_kernel.get(base)
        trimmed = base.rstrip("/")
        while key is None and "/" in trimmed:  # ".../act/Mul/QuickGeluFusion/": a fusion
            trimmed = trimmed.rsplit("/", 1)[0]  # named after the node it starts from
            key = node_to_kernel.get(trimmed)
        if key is None:
            unmatched[name] = us
        else:
            charged[key] += us
    rows = sorted(mine, key=lambda k: -(mine[k][1] - charged[k]))
    tot_m = sum(v[1] for v in mine.values())
    tot_r = sum(ref.values())
    clock = "thread CPU" if THREADS == 1 else f"wall, {THREADS} threads"
    print(f"onnxruntime run(): {ort_run_cpu_ms(a.model, feeds, a.runs):.2f} ms {clock} (min)")
    print(f"onnxc kernels {tot_m / 1e3:.2f} ms/run ({clock}), onnxruntime nodes "
          f"{tot_r / 1e3:.2f} ms/run (profile, wall) "
          f"(unmatched ORT nodes {sum(unmatched.values()) / 1e3:.2f} ms)")
    print(f"{'kernel':<44} {'nodes':<28} {'GFLOP':>6} {'onnxc us':>9} {'ort us':>9} {'diff':>8} {'ratio':>6}")
    for k in rows[:a.top]:
        flops, us = mine[k]
        r = charged[k]
        print(f"{k[0][:44]:<44} {','.join(k[1])[:28]:<28} {flops / 1e9:6.3f} {us:9.1f} {r:9.1f} "
              f"{us - r:8.1f} {us / r if r else float('inf'):6.2f}")
    big = sorted(unmatched.items(), key=lambda kv: -kv[1])[:8]
    print("unmatched onnxruntime nodes:", ", ".join(f"{n} {us:.0f}us" for n, us in big))


if __name__ == "__main__":
    main()
