#!/usr/bin/env python3
"""Static-int8 (QDQ) benchmark (issue #16): a CNN quantized by onnxruntime's quantize_static,
onnxc int8 vs onnxruntime int8 vs onnxc fp32.

Quantizes a float model with ``onnxruntime.quantization.quantize_static`` (QDQ format,
per-channel s8 weights, u8 activations, a few seeded random calibration images; cached under
``--cache``, default /tmp/onnxc-qdq), compiles the quantized and the float model for the host,
prints the int8 build's heaviest kernels (report ``kernel_table``: rule, FLOPs, nodes), times
the three engines, each in its own worker processes (``compiler.tools.bench.measure``), and
checks accuracy on one seeded input: the largest |difference| relative to the largest
|reference| of onnxc int8 against onnxruntime int8, and whether the top-1 agrees.

    python scripts/bench_qdq.py --model small          # a 4-conv QDQ net (seconds)
    python scripts/bench_qdq.py --model resnet50       # /work/real_models/resnet50.onnx
    python scripts/bench_qdq.py --model resnet50 --disable-pass qdq_conv_integer  # before
    python scripts/bench_qdq.py --model PATH.onnx --rounds 3 --runs 10 --top 12 --no-fp32
    python scripts/bench_qdq.py --model resnet50 --format qoperator   # QLinearConv, QLinearAdd...
    python scripts/bench_qdq.py --model resnet50 --activations s8     # quantize_static's default
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = {"resnet50": "/work/real_models/resnet50.onnx"}


def small_net(path: str) -> str:
    """A float net of the convs ResNet-50 is made of (7x7 s2 stem, 3x3, 1x1 s2, a residual
    Add, Relu), [1, 3, 56, 56] input, written to ``path``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def conv(name, x, cin, cout, k, stride=1, relu=True):
        w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name + "_b")])
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], name=name,
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4))
        if not relu:
            return name
        nodes.append(helper.make_node("Relu", [name], [name + "_r"], name=name + "_relu"))
        return name + "_r"

    y = conv("stem", "x", 3, 64, 7, 2)
    a = conv("c1", y, 64, 64, 1)
    a = conv("c2", a, 64, 64, 3)
    a = conv("c3", a, 64, 64, 1, relu=False)
    nodes.append(helper.make_node("Add", [a, y], ["sum"], name="add"))
    nodes.append(helper.make_node("Relu", ["sum"], ["sum_r"], name="add_relu"))
    z = conv("down", "sum_r", 64, 128, 1, 2)
    nodes.append(helper.make_node("GlobalAveragePool", [z], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["y"], name="flatten"))
    g = helper.make_graph(nodes, "qdq_small",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 56, 56])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)
    return path


