"""In-process single-thread kernel timing: onnxc session (bind_io) vs ORT, best/median of N.

Usage (from the repository root): ``N=100 python scripts/kbench_rows.py softmax_vit
softmax_bert softmax_16x4096 layernorm_197x768`` (case names from scripts/kernel_grid.py)."""
import os, sys, time, numpy as np
os.environ.setdefault("TVM_NUM_THREADS", "1")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT); sys.path.insert(0, os.path.join(_ROOT, "scripts"))
import kernel_grid as kg, compiler, runtime, onnxruntime as ort
from runtime.instruments import SessionOptions
from runtime.session import _aligned_bytes
names = sys.argv[1:]
cases = {c.name: c for c in kg.CASES} if hasattr(kg, "CASES") else None
from compiler.tools.bench import random_feeds
import onnx
N = int(os.environ.get("N", "200"))
for name in names:
    c = cases[name]
    m = c.build()
    cm = compiler.compile(m, target="host")
    path = f"/tmp/kb_{name}.so"; cm.export(path)
    s = runtime.load(path, SessionOptions(intra_op_num_threads=1))
    feeds = random_feeds(m.graph.input, seed=0) if False else None
    from compiler.tools.bench import random_feeds as rf
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
    o = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = rf([(i.name, i.shape, i.dtype) for i in s.get_inputs()], seed=0)
    def t(f):
        for _ in range(5): f()
        ts = []
        for _ in range(N):
            a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
        return min(ts) * 1e3, float(np.median(ts)) * 1e3
    # kernels only
    def kern():
        for fn, args in s._calls: fn(*args)
    a = t(lambda: s.run(None, feeds)); k = t(kern); b = t(lambda: o.run(None, feeds))
    rules = cm.report.get("rules") or {}
    print(f"{name:28s} onnxc best {a[0]:.3f} med {a[1]:.3f} | kernels best {k[0]:.3f} | ort best {b[0]:.3f} med {b[1]:.3f} | ratio best {a[0]/b[0]:.2f} kern/ort {k[0]/b[0]:.2f}", flush=True)
