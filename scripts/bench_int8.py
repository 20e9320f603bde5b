#!/usr/bin/env python3
"""Dynamic-int8 benchmark (issue #16): BERT quantized by onnxruntime, onnxc vs onnxruntime.

Takes a float BERT export, fixes its symbolic input dims (``--seq``, batch 1), quantizes it
with ``onnxruntime.quantization.quantize_dynamic`` (s8 weights, u8 activations:
DynamicQuantizeLinear + MatMulInteger + Mul/Add dequantisation), compiles it for the host,
prints the kernel table's heaviest kernels (compile report ``kernel_table``: rule, FLOPs,
nodes) and times onnxc against onnxruntime, each engine in its own worker processes
(``compiler.tools.bench.measure``, as ``scripts/bench_models.py``), outputs compared.

    python scripts/bench_int8.py --model tiny          # tests/data/hf_bert_tiny.onnx (2 layers)
    python scripts/bench_int8.py --model bert_base     # /work/real_models/bert_base.onnx
    python scripts/bench_int8.py --model PATH.onnx --rounds 3 --runs 10 --top 12
    python scripts/bench_int8.py --model tiny --disable-pass pack_int_matmul   # before/after

The quantized model is cached next to ``--cache`` (default /tmp/onnxc-int8) by name.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = {"tiny": os.path.join(ROOT, "tests", "data", "hf_bert_tiny.onnx"),
          "bert_base": "/work/real_models/bert_base.onnx"}


def quantize(src: str, dst: str, seq: int) -> str:
    """``src`` with static [1, seq] inputs, quantized dynamically (QInt8 weights) to ``dst``."""
    import numpy as np
    import onnx
    import onnx.numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if os.path.exists(dst):
        return dst
    m = onnx.load(src)
    # token types as an all-zero constant: the benchmark workers feed random ints in [0, 8),
    # outside the 2-row token-type table
    for vi in list(m.graph.input):
        if vi.name == "token_type_ids":
            m.graph.input.remove(vi)
            m.graph.initializer.append(onnx.numpy_helper.from_array(
                np.zeros((1, seq), np.int64), vi.name))
    for vi in m.graph.input:
        dims = vi.type.tensor_type.shape.dim
        for d, v in zip(dims, [1, seq]):
            if not d.HasField("dim_value"):
                d.dim_value = v
    fixed = dst + ".float.onnx"
    onnx.save(m, fixed, save_as_external_data=m.ByteSize() > 2**31 - 2**20)
    quantize_dynamic(fixed, dst, weight_type=QuantType.QInt8)
    return dst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny, bert_base, or a float .onnx path")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--top", type=int, default=10, help="kernel table rows to print")
    p.add_argument("--disable-pass", action="append", default=[])
    p.add_argument("--cache", default="/tmp/onnxc-int8")
    args = p.parse_args(argv)

    import compiler
    from compiler.tools.bench import host_cpu, measure, top_kernels

    src = MODELS.get(args.model, args.model)
    os.makedirs(args.cache, exist_ok=True)
    name = os.path.splitext(os.path.basename(src))[0]
    qpath = quantize(src, os.path.join(args.cache, f"{name}_s{args.seq}_dynq.onnx"), args.seq)
    print(f"CPU: {host_cpu()}, {len(os.sched_getaffinity(0))} threads; load: "
          f"{os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    cm = compiler.compile(qpath, target="host", disabled_passes=tuple(args.disable_pass))
    print(f"{qpath}: compiled in {time.perf_counter() - t0:.1f} s, "
          f"{cm.report['kernels']} kernels, schedules {cm.report.get('schedules')}")
    print(top_kernels(cm.report, args.top))
    so = os.path.join(args.cache, f"{name}_s{args.seq}_dynq.so")
    cm.export(so)
    del cm
    r = measure(qpath, so, rounds=args.rounds, runs=args.runs, warmup=2)
    print(f"onnxc {r['onnxc']['median_ms']:.2f} ms (min {r['onnxc']['min_ms']:.2f}), "
          f"onnxruntime {r['onnxruntime']['median_ms']:.2f} ms "
          f"(min {r['onnxruntime']['min_ms']:.2f}): ratio {r['ratio']:.2f}x; "
          f"outputs max|diff| {max(r['max_abs_diff']):.3e}, allclose(1e-4) {r['allclose']}; "
          f"load after: {os.getloadavg()[0]:.1f}")
    accuracy(qpath, so, os.path.join(args.cache, f"{name}_s{args.seq}_dynq.onnx.float.onnx"))
    return 0


def accuracy(qpath: str, so: str, fpath: str) -> None:
    """Largest |difference| relative to the largest |reference| of the first output: onnxc
    against onnxruntime on the quantized model, each against onnxruntime on the float one
    (the workers' seeded inputs)."""
    import numpy as np
    import onnxruntime as ort

    import runtime
    from compiler.tools.bench import random_feeds

    sess = runtime.load(so)
    feeds = random_feeds([(i.name, i.shape, i.dtype) for i in sess.get_inputs()])
    ours = sess.run(None, feeds)[0]
    q, f = (ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            for p in (qpath, fpath))

    def rel(a, b):
        return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())

    print(f"max rel diff (of max |ref|): onnxc vs onnxruntime int8 {rel(ours, q):.2e}; "
          f"vs float model: onnxc {rel(ours, f):.2e}, onnxruntime int8 {rel(q, f):.2e}")


if __name__ == "__main__":
    sys.exit(main())
