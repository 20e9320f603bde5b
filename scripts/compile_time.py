#!/usr/bin/env python3
"""Compile time per model: wall and CPU seconds of compile() and export(), per stage.

On a shared host the wall seconds measure the load as much as the compiler, so each line
also gives CPU seconds: this process's per stage (the report's ``stages_cpu``), the build
workers' (``build_workers``), and the totals including child processes.

    python scripts/compile_time.py /work/real_models/densenet121.onnx [more.onnx ...]
    ONNXC_BUILD_WORKERS=1 python scripts/compile_time.py m.onnx    # one build process
    python scripts/compile_time.py --kernels 15 m.onnx   # + per-kernel build CPU, top 15

``--kernels N`` also builds every scheduled kernel alone (``tvm.compile`` + object
emission, CPU seconds, one process) and the checked variants' -O0 module, and prints the
sums per schedule rule and the N costliest kernels: which kernels the build time goes to.
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


def per_kernel(path: str, top: int, target: str = "host") -> dict:
    """CPU seconds to build and emit each scheduled kernel of ``path`` alone, summed per
    rule, the ``top`` costliest, and the checked variants' module."""
    import tvm

    from compiler.driver import _checked_module, _checked_target, _front_only, _schedule

    tinfo, _, graph = _front_only(path, target)
    mod, rules = _schedule(graph.prim_funcs, tinfo)
    ops = {}
    for c in graph.calls:
        ops.setdefault(c["kernel"], c["ops"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnxc-ktime-") as tmp:
        obj = os.path.join(tmp, "k.o")
        for gv, f in mod.functions_items():
            c0 = time.process_time()
            tvm.compile(tvm.IRModule({gv: f}), target=tinfo.tvm_target()).mod.write_to_file(obj)
            rows.append((round(time.process_time() - c0, 3), gv.name_hint,
                         rules.get(gv.name_hint), ops.get(gv.name_hint)))
        c0 = time.process_time()
        if graph.checked:
            tvm.compile(_checked_module(graph.checked),
                        target=_checked_target(tinfo)).mod.write_to_file(obj)
        checked = round(time.process_time() - c0, 2)
    by_rule: dict = {}
    for sec, _, rule, _ in rows:
        by_rule[rule] = round(by_rule.get(rule, 0.0) + sec, 2)
    rows.sort(reverse=True)
    return {"model": os.path.basename(path), "kernels_cpu": round(sum(r[0] for r in rows), 2),
            "by_rule": by_rule, "checked_cpu": checked, "checked_kernels": len(graph.checked),
            "top": rows[:top]}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    top = 0
    if args[:1] == ["--kernels"] and len(args) > 1:
        top, args = int(args[1]), args[2:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    for path in args:
        print(json.dumps(measure(path)), flush=True)
        if top:
            print(json.dumps(per_kernel(path, top)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
