"""Latency of a compiled model next to onnxruntime's, each engine in its own process.

onnxruntime's idle worker threads spin and steal the cores from whatever runs next in
the same process, so every measurement runs in a fresh worker process, the engines
alternate round by round, and the figures are medians over all rounds.  Outputs of
both engines are compared on the same seeded inputs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np


def host_cpu() -> str:
    """This machine's CPU as benchmark figures must name it: lscpu's model name and the
    LLVM CPU name (``AMD EPYC (LLVM: znver3)``)."""
    name = "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name")), "?")
    except OSError:
        pass
    try:
        import tvm

        llvm_cpu = tvm.target.codegen.llvm_get_system_cpu()
    except Exception as e:  # noqa: BLE001 - a label, never a failure
        llvm_cpu = f"? ({type(e).__name__})"
    return f"{name} (LLVM: {llvm_cpu})"


def random_feeds(inputs, seed: int = 0, bounds: dict | None = None) -> dict:
    """Seeded inputs for [(name, shape, dtype)]: normal floats, small non-negative ints
    (below ``bounds[name]`` where given: the axis an input indexes, ``index_limits``)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, dtype in inputs:
        if np.issubdtype(np.dtype(dtype), np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == "bool":
            feeds[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            top = max(1, min(8, (bounds or {}).get(name, 8)))
            feeds[name] = rng.integers(0, top, size=shape).astype(dtype)
    return feeds


def index_limits(index_bounds: list) -> dict:
    """{input: the smallest axis it indexes} of a manifest's ``index_bounds``."""
    out: dict = {}
    for b in index_bounds:
        size = b["size"] if "size" in b else min(b["sizes"])
        out[b["input"]] = min(out.get(b["input"], size), size)
    return out


def feed_shapes(inputs, shapes: dict | None) -> list:
    """[(name, shape, dtype)] with every shape concrete: ``shapes`` (input name -> dims)
    replaces a declared shape; a declared shape with a symbolic dim and no entry in
    ``shapes`` is an error naming the input."""
    out = []
    for name, shape, dtype in inputs:
        if shapes and name in shapes:
            shape = [int(d) for d in shapes[name]]
        elif any(not isinstance(d, int) or d < 0 for d in shape):
            raise ValueError(f"input {name!r} has symbolic shape {list(shape)}: give its "
                             f"benchmark shape (measure(shapes={{{name!r}: [...]}}))")
        out.append((name, shape, dtype))
    return out


def worker(engine: str, path: str, runs: int, warmup: int, out_npz: str, threads: int,
           shapes: dict | None = None, limits: dict | None = None) -> dict:
    """One engine's timings of ``runs`` runs after ``warmup`` (run as ``python -m
    compiler.bench``); inputs with symbolic dims take their shape from ``shapes``, integer
    inputs stay below ``limits`` (``index_limits``)."""
    import time

    if engine == "onnxc":
        import runtime

        sess = runtime.load(path, runtime.SessionOptions(intra_op_num_threads=threads))
        inputs = [(i.name, i.shape, i.dtype) for i in sess.get_inputs()]
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        np_types = {"tensor(float)": "float32", "tensor(double)": "float64",
                    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool",
                    "tensor(float16)": "float16", "tensor(uint8)": "uint8", "tensor(int8)": "int8"}
        inputs = [(i.name, i.shape, np_types[i.type]) for i in sess.get_inputs()]
    feeds = random_feeds(feed_shapes(inputs, shapes), bounds=limits)
    outs = None
    for _ in range(warmup):
        outs = sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    if out_npz:
        np.savez(out_npz, *outs)
    return {"times": times}


# A model that computes in 16-bit floats (onnxruntime's fp16 converter keeps fp32 inputs and
# outputs around fp16 layers) is compared within its own precision: fp16 keeps 11 bits
# (about 5e-4 per rounding), which a long sum compounds, and two engines round differently
HALF_MATCH = {"rtol": 1e-2, "scale_tol": 1e-2}
# A quantized model (onnxruntime's quantizer output: QDQ, QOperator, dynamic) within 5e-2 of
# its largest output (issue #16's int8 accuracy bound): a value one quantisation step apart
# in one engine moves every later layer's rounding
QUANT_MATCH = {"rtol": 1e-2, "scale_tol": 5e-2}
_QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
              "ConvInteger", "QLinearConv", "QLinearMatMul", "DynamicQuantizeMatMul",
              "MatMulIntegerToFloat", "QAttention", "QGemm", "MatMulNBits"}
DEFAULT_MATCH = {"rtol": 1e-4, "atol": 1e-5, "scale_tol": 1e-5}


def match_for(model) -> dict:
    """``outputs_match``'s tolerances for ``model`` (a path or ModelProto): ``QUANT_MATCH``
    for a quantized model, ``HALF_MATCH`` when any initializer, declared value or Cast is
    float16 / bfloat16, else the defaults."""
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model, load_external_data=False)
    half = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    g = model.graph
    if any(n.op_type in _QUANT_OPS for n in g.node):
        return dict(QUANT_MATCH)
    declared = [v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)]
    casts = [a.i for n in g.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    if half & {t.data_type for t in g.initializer} | half & set(declared) | half & set(casts):
        return dict(HALF_MATCH)
    return dict(DEFAULT_MATCH)


def outputs_match(ours: np.ndarray, ref: np.ndarray, rtol: float = 1e-4,
                  atol: float = 1e-5, scale_tol: float = 1e-5) -> bool:
    """``|ours - ref| <= max(atol, scale_tol * max|ref|) + rtol * |ref|`` element-wise, NaN
    equal to NaN.  The absolute part grows with the output's magnitude because a long fp32
    sum's rounding error does (ResNet-50's logits of up to ~1000 differ by ~1e-3 between
    onnxruntime and torch, and between any two summation orders), while an element near 0
    by cancellation keeps the plain relative test from meaning anything."""
    if ours.shape != ref.shape:
        return False
    if ours.dtype.kind not in "fc" and ref.dtype.kind not in "fc":
        return bool(np.array_equal(ours, ref))
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(b)
    scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
    return bool(np.allclose(a, b, rtol=rtol, atol=max(atol, scale_tol * scale),
                            equal_nan=True))


def top_kernels(report: dict, top: int) -> str:
    """The compile report's ``top`` heaviest kernels (by FLOPs) as a table: rule, MFLOP,
    share of the model's FLOPs, the ONNX nodes (the benchmarks' "where the work is")."""
    table = report["kernel_table"]
    total = sum(r["flops"] for r in table) or 1
    lines = [f"{'kernel':<44} {'rule':<22} {'MFLOP':>8} {'share':>6}  nodes"]
    for r in sorted(table, key=lambda r: -r["flops"])[:top]:
        lines.append(f"{r['kernel'][:44]:<44} {r['rule'][:22]:<22} {r['flops'] / 1e6:>8.1f} "
                     f"{r['flops'] / total:>6.1%}  {'+'.join(r['nodes'][:4])[:60]}")
    return "\n".join(lines)


def measure(model_path: str, artifact: str, rounds: int = 5, runs: int = 20, warmup: int = 3,
            threads: int | None = None, compare: bool = True, match: dict | None = None,
            shapes: dict | None = None) -> dict:
    """Alternate onnxc and onnxruntime worker processes; return medians and output diffs
    (``allclose``: ``outputs_match`` with ``match``'s tolerances, its defaults if None).
    ``shapes`` (input name -> dims) gives the feeds' shapes where the model's (or the
    artifact's) input shapes are symbolic; both engines get the same feeds."""
    import onnx

    from compiler.frontend.importer import index_bounds

    threads = threads or len(os.sched_getaffinity(0))
    engines = [("onnxc", artifact)] + ([("onnxruntime", model_path)] if compare else [])
    # integer feeds within the axes they index, read once from the model: both engines
    # get the same feeds
    limits = index_limits(index_bounds(onnx.load(model_path, load_external_data=False)))
    times = {e: [] for e, _ in engines}
    with tempfile.TemporaryDirectory(prefix="onnxc-bench-") as tmp:
        for r in range(rounds):
            for engine, path in engines:
                npz = os.path.join(tmp, f"{engine}.npz") if r == 0 else ""
                cmd = [sys.executable, "-m", "compiler.tools.bench", engine, path, str(runs),
                       str(warmup), npz, str(threads), json.dumps(shapes or {}),
                       json.dumps(limits)]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(f"{engine} worker failed: {p.stderr.strip()[-2000:]}")
                times[engine] += json.loads(p.stdout.strip().splitlines()[-1])["times"]
        result = {e: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3,
                      "samples": len(t)} for e, t in times.items()}
        if compare:
            a = np.load(os.path.join(tmp, "onnxc.npz"))
            b = np.load(os.path.join(tmp, "onnxruntime.npz"))
            diffs = []
            for k in a.files:
                x, y = a[k].astype(np.float64), b[k].astype(np.float64)
                diffs.append(float(np.max(np.abs(x - y))) if x.size else 0.0)
            result["max_abs_diff"] = diffs
            result["allclose"] = all(outputs_match(a[k], b[k], **(match or {})) for k in a.files)
            result["ratio"] = result["onnxc"]["median_ms"] / result["onnxruntime"]["median_ms"]
            a_outs = [a[k] for k in a.files]
        else:
            a = np.load(os.path.join(tmp, "onnxc.npz"))
            a_outs = [a[k] for k in a.files]
        result["onnxc_outputs"] = a_outs
    return result


def main(argv) -> None:
    """The worker's command line: ENGINE PATH RUNS WARMUP OUT_NPZ THREADS [SHAPES_JSON
    [LIMITS_JSON]]; prints JSON."""
    engine, path, runs, warmup, npz, threads = argv[:6]
    shapes = json.loads(argv[6]) if len(argv) > 6 else None
    limits = json.loads(argv[7]) if len(argv) > 7 else None
    print(json.dumps(worker(engine, path, int(runs), int(warmup), npz, int(threads), shapes,
                            limits)))


if __name__ == "__main__":
    main(sys.argv[1:])
