"""In-process single-thread CPU time per call: onnxc kernels only, onnxc ``run()`` and
onnxruntime, alternating, on scripts/kernel_grid.py's cases.

    N=20 R=5 python scripts/kbench_rows.py softmax_vit argmax_seg_ax1 vocoder1d_k4s2p1

Each call is timed with ``time.thread_time`` (CPU time of this thread: a run descheduled
by other jobs on a shared host does not count), R rounds of N calls per engine in turn;
min / median per engine.  "kernels" replays the session's kernel calls over its arena
(``SessionOptions(bind_io=False)``, its input tensors refilled before each timed call,
untimed: an in-place kernel may overwrite them); "run" is ``Session.run`` (with its input copies: numpy's own arrays are
seldom 64-byte aligned) and "ort" onnxruntime's ``run`` with one thread.  Integer inputs
take values 0..7 as compiler.tools.bench.random_feeds does; outputs are compared
(rtol 1e-4, atol 1e-5)."""

import os
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "scripts"))

import kernel_grid as kg  # noqa: E402
import onnxruntime as ort  # noqa: E402

import compiler  # noqa: E402
import runtime  # noqa: E402
from runtime.instruments import SessionOptions  # noqa: E402


def feeds_for(sess) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for i in sess.get_inputs():
        if "int64" in i.type:
            out[i.name] = rng.integers(0, 8, size=i.shape).astype(np.int64)
        elif "bool" in i.type:
            out[i.name] = rng.integers(0, 2, size=i.shape).astype(bool)
        else:
            out[i.name] = rng.standard_normal(i.shape).astype(np.float32)
    return out


def block(f, n: int, prep=None) -> list:
    ts = []
    for _ in range(n):
        if prep is not None:
            prep()
        a = time.thread_time()
        f()
        ts.append(time.thread_time() - a)
    return ts


def main(names, n: int, rounds: int) -> None:
    cases = {c.name: c for c in kg.CASES}
    for name in names:
        m = cases[name].build()
        cm = compiler.compile(m, target=kg.resolve_target("host", 1), layout=cases[name].layout)
        path = f"/tmp/kbench_{name}.so"
        cm.export(path)
        s = runtime.load(path, SessionOptions(intra_op_num_threads=1))
        k = runtime.load(path, SessionOptions(intra_op_num_threads=1, bind_io=False))
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        o = ort.InferenceSession(m.SerializeToString(), so,
                                 providers=["CPUExecutionProvider"])
        feeds = feeds_for(o)
        ok = all(np.allclose(a, b, rtol=1e-4, atol=1e-5)
                 for a, b in zip(s.run(None, feeds), o.run(None, feeds)))
        k.run(None, feeds)
        inputs = [(k._np[t], feeds[n]) for t, n in zip(k._input_tensors, k._input_names)]

        def refill():  # an in-place kernel may have overwritten an input (Add on ids)
            for view, value in inputs:
                view[...] = value

        def kernels():
            for fn, args in k._calls:
                fn(*args)
        engines = {"kernels": kernels, "run": lambda: s.run(None, feeds),
                   "ort": lambda: o.run(None, feeds)}
        ts = {e: [] for e in engines}
        for e, f in engines.items():
            block(f, 3, refill if e == "kernels" else None)
        for _ in range(rounds):
            for e, f in engines.items():
                ts[e] += block(f, n, refill if e == "kernels" else None)
        lo = {e: min(v) * 1e3 for e, v in ts.items()}
        med = {e: float(np.median(v)) * 1e3 for e, v in ts.items()}
        table = cm.report.get("kernel_table") or []
        heavy = max(table, key=lambda r: (r.get("flops") or 0, r.get("bytes") or 0),
                    default={})
        print(f"{name:26s} " + " ".join(f"{e} {lo[e]:.3f}/{med[e]:.3f}" for e in engines)
              + f" ms (min/median) | kernels/ort {lo['kernels'] / lo['ort']:.2f} "
              f"({med['kernels'] / med['ort']:.2f} median) run/ort {lo['run'] / lo['ort']:.2f}"
              f" | allclose {ok} | {heavy.get('rule')} {cm.report.get('schedules')}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:], int(os.environ.get("N", "20")), int(os.environ.get("R", "5")))
