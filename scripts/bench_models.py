#!/usr/bin/env python3
"""Whole-model benchmark on real exports: onnxc (untuned, host) next to onnxruntime.

For each ``.onnx`` in a folder (``scripts/export_models.py`` writes them; torch is not needed
here): compile with ``compiler.compile(path, target="host")`` in a child process with a
timeout (``isolate=True, timeout=T``), export the ``.so``, and time onnxc against
onnxruntime with ``compiler.tools.bench.measure`` (alternating worker processes, one engine per
process, medians over rounds x runs).  Prints one row per model: compile seconds, kernel
calls, GFLOP per run (TVM's estimate over the kernel calls), onnxc and onnxruntime median
ms, their ratio, whether outputs match (``compiler.tools.bench.outputs_match``: rtol 1e-4, atol
1e-5 or 1e-5 x the output's largest magnitude) and the max abs
difference, and the share of the model's FLOPs in kernels only the fallback scheduled
(the report's ``kernel_table``); then the geomean ratio.  A model that fails (compile error, crash, timeout, worker error) is one row naming
the error type and its first line; the table always completes.

    . .venv/bin/activate
    python scripts/bench_models.py [DIR] [--models resnet50 bert_base] [--rounds 5 --runs 20]
                                   [--timeout 300] [--json results.json] [--keep-so DIR]
    python scripts/bench_models.py /work/real_models --rounds 3 --runs 10 --json /tmp/r.json

DIR defaults to /work/real_models.  ``--timeout 0`` compiles in-process (no time limit).
Models with symbolic dimensions get ``input_shapes`` from ``--shape name=1,128`` options
(the exports are static, so none should need it).  ``--precision bf16`` compiles the
lower-precision build (AVX512-BF16 hosts) and times it against onnxruntime's fp32; its rows
match within 2e-2 (``BF16_MATCH``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def cpu_line() -> str:
    from compiler.tools.bench import host_cpu

    return f"CPU: {host_cpu()}, {len(os.sched_getaffinity(0))} threads"


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def static_shapes(path: str) -> dict:
    """{input: [dims]} for inputs with a symbolic dimension (empty for static exports)."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    dyn = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param
                for d in vi.type.tensor_type.shape.dim]
        if any(not isinstance(d, int) or d <= 0 for d in dims):
            dyn[vi.name] = dims
    return dyn


def bench_one(path: str, args, tmp: str) -> dict:
    import compiler
    from compiler.lowering.kernel_table import generic_share
    from compiler.tools.bench import measure

    name = os.path.splitext(os.path.basename(path))[0]
    row = {"model": name, "path": path}
    stage = "compile"
    try:
        shapes = None
        dyn = static_shapes(path)
        if dyn:
            shapes = {k: v for k, v in args.shape.items() if k in dyn}
            missing = [k for k in dyn if k not in shapes]
            if missing:
                raise ValueError(f"inputs with symbolic dims {({k: dyn[k] for k in missing})}: "
                                 "pass --shape NAME=D0,D1,...")
        kw = {"input_shapes": shapes} if shapes else {}
        if args.precision != "fp32":
            kw["precision"] = args.precision
        if args.timeout > 0:
            kw.update(isolate=True, timeout=args.timeout)
        t0 = time.perf_counter()
        cm = compiler.compile(path, target="host", **kw)
        row["compile_s"] = time.perf_counter() - t0
        if not isinstance(cm, compiler.CompiledModel):
            raise RuntimeError(f"compiled to a {type(cm).__name__} (symbolic shapes?): "
                               f"{getattr(cm, 'report', {})}")
        rep = cm.report
        row["kernels"] = rep["kernels"]
        row["distinct_kernels"] = rep["distinct_kernels"]
        row["schedules"] = rep.get("schedules", {})
        row["fallback_kernels"] = row["schedules"].get("fallback", 0)
        row["fallback_flops_share"] = generic_share(rep["kernel_table"])[0]
        row["gflop"] = sum(r["flops"] for r in rep["kernel_table"]) / 1e9
        row["arena_mib"] = rep["memory"]["arena_bytes"] / 2**20
        row["stages"] = rep.get("stages", {})
        so_dir = args.keep_so or tmp
        so = cm.export(os.path.join(so_dir, f"{name}.so"))
        del cm
        stage = "measure"
        r = measure(path, so, rounds=args.rounds, runs=args.runs,
                    warmup=1 if args.runs < 5 else 3,
                    match=BF16_MATCH if args.precision != "fp32" else None, shapes=shapes)
        row.update(onnxc_ms=r["onnxc"]["median_ms"], ort_ms=r["onnxruntime"]["median_ms"],
                   onnxc_min_ms=r["onnxc"]["min_ms"], ort_min_ms=r["onnxruntime"]["min_ms"],
                   ratio=r["ratio"], match=bool(r["allclose"]),
                   max_abs_diff=max(r["max_abs_diff"]) if r["max_abs_diff"] else 0.0,
                   nan_outputs=int(sum(int(np.isnan(o).sum()) for o in r["onnxc_outputs"]
                                       if np.issubdtype(o.dtype, np.floating))))
        if not args.keep_so:
            os.unlink(so)
    except Exception as e:  # noqa: BLE001 - one row per failure, never abort the table
        row["error"] = first_line(e)
        row["error_stage"] = stage
        row["error_detail"] = str(e).strip()[:4000]
        if args.verbose:
            traceback.print_exc()
    return row


