"""One-op sweep: single-operator models at real shapes, onnxc against onnxruntime.

The cases where an op configuration missed every rule, or a converter took a slow or wrong
form, were found this way (docs/performance.md, the sessions of 2026-12-07): TopK,
CumSum, ArgMax / ArgMin over short rows, Tile, Expand, Pad reflect, Erf, Log, Atan, Sum,
Hardmax, MatMul with a vector operand, Concat of one image, RoiAlign.  Each case is
compiled untuned for the host and timed with ``compiler.tools.bench.measure`` (each engine
in its own worker processes, alternating, medians); a compile error or a mismatch is a
row, never an abort.  ``scripts/kernel_grid.py`` is the grid of the heavy kernel classes;
this one covers the long tail of ops that real exports carry.

    python scripts/op_sweep.py                      # every case
    python scripts/op_sweep.py topk cumsum          # cases whose name contains a word
    python scripts/op_sweep.py --list
    python scripts/op_sweep.py --rounds 3 --runs 20

Columns: case, ratio onnxc / onnxruntime latency (< 1: onnxc faster), both medians, whether
the outputs match (``compiler.tools.bench.match_for``), and the rules of the kernels.
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

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
X4 = [1, 64, 56, 56]


def _model(nodes, ins, outs, inits=(), opset=17):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "sweep", [vi(n, t, s) for n, t, s in ins],
                          [vi(n, t, s) for n, t, s in outs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _unary(op, shape=X4, opset=17, **attrs):
    return _model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", F, shape)],
                  [("y", F, shape)], opset=opset)


def _topk(shape, k, axis=-1, largest=1):
    out = list(shape)
    out[axis] = k
    return _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis,
                                    largest=largest)],
                  [("x", F, shape)], [("v", F, out), ("i", I64, out)],
                  [("k", np.array([k], np.int64))])


def _arg(op, shape, axis, keepdims=0):
    out = list(shape)
    if keepdims:
        out[axis] = 1
    else:
        del out[axis]
    return _model([helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims)],
                  [("x", F, shape)], [("y", I64, out)])


def _cumsum(shape, axis, dtype=F, **attrs):
    return _model([helper.make_node("CumSum", ["x", "ax"], ["y"], **attrs)],
                  [("x", dtype, shape)], [("y", dtype, shape)],
                  [("ax", np.array(axis, np.int64))])


def _cases() -> dict:
    rng = np.random.default_rng(0)
    mk, node = _model, helper.make_node
    rois = np.concatenate([rng.random((100, 2)) * 150, rng.random((100, 2)) * 150 + 60], 1)
    return {
        "topk5_64x1000": _topk([64, 1000], 5),
        "topk50_vocab": _topk([1, 50257], 50),
        "topk300_det": _topk([1, 8400], 300),
        "topk1_small": _topk([256, 100], 1, largest=0),
        "topk3_axis1": _topk([1, 80, 8400], 3, axis=1),
        "cumsum_axis1": _cumsum([64, 1024], 1),
        "cumsum_pos_i64": _cumsum([8, 512], 1, I64),
        "cumsum_axis0": _cumsum([256, 512], 0, reverse=1),
        "argmax_vocab": _arg("ArgMax", [1, 50257], -1),
        "argmin_last": _arg("ArgMin", [256, 1000], -1),
        "argmax_yolo": _arg("ArgMax", [8400, 80], -1),
        "argmax_seg_axis1": _arg("ArgMax", [1, 21, 128, 128], 1, 1),
        "hardmax": mk([node("Hardmax", ["x"], ["y"], axis=-1)], [("x", F, [256, 1000])],
                      [("y", F, [256, 1000])], opset=13),
        "tile": mk([node("Tile", ["x", "r"], ["y"])], [("x", F, [1, 64, 28, 28])],
                   [("y", F, [2, 64, 56, 56])], [("r", np.array([2, 1, 2, 2], np.int64))]),
        "expand_rows": mk([node("Expand", ["x", "s"], ["y"])], [("x", F, [1, 64, 1, 56])],
                          [("y", F, X4)], [("s", np.array(X4, np.int64))]),
        "expand_mask": mk([node("Expand", ["x", "s"], ["y"])], [("x", F, [8, 1, 1, 128])],
                          [("y", F, [8, 12, 128, 128])],
                          [("s", np.array([8, 12, 128, 128], np.int64))]),
        "pad_reflect": mk([node("Pad", ["x", "p"], ["y"], mode="reflect")], [("x", F, X4)],
                          [("y", F, [1, 64, 60, 60])],
                          [("p", np.array([0, 0, 2, 2, 0, 0, 2, 2], np.int64))]),
        "concat_channels_odd": mk([node("Concat", ["a", "b"], ["y"], axis=1)],
                                  [("a", F, [1, 37, 56, 56]), ("b", F, [1, 27, 56, 56])],
                                  [("y", F, X4)]),
        "sum3": mk([node("Sum", ["a", "b", "c"], ["y"])],
                   [("a", F, X4), ("b", F, X4), ("c", F, X4)], [("y", F, X4)]),
        "matmul_vector": mk([node("MatMul", ["a", "b"], ["y"])], [("a", F, [768])],
                            [("y", F, [3072])],
                            [("b", rng.random((768, 3072)).astype(np.float32))]),
        "erf": _unary("Erf"),
        "atan": _unary("Atan"),
        "log": mk([node("Abs", ["x"], ["a"]), node("Log", ["a"], ["y"])], [("x", F, X4)],
                  [("y", F, X4)]),
        "softplus": _unary("Softplus"),
        "gelu20": _unary("Gelu", opset=20),
        "gridsample": mk([node("GridSample", ["x", "g"], ["y"], align_corners=0)],
                         [("x", F, [1, 32, 64, 64]), ("g", F, [1, 64, 64, 2])],
                         [("y", F, [1, 32, 64, 64])], opset=16),
        "spacetodepth": mk([node("SpaceToDepth", ["x"], ["y"], blocksize=2)],
                           [("x", F, X4)], [("y", F, [1, 256, 28, 28])]),
        "mish": _unary("Mish", opset=18),
        "tanh": _unary("Tanh"),
        "depthtospace": mk([node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")],
                           [("x", F, X4)], [("y", F, [1, 16, 112, 112])]),
        "gemm_transA": mk([node("Gemm", ["a", "w", "b"], ["y"], transA=1)],
                          [("a", F, [768, 128])], [("y", F, [128, 768])],
                          [("w", rng.random((768, 768)).astype(np.float32) - 0.5),
                           ("b", rng.random(768).astype(np.float32))]),
        "conv_grouped1x1": mk([node("Conv", ["x", "w"], ["y"], group=3)],
                              [("x", F, [1, 240, 28, 28])], [("y", F, [1, 240, 28, 28])],
                              [("w", rng.random((240, 80, 1, 1)).astype(np.float32) - 0.5)]),
        "maxpool_ceil_dil": mk([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3],
                                     strides=[2, 2], dilations=[2, 2], ceil_mode=1)],
                               [("x", F, X4)], [("y", F, [1, 64, 27, 27])], opset=12),
        "roialign_fpn": mk([node("RoiAlign", ["x", "r", "b"], ["y"], output_height=7,
                                 output_width=7, sampling_ratio=2, spatial_scale=0.25)],
                           [("x", F, [1, 256, 56, 56])], [("y", F, [100, 256, 7, 7])],
                           [("r", rois.astype(np.float32)), ("b", np.zeros(100, np.int64))],
                           opset=16),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("words", nargs="*", help="only cases whose name contains one of these")
    p.add_argument("--list", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args(argv)
    cases = {k: m for k, m in _cases().items()
             if not args.words or any(w in k for w in args.words)}
    if args.list:
        print("\n".join(cases))
        return 0
    import compiler
    from compiler.tools.bench import measure

    for name, model in cases.items():
        with tempfile.TemporaryDirectory(prefix="onnxc-sweep-") as d:
            path = os.path.join(d, f"{name}.onnx")
            onnx.save(model, path)
            try:
                cm = compiler.compile(path)
                so = cm.export(os.path.join(d, "m.so"))
                rules = sorted({r["rule"] for r in cm.report["kernel_table"]})
                r = measure(path, so, rounds=args.rounds, runs=args.runs, warmup=2)
            except Exception as e:  # noqa: BLE001 - a row, never an abort
                print(f"{name:22s} ERROR {str(e).splitlines()[-1][:150]}", flush=True)
                continue
        print(f"{name:22s} {r['ratio']:7.2f}x  onnxc {r['onnxc']['median_ms']:8.3f} ms  "
              f"ort {r['onnxruntime']['median_ms']:8.3f}  match={r['allclose']}  {rules}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
