"""ConvTranspose latency, onnxc vs onnxruntime, single thread, on the shapes users hit:
U-Net decoders (2-D k2 s2), DCGAN generators (2-D k4 s2 p1), vocoders (1-D k4 s2 p1,
1-D k16 s8 p4), 3-D U-Nets (3-D k2 s2).  Run by hand, never by the unit tests.

    python scripts/bench_conv_transpose.py                  # all shapes
    python scripts/bench_conv_transpose.py --shapes unet2d --rounds 5 --runs 10
    python scripts/bench_conv_transpose.py --disable pack_conv_transpose   # before

Each engine runs in its own worker processes, alternating (compiler/bench.py), with
``TVM_NUM_THREADS=1`` and onnxruntime's ``intra_op_num_threads=1``; medians of all runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name -> (in channels, out channels, spatial size, kernel, stride, pad)
SHAPES = {
    "unet2d_k2s2": (128, 64, (64, 64), 2, 2, 0),
    "dcgan2d_k4s2p1": (256, 128, (16, 16), 4, 2, 1),
    "vocoder1d_k4s2p1": (256, 128, (1000,), 4, 2, 1),
    "vocoder1d_k16s8p4": (512, 256, (200,), 16, 8, 4),
    "unet3d_k2s2": (32, 16, (16, 16, 16), 2, 2, 0),
}


def model(c, f, size, k, s, p, bias=True, seed=0):
    """One ConvTranspose (+ bias) node, output shape declared (onnx shape inference)."""
    nd = len(size)
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(
        (rng.standard_normal((c, f, *[k] * nd)) / np.sqrt(c * k ** nd)).astype("float32"), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(f).astype("float32"), "b"))
        ins.append("b")
    node = helper.make_node("ConvTranspose", ins, ["y"], kernel_shape=[k] * nd,
                            strides=[s] * nd, pads=[p] * 2 * nd, name="up")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, c, *size))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m)
    m.graph.output[0].CopyFrom(inferred.graph.output[0])
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--disable", nargs="*", default=[])
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = "1"
    import compiler
    from compiler.bench import measure

    print(f"{'shape':20s} {'onnxc ms':>9s} {'ort ms':>8s} {'ratio':>6s}  ok  schedules")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes:
            m = model(*SHAPES[name])
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(m, path)
            cm = compiler.compile(m, target="host", disabled_passes=args.disable)
            art = cm.export(os.path.join(tmp, f"{name}.so"))
            r = measure(path, art, rounds=args.rounds, runs=args.runs, threads=1)
            print(f"{name:20s} {r['onnxc']['median_ms']:9.2f} "
                  f"{r['onnxruntime']['median_ms']:8.2f} {r['ratio']:6.2f}  "
                  f"{'y' if r['allclose'] else 'N'}  {cm.report['schedules']}", flush=True)


if __name__ == "__main__":
    main()