# bf16 builds against onnxruntime's fp32: within 2e-2 of each element and of the output's
# largest magnitude (issue: "outputs within 2e-2 relative of fp32")
BF16_MATCH = {"rtol": 2e-2, "scale_tol": 2e-2}

HDR = (f"{'model':<22} {'comp s':>7} {'kern':>5} {'GFLOP':>7} {'onnxc ms':>10} {'ort ms':>9} "
       f"{'ratio':>6} {'match':>5} {'max|diff|':>9} {'fallback FLOPs':>14}")


def fmt(r: dict) -> str:
    if "error" in r:
        comp = f"{r['compile_s']:>7.1f}" if "compile_s" in r else f"{'-':>7}"
        kern = f"{r['kernels']:>5}" if "kernels" in r else f"{'-':>5}"
        return f"{r['model']:<22} {comp} {kern} ERROR ({r['error_stage']}) {r['error'][:160]}"
    fb = f"{r['fallback_flops_share']:.1%}"
    return (f"{r['model']:<22} {r['compile_s']:>7.1f} {r['kernels']:>5} {r['gflop']:>7.2f} "
            f"{r['onnxc_ms']:>10.2f} {r['ort_ms']:>9.2f} {r['ratio']:>6.2f} "
            f"{'yes' if r['match'] else 'NO':>5} {r['max_abs_diff']:>9.2e} {fb:>14}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", nargs="?", default="/work/real_models", help="folder of .onnx files")
    p.add_argument("--models", nargs="+", default=None,
                   help="model names (file stems in DIR) or .onnx paths; default: all in DIR")
    p.add_argument("--rounds", type=int, default=5, help="worker processes per engine")
    p.add_argument("--runs", type=int, default=20, help="timed runs per worker process")
    p.add_argument("--timeout", type=float, default=300,
                   help="compile time limit in seconds, in a child process (0: in-process)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="input_shapes for inputs with symbolic dimensions")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "bf16-emulated"],
                   help="compile precision; bf16 rows match onnxruntime's fp32 within 2e-2")
    p.add_argument("--keep-so", default=None, metavar="DIR", help="keep the artifacts here")
    p.add_argument("--json", default=None, help="write the results here too")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks of failures")
    args = p.parse_args(argv)
    args.shape = {k: [int(d) for d in v.split(",")]
                  for k, v in (s.split("=", 1) for s in args.shape)}
    if args.models:
        paths = [m if m.endswith(".onnx") else os.path.join(args.dir, f"{m}.onnx")
                 for m in args.models]
    else:
        paths = sorted(glob.glob(os.path.join(args.dir, "*.onnx")))
    if not paths:
        print(f"no .onnx files in {args.dir}", file=sys.stderr)
        return 2
    if args.keep_so:
        os.makedirs(args.keep_so, exist_ok=True)

    cpu = cpu_line()
    print(cpu)
    how = f"compile timeout {args.timeout:g}s" if args.timeout > 0 else "compile in-process"
    print(f"onnxc untuned (target host) vs onnxruntime CPU EP; {args.rounds} rounds x "
          f"{args.runs} runs per engine, medians; {how}")
    print(HDR, flush=True)
    rows = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnxc-bench-models-") as tmp:
        for path in paths:
            r = bench_one(path, args, tmp)
            rows.append(r)
            print(fmt(r), flush=True)
    ok = [r for r in rows if "error" not in r]
    geo = float(np.exp(np.mean(np.log([r["ratio"] for r in ok])))) if ok else None
    if geo is not None:
        print(f"geomean onnxc/onnxruntime latency over {len(ok)} models: {geo:.2f}x")
    bad = [r for r in rows if "error" in r or not r.get("match", True)]
    if bad:
        print(f"\n{len(bad)} model(s) failed or mismatched:")
        for r in bad:
            if "error" in r:
                lines = r["error_detail"].splitlines()[:6]
                print(f"  {r['model']} ({r['error_stage']}): {r['error'].split(':')[0]}")
                for ln in lines:
                    print(f"      {ln[:300]}")
            else:
                print(f"  {r['model']}: outputs differ, max abs diff {r['max_abs_diff']:.3e}"
                      f"{', NaN in onnxc outputs' if r['nan_outputs'] else ''}")
    print(f"total {time.perf_counter() - t_start:.0f}s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "rounds": args.rounds, "runs": args.runs,
                       "timeout": args.timeout, "models": rows, "geomean_ratio": geo}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
