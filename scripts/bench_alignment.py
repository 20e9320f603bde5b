"""A/B: does building a kernel for unaligned inputs cost speed?  (issue #14, run overhead)

TVM marks every buffer parameter ``storage_alignment`` = its ``data_alignment`` (64), and
LLVM then assumes that alignment for vector loads.  The compiler now builds the kernels that
read a model input element-aligned on it (compiler/lowering/input_alignment.py) and the
runtime reads such inputs in place; this script measures what that costs the kernel.  It
schedules one kernel of a single-op model as compile() does, builds it twice (the inputs'
buffers at 64, and with ``align`` = the element size on the model-input parameters), and
times the kernel call (median of repeats, one process, both builds alternating):

    python scripts/bench_alignment.py                 # matmul, conv, add
    python scripts/bench_alignment.py --repeat 200

Columns: case, build, feed alignment (bytes mod 64), median and min us, output equal to the
aligned build's, the kernel's rule; before them each build's count of aligned and unaligned
vector moves (an aligned move faults on an address that is not).  Run by hand only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _model(case: str):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if case == "matmul":  # BERT's FFN in: [128,768] @ [768,3072]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 768])
        w = numpy_helper.from_array(rng.standard_normal((768, 3072)).astype(np.float32), "w")
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 3072])
    elif case == "add":  # a residual add's shape, one operand a model input
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 56, 56])
        w = numpy_helper.from_array(rng.standard_normal((1, 256, 56, 56)).astype(np.float32),
                                    "w")
        node = helper.make_node("Add", ["x", "w"], ["y"])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 56, 56])
    else:  # ResNet-50 stage 1: 3x3, 64 -> 64 at 56x56
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])
        w = numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32),
                                    "w")
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])
    g = helper.make_graph([node], case, [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _relaxed(func, params: list[int]):
    """``func`` with the buffers of ``params`` declared element-aligned (TVMScript round
    trip: the buffer's ``align`` is what the packed API marks as storage_alignment)."""
    import tvm

    text = func.script()
    head, body = text.split("):\n", 1)
    args = re.split(r",\s*(?=\w+: T\.Buffer)", head[head.index("(") + 1:])
    for i in params:
        args[i] = re.sub(r'"(\w+)"\)$', lambda m: f'"{m.group(1)}", align='
                         f'{np.dtype(m.group(1)).itemsize})', args[i].rstrip())
    return tvm.script.from_source(head[:head.index("(") + 1] + ", ".join(args) + "):\n" + body)


def main(argv=None):
    import tvm

    import compiler
    from compiler.driver import schedule_kernels
    from compiler.tools.bench import host_cpu

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--cases", nargs="*", default=["matmul", "conv", "add"])
    args = ap.parse_args(argv)
    print(f"host: {host_cpu()}")
    target = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    tmp = tempfile.mkdtemp()
    for case in args.cases:
        import onnx

        path = os.path.join(tmp, f"{case}.onnx")
        onnx.save(_model(case), path)
        mod, rules, _ = schedule_kernels(path)
        sess = compiler.compile(path).session()
        graph = sess.graph
        x_t = graph["inputs"][0]["tensor"]
        k = next(k for k, c in enumerate(graph["calls"]) if x_t in c["args"])
        name = graph["calls"][k]["kernel"]
        func = mod[name]
        pos = graph["calls"][k]["args"].index(x_t)
        fns = {}
        for label, f in (("align 64", func), ("align elem", _relaxed(func, [pos]))):
            lib = tvm.compile(tvm.IRModule({name: f.with_attr("global_symbol", name)}),
                              target=target)
            fns[label] = lib[name]
            asm = (lib.mod if hasattr(lib, "mod") else lib).inspect_source("asm")
            moves = {kind: len(re.findall(rf"\bvmov{kind}p[sd]\b", asm)) for kind in "au"}
            print(f"{case:<8} {label:<11} vector moves: aligned (vmovap*) {moves['a']}, "
                  f"unaligned (vmovup*) {moves['u']}")
        call_args = list(sess._calls[k][1])
        x = sess._np[x_t]
        feeds = {}
        for off in (0, 4):  # separate memory per feed
            raw = np.empty(x.nbytes + 128, np.uint8)
            start = (-raw.ctypes.data) % 64 + off
            feeds[off] = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
        for v in feeds.values():
            v[...] = np.random.default_rng(1).standard_normal(x.shape)
        runs = [("align 64", 0), ("align elem", 0), ("align elem", 4)]
        times = {r: [] for r in runs}
        outs = {}
        for _ in range(args.repeat):
            for label, off in runs:
                a = list(call_args)
                a[pos] = feeds[off]  # a numpy array: tvm_ffi wraps it, no alignment check
                t0 = time.perf_counter()
                fns[label](*a)
                times[(label, off)].append(time.perf_counter() - t0)
                outs[(label, off)] = call_args[-1].numpy().copy()
        ref = outs[runs[0]]
        for (label, off), ts in times.items():
            same = np.allclose(outs[(label, off)], ref, rtol=1e-5, atol=1e-4)
            print(f"{case:<8} {name[:36]:<36} {label:<11} feed%64={off:<3} "
                  f"median {np.median(ts) * 1e6:9.1f} us  min {np.min(ts) * 1e6:9.1f} us  "
                  f"same={same}  rule={rules.get(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
