#!/usr/bin/env python3
"""Compile time per model: wall and CPU seconds of compile() and export(), per stage.

On a shared host the wall seconds measure the load as much as the compiler, so each line
also gives CPU seconds: this process's per stage (the report's ``stages_cpu``), the build
workers' (``build_workers``), and the totals including child processes.

    python scripts/compile_time.py /work/real_models/densenet121.onnx [more.onnx ...]
    ONNXC_BUILD_WORKERS=1 python scripts/compile_time.py m.onnx    # one build process
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(path: str, target: str = "host") -> dict:
    """One compile + export of ``path``: the seconds, the report's stages, the host."""
    import compiler
    from compiler.tools.bench import host_cpu

    load = os.getloadavg()[0]
    c0, t0 = _cpu(), time.perf_counter()
    cm = compiler.compile(path, target=target)
    c1, t1 = _cpu(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnxc-ctime-") as tmp:
        cm.export(os.path.join(tmp, "m.so"))
    c2, t2 = _cpu(), time.perf_counter()
    r = cm.report
    return {"model": os.path.basename(path), "cpu": host_cpu(), "cores": os.cpu_count(),
            "load_avg": round(load, 1),
            "compile_wall": round(t1 - t0, 1), "compile_cpu": round(c1 - c0, 1),
            "export_wall": round(t2 - t1, 1), "export_cpu": round(c2 - c1, 1),
            "stages": r["stages"], "stages_cpu": r.get("stages_cpu"),
            "build_groups": r.get("build_groups"), "kernels": r["kernels"],
            "distinct_kernels": r["distinct_kernels"]}


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    for path in paths:
        print(json.dumps(measure(path)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
