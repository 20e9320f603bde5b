#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: compile the zoo (mlp, cnn, transformer) for the GPU,
# check numerics against onnxruntime (CPU) and print latency.  One run, under 5 minutes.
#
#   scripts/gpu_check.sh [--target cuda:sm_90] [--repeat 50]
#
# Needs: nvidia-smi, a TVM build with the CUDA runtime (tvm.runtime.enabled("cuda"): the
# PyPI apache-tvm wheel is CPU-only and cannot run CUDA artifacts), onnxruntime.
# Exit status 0 when every model matches (rtol 1e-4, atol 1e-4), 1 otherwise, 2 when the
# machine cannot run the check at all (message says why).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && . .venv/bin/activate
export PYTHONPATH="$PWD:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
export TVM_CUDA_COMPILE_MODE="${TVM_CUDA_COMPILE_MODE:-nvcc}"
exec timeout 290 python - "$@" <<'EOF'
import argparse, sys, time
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--target", default="cuda")
p.add_argument("--repeat", type=int, default=50)
p.add_argument("--models", default="mlp,cnn,transformer")
args = p.parse_args()

import tvm
if not tvm.runtime.enabled("cuda"):
    print(f"gpu_check: TVM {tvm.__version__} has no CUDA runtime; install a CUDA-enabled TVM "
          "build (the PyPI wheel is CPU-only)", file=sys.stderr)
    sys.exit(2)
if not tvm.cuda(0).exist:
    print("gpu_check: no CUDA device visible", file=sys.stderr)
    sys.exit(2)

import onnxruntime as ort
import compiler, runtime, targets, zoo

t = targets.resolve(args.target)
print(f"gpu_check: target {t.name} ({t.cpu}), TVM {tvm.__version__}")
failed = 0
for name in args.models.split(","):
    model = zoo.build(name)
    t0 = time.perf_counter()
    cm = compiler.compile(model, target=t)
    so = f"/tmp/onnxc_gpu_{name}.so"
    cm.export(so)
    compile_s = time.perf_counter() - t0
    sess = runtime.load(so)
    feeds = zoo.random_inputs(model, seed=0)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    got = sess.run(None, feeds)
    err = max(float(np.max(np.abs(g - r))) for g, r in zip(got, ref))
    ok = all(np.allclose(g, r, rtol=1e-4, atol=1e-4) for g, r in zip(got, ref))
    failed += not ok
    for _ in range(5):
        sess.run(None, feeds)
    times = []
    for _ in range(args.repeat):
        s = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - s)
    print(f"{name:12s} {'OK ' if ok else 'BAD'} max|err| {err:.2e}  compile {compile_s:5.1f}s  "
          f"latency median {np.median(times) * 1e3:7.3f} ms (incl. host<->device copies)  "
          f"schedules {cm.report['schedules']}")
sys.exit(1 if failed else 0)
EOF