def calibration(src: str, images: int):
    """A CalibrationDataReader of ``images`` seeded normal inputs for ``src``'s first input
    (symbolic dims as 1)."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader

    inp = onnx.load(src, load_external_data=False).graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.feeds = iter([{inp.name: rng.standard_normal(shape).astype(np.float32)}
                               for _ in range(images)])

        def get_next(self):
            return next(self.feeds, None)
    return Reader()


def quantize(src: str, dst: str, images: int = 4, fmt: str = "qdq",
             activations: str = "u8") -> str:
    """``src`` quantized statically to ``dst`` (QDQ, or with ``fmt`` "qoperator" the
    QLinear* ops; per-channel QInt8 weights, QUInt8 activations, or QInt8 ones with
    ``activations`` "s8": quantize_static's own default), calibrated on ``images`` seeded
    normal inputs; kept when it exists."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if os.path.exists(dst):
        return dst
    quant_format = QuantFormat.QOperator if fmt == "qoperator" else QuantFormat.QDQ
    quantize_static(src, dst, calibration(src, images), quant_format=quant_format,
                    per_channel=True,
                    activation_type=QuantType.QInt8 if activations == "s8" else QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return dst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small", help="small, resnet50, or a float .onnx path")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--top", type=int, default=10, help="kernel table rows to print")
    p.add_argument("--disable-pass", action="append", default=[])
    p.add_argument("--no-fp32", action="store_true", help="skip the onnxc fp32 build")
    p.add_argument("--cache", default="/tmp/onnxc-qdq")
    p.add_argument("--format", default="qdq", choices=["qdq", "qoperator"],
                   help="the quantizer's output format (QuantFormat.QDQ or QOperator)")
    p.add_argument("--activations", default="u8", choices=["u8", "s8"],
                   help="activation type: QUInt8 (u8), or QInt8 (s8: quantize_static's default)")
    args = p.parse_args(argv)

    import compiler
    from compiler.tools.bench import host_cpu, measure, top_kernels

    os.makedirs(args.cache, exist_ok=True)
    if args.model == "small":
        src = small_net(os.path.join(args.cache, "qdq_small.float.onnx"))
    else:
        src = MODELS.get(args.model, args.model)
    name = os.path.splitext(os.path.basename(src))[0].replace(".float", "")
    tag = ("qdq" if args.format == "qdq" else "qop") + ("_s8" if args.activations == "s8" else "")
    qpath = quantize(src, os.path.join(args.cache, f"{name}_{tag}.onnx"), fmt=args.format,
                     activations=args.activations)
    print(f"CPU: {host_cpu()}, {args.threads or len(os.sched_getaffinity(0))} threads; "
          f"load: {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    cm = compiler.compile(qpath, target="host", disabled_passes=tuple(args.disable_pass))
    print(f"{qpath}: compiled in {time.perf_counter() - t0:.1f} s, "
          f"{cm.report['kernels']} kernels, schedules {cm.report.get('schedules')}")
    print(top_kernels(cm.report, args.top))
    so = os.path.join(args.cache, f"{name}_{tag}.so")
    cm.export(so)
    del cm
    r = measure(qpath, so, rounds=args.rounds, runs=args.runs, warmup=2, threads=args.threads)
    q_ms, ort_ms = r["onnxc"]["median_ms"], r["onnxruntime"]["median_ms"]
    print(f"int8: onnxc {q_ms:.2f} ms (min {r['onnxc']['min_ms']:.2f}), onnxruntime "
          f"{ort_ms:.2f} ms (min {r['onnxruntime']['min_ms']:.2f}): ratio {r['ratio']:.2f}x")
    if not args.no_fp32:
        fso = os.path.join(args.cache, f"{name}_fp32.so")
        if not os.path.exists(fso):
            compiler.compile(src, target="host").export(fso)
        f = measure(src, fso, rounds=args.rounds, runs=args.runs, warmup=2,
                    threads=args.threads, compare=False)
        f_ms = f["onnxc"]["median_ms"]
        print(f"fp32: onnxc {f_ms:.2f} ms (min {f['onnxc']['min_ms']:.2f}); "
              f"onnxc int8 / onnxc fp32 {q_ms / f_ms:.2f}x")
    accuracy(qpath, so)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


def accuracy(qpath: str, so: str) -> None:
    """onnxc int8 against onnxruntime int8 on one seeded input: the largest |difference|
    relative to the largest |reference|, and whether every row's top-1 agrees."""
    import numpy as np
    import onnxruntime as ort

    import runtime
    from compiler.tools.bench import random_feeds

    sess = runtime.load(so)
    feeds = random_feeds([(i.name, i.shape, i.dtype) for i in sess.get_inputs()])
    ours = sess.run(None, feeds)[0]
    ref = ort.InferenceSession(qpath, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    rel = float(np.abs(ours.astype(np.float64) - ref).max() / np.abs(ref).max())
    top1 = bool((ours.reshape(len(ours), -1).argmax(1) == ref.reshape(len(ref), -1).argmax(1)).all())
    print(f"accuracy: max rel diff (of max |ref|) onnxc int8 vs onnxruntime int8 {rel:.2e}; "
          f"same top-1: {top1}")


if __name__ == "__main__":
    sys.exit(main())
