"""Single int8 ops, single thread: onnxc's u8 x s8 kernels (default) and its exact i16 pair
kernels (``exact``: vpmaddwd) against onnxruntime's same op (issue #16).

Each op is a one-node-chain model: a QDQ conv at ResNet-50 shapes (quantize_static's form,
u8 activations, per-channel s8 weights) or a dynamically quantized matmul at BERT-base
shapes (DynamicQuantizeLinear -> MatMulInteger -> scale).  Time per run is
``time.thread_time`` (CPU time of this thread, steadier than wall clock on a shared host),
best of ``--runs``; both engines on one thread.  The models include the graph input's
QuantizeLinear, its layout transform (u8 NCHW -> NCHW[b]c, not in a network's inner convs)
and the output's DequantizeLinear; ``kernel`` columns are the integer conv / matmul kernel
alone (onnxc's profiler, best call).

    python scripts/bench_int8_kernels.py --runs 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, kind, shape): conv (c, f, hw, k, stride, pad); matmul (m, k, n)
CASES = [
    ("conv3x3 64@56", "conv", (64, 64, 56, 3, 1, 1)),
    ("conv3x3 128@28", "conv", (128, 128, 28, 3, 1, 1)),
    ("conv3x3 256@14", "conv", (256, 256, 14, 3, 1, 1)),
    ("conv3x3 512@7", "conv", (512, 512, 7, 3, 1, 1)),
    ("conv1x1 256->64@56", "conv", (256, 64, 56, 1, 1, 0)),
    ("conv1x1 512->2048@7", "conv", (512, 2048, 7, 1, 1, 0)),
    ("matmul 128x768x768", "matmul", (128, 768, 768)),
    ("matmul 128x768x3072", "matmul", (128, 768, 3072)),
    ("matmul 128x3072x768", "matmul", (128, 3072, 768)),
]


def best(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return min(times) * 1e3


def kernel_ms(cm, feeds, runs: int) -> float:
    """Best call of the integer conv / matmul kernel, ms (onnxc's profiler, one thread)."""
    import json
    import tempfile

    import runtime

    with tempfile.TemporaryDirectory() as tmp:
        opts = runtime.SessionOptions(intra_op_num_threads=1, enable_profiling=True,
                                      profile_file_prefix=os.path.join(tmp, "p"))
        sess = cm.session(opts)
        for _ in range(runs):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    durs = [e["dur"] for e in events if e.get("ph") == "X"
            and ("conv2d_integer" in e["name"] or "matmul_integer" in e["name"])]
    return min(durs) / 1e3


def model(kind, shape):
    from tests.passes.test_pack_int_matmul import dynamic_model
    from tests.passes.test_qdq_conv_integer import qdq_conv_model

    rng = np.random.default_rng(0)
    if kind == "conv":
        c, f, hw, k, s, p = shape
        m = qdq_conv_model(c, f, hw, k, s, p, relu=True, zx=120)
        return m, {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}
    m_, k, n = shape
    w = rng.integers(-64, 64, (k, n)).astype(np.int8)
    return (dynamic_model(m_, k, n, w, np.zeros((), np.int8), rng.standard_normal(n)
                          .astype(np.float32)),
            {"x": rng.standard_normal((m_, k)).astype(np.float32)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--only", default="", help="substring of the case names to run")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    import compiler
    import runtime

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    print(f"{'op':24s} {'exact ms':>9s} {'u8s8 ms':>9s} {'ort ms':>9s} {'u8s8/ort':>9s} "
          f"{'u8s8/exact':>10s} {'kernel exact':>12s} {'kernel u8s8':>11s}  rule")
    for name, kind, shape in CASES:
        if args.only not in name:
            continue
        m, feeds = model(kind, shape)
        ref = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        out = {}
        for label, cfg in (("exact", {"exact": True}), ("u8s8", {})):
            pc = {"pack_int_conv": cfg, "pack_int_matmul": cfg} if cfg else None
            cm = compiler.compile(m, target="host", pass_config=pc)
            sess = cm.session(runtime.SessionOptions(intra_op_num_threads=1))
            out[label] = best(lambda: sess.run(None, feeds), args.runs)
            rule = max(cm.report["kernel_table"], key=lambda r: r.get("flops", 0))["rule"]
            out[label + "_k"] = kernel_ms(cm, feeds, args.runs)
        t_ort = best(lambda: ref.run(None, feeds), args.runs)
        print(f"{name:24s} {out['exact']:9.3f} {out['u8s8']:9.3f} {t_ort:9.3f} "
              f"{out['u8s8'] / t_ort:9.2f} {out['u8s8'] / out['exact']:10.2f} "
              f"{out['exact_k']:12.3f} {out['u8s8_k']:11.3f}  {rule}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
