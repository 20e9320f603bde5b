"""run()'s fixed cost on tiny models, onnxc against onnxruntime (issue #14), run by hand.

Models: Relu on float32 [1, 64]; a 10-node MLP ([1, 64], three MatMul + Add + Relu layers
and a last MatMul, hidden 64); ``gather_gpt2_50257x768_1`` and ``softmax_bert`` from
scripts/kernel_grid.py.  Each engine runs in its own worker processes, alternating round by
round (``compiler.tools.bench.measure``: onnxruntime with intra_op_num_threads = onnxc's
threads, the feed dict built once, ``outs = sess.run(None, feed)`` in a loop); the figures
are medians over all runs of all rounds.

    python scripts/bench_overhead.py                    # all four, 3 rounds x 2000 runs
    python scripts/bench_overhead.py --models relu mlp --rounds 5 --runs 3000 --threads 2
    python scripts/bench_overhead.py --models --output-reuse 30   # 64 MiB output, reuse on/off

Columns: model, kernels, onnxc us, onnxruntime us, ratio (< 1: onnxc faster), outputs
match.  The first line names the CPU (compiler.tools.bench.host_cpu()) and the load.
The tree measured is the one ``compiler`` imports from, and the workers (``python -m``)
import from the current directory first: for a before / after table run it from the other
checkout, ``cd /path/to/it && PYTHONPATH=$PWD python /path/to/scripts/bench_overhead.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# appended, so that PYTHONPATH chooses the tree measured (PYTHONPATH=/work/main: "before")
for p in (ROOT, os.path.join(ROOT, "scripts")):
    if p not in sys.path:
        sys.path.append(p)


def _relu():
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [vi("x", TensorProto.FLOAT, [1, 64])],
                          [vi("y", TensorProto.FLOAT, [1, 64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _mlp():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32)
                                          * 0.1, f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        prev = f"r{i}"
    inits.append(numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32),
                                         "wo"))
    nodes.append(helper.make_node("MatMul", [prev, "wo"], ["y"]))
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "mlp10", [vi("x", TensorProto.FLOAT, [1, 64])],
                          [vi("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _grid(name):
    def build():
        import kernel_grid

        case = next(c for c in kernel_grid.CASES if c.name == name)
        return case.build()
    return build


MODELS = {"relu": _relu, "mlp": _mlp, "gather_gpt2": _grid("gather_gpt2_50257x768_1"),
          "softmax_bert": _grid("softmax_bert")}


def _expand():
    """A 64 MiB output from a 16 KiB input: Expand [1, 4096] -> [4096, 4096] float32."""
    from onnx import TensorProto, helper, numpy_helper

    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])], "expand64",
        [vi("x", TensorProto.FLOAT, [1, 4096])], [vi("y", TensorProto.FLOAT, [4096, 4096])],
        [numpy_helper.from_array(np.array([4096, 4096], np.int64), "shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def output_reuse(tmp: str, runs: int, threads: int) -> None:
    """run() of a 64 MiB output with output reuse on and off, one process, alternating
    (``SessionOptions.reuse_outputs``): what the page faults of fresh memory cost."""
    import time

    import onnx

    import compiler
    import runtime

    path = os.path.join(tmp, "expand64.onnx")
    onnx.save(_expand(), path)
    so = compiler.compile(path, target="host").export(os.path.join(tmp, "expand64.so"))
    sessions = {on: runtime.load(so, runtime.SessionOptions(intra_op_num_threads=threads,
                                                            reuse_outputs=on))
                for on in (True, False)}
    feed = {"x": np.random.default_rng(0).standard_normal((1, 4096)).astype(np.float32)}
    times = {True: [], False: []}
    outs = {on: s.run(None, feed) for on, s in sessions.items()}
    for _ in range(runs):
        for on, sess in sessions.items():
            t0 = time.perf_counter()
            outs[on] = sess.run(None, feed)
            times[on].append(time.perf_counter() - t0)
    fn, args = sessions[True]._calls[0]
    kernel = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(*args)
        kernel.append(time.perf_counter() - t0)
    print(f"expand 64 MiB output: run() reuse on {np.median(times[True]) * 1e3:.2f} ms, "
          f"off {np.median(times[False]) * 1e3:.2f} ms, kernel alone "
          f"{np.median(kernel) * 1e3:.2f} ms (medians of {runs})")


def main(argv=None) -> int:
    import onnx

    import compiler
    from compiler.tools.bench import host_cpu, measure

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output-reuse", type=int, default=0, metavar="RUNS",
                    help="also time a 64 MiB output's run() with reuse on / off, RUNS each")
    args = ap.parse_args(argv)
    print(f"host: {host_cpu()}; load average {os.getloadavg()[0]:.1f}; "
          f"{args.threads} threads; {args.rounds} rounds x {args.runs} runs")
    print(f"{'model':<14} {'kernels':>7} {'onnxc us':>9} {'ort us':>9} {'ratio':>6}  match")
    with tempfile.TemporaryDirectory(prefix="onnxc-overhead-") as tmp:
        for name in args.models:
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(MODELS[name](), path)
            cm = compiler.compile(path, target="host")
            so = cm.export(os.path.join(tmp, f"{name}.so"))
            r = measure(path, so, rounds=args.rounds, runs=args.runs, warmup=200,
                        threads=args.threads)
            print(f"{name:<14} {cm.report['kernels']:>7} "
                  f"{r['onnxc']['median_ms'] * 1e3:>9.1f} "
                  f"{r['onnxruntime']['median_ms'] * 1e3:>9.1f} {r['ratio']:>6.2f}  "
                  f"{r['allclose']}", flush=True)
        if args.output_reuse:
            output_reuse(tmp, args.output_reuse, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
