"""What each graph pass buys, run by hand: kernel count with our passes against TVM's
FuseOps alone (opt level 0), and latency with each pass disabled in turn.

Latency is single-thread CPU time per run (``scripts/cpu_time.py``: robust to other jobs
on the machine), relative to the default pipeline measured in the same process; outputs
are checked against onnxruntime for every variant (a disabled pass must still give a
correct model).

    python scripts/pass_ablation.py resnet50 mobilenetv2 bert
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_time import cpu_per_run, model_path  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort

    import compiler
    import runtime
    import zoo
    from compiler.pipeline import graph_passes

    names = [p.name for p in graph_passes()]
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            path = model_path(model, tmp)
            feeds = zoo.random_inputs(onnx.load(path, load_external_data=False))
            want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
                None, feeds)
            variants = {"default": {}, "opt level 0 (FuseOps alone)": {"opt_level": 0}}
            variants.update({f"-{n}": {"disabled_passes": [n]} for n in names})
            sessions, rows = {}, []
            for label, kw in variants.items():
                try:
                    cm = compiler.compile(path, **kw)
                except compiler.CompileError as e:
                    rows.append((label, None, None, f"compile failed: {e}"))
                    continue
                s = cm.session(runtime.SessionOptions(intra_op_num_threads=1))
                got = s.run(None, feeds)
                diff = max(float(np.abs(np.asarray(g, np.float64) - w).max())
                           for g, w in zip(got, want))
                sessions[label] = (s, cm.report["kernels"], diff)
            times = {k: [] for k in sessions}
            for _ in range(args.rounds):  # interleaved: the load drifts equally for all
                for label, (s, _, _) in sessions.items():
                    times[label].append(cpu_per_run(lambda: s.run(None, feeds), args.seconds))
            base = float(np.median(times["default"]))
            print(f"\n{model}: 1 thread, CPU ms per run (x default); kernels; max|diff| vs ORT")
            for label, (s, kernels, diff) in sessions.items():
                t = float(np.median(times[label]))
                print(f"  {label:34s} {t * 1e3:9.2f} ms ({t / base:5.2f}x)  {kernels:4d} kernels"
                      f"  {diff:8.1e}")
            for label, _, _, why in rows:
                print(f"  {label:34s} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
