#!/usr/bin/env python3
"""Fingerprint the scheduled TIR of zoo models, to prove a refactoring changes no kernel.

For each model this compiles through scheduling (``compiler.driver.schedule_kernels``:
the module compile() hands to ``tvm.compile``, without building it) for one fixed target
and prints:

* ``tir``: sha256 over the sorted (kernel symbol, scheduled TIR script) pairs;
* ``passes``: sha256 of the pass report (names, changed, rewrites, nodes), and the report.

Schedule rule names are not hashed (they are renamed, e.g. ``x86.*`` -> ``cpu.*``, without
changing any kernel); ``--json F`` saves everything, rule counts included, for a diff.

    python scripts/schedule_fingerprint.py --json /tmp/before.json
    python scripts/schedule_fingerprint.py mlp cnn --target '{"kind":"llvm","mcpu":"znver5"}'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import zoo  # noqa: E402

# Host-independent: an explicit CPU, so the same machine code path is chosen everywhere.
DEFAULT_TARGET = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5",
                  "num-cores": 2}

# The zoo models and the sizes they are fingerprinted at (densenet is left out: slow).
MODELS = {
    "mlp": {}, "cnn": {}, "transformer": {}, "dwsep": {}, "squeezenet": {},
    "mobilenetv2": {}, "resnet50": {}, "bert": {"layers": 2},
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(name: str, target) -> dict:
    """The fingerprint of one zoo model's scheduled kernels and pass report."""
    from compiler.driver import schedule_kernels

    t0 = time.perf_counter()
    mod, rules, reports = schedule_kernels(zoo.build(name, **MODELS.get(name, {})), target)
    kernels = sorted((gv.name_hint, f.script()) for gv, f in mod.functions.items())
    tir = hashlib.sha256()
    for symbol, script in kernels:
        tir.update(symbol.encode() + b"\0" + script.encode() + b"\0")
    reports = [{k: v for k, v in r.items() if k != "seconds"} for r in reports]  # timing varies
    passes = json.dumps(reports, sort_keys=True)
    counts: dict = {}
    for r in rules.values():
        counts[r] = counts.get(r, 0) + 1
    return {"kernels": len(kernels), "tir": tir.hexdigest(), "passes": _sha(passes),
            "pass_report": reports, "rules": dict(sorted(counts.items())),
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS),
                    help=f"zoo models (default: {' '.join(MODELS)})")
    ap.add_argument("--target", default=json.dumps(DEFAULT_TARGET),
                    help="a target preset or TVM target JSON (default: %(default)s)")
    ap.add_argument("--json", metavar="F", help="save the fingerprints to F")
    args = ap.parse_args(argv)
    target = json.loads(args.target) if args.target.lstrip().startswith("{") else args.target
    out = {"target": target, "models": {}}
    for name in args.models:
        fp = fingerprint(name, target)
        out["models"][name] = fp
        print(f"{name:12s} kernels={fp['kernels']:4d} tir={fp['tir']} passes={fp['passes']} "
              f"({fp['seconds']}s)", flush=True)
        for rep in fp["pass_report"]:
            if rep.get("changed"):
                print(f"    {rep['name']}: {json.dumps(rep.get('rewrites', {}), sort_keys=True)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
