"""Latency against tuning time, against onnxruntime: the #6 tuning benchmark, run by hand.

Two steps:

    # 1. tune each model for 10 minutes, then continue the same database for 20 more
    #    (`onnxc tune --time-budget`; the second job resumes: it tunes the tasks the first
    #    one did not reach). Job boundaries go to DIR/jobs.json.
    python scripts/tuning_curve.py tune --models resnet50 mobilenetv2 bert --dir /tmp/tune \\
        --budgets 600 1200

    # 2. for each checkpoint (minutes of tuning), compile with the records the jobs had
    #    saved by then; then rounds: each times every checkpoint once, onnxc against
    #    onnxruntime in alternating worker processes (compiler/bench.py: measure); the
    #    median over rounds of each checkpoint's ratio.
    python scripts/tuning_curve.py curve --models resnet50 mobilenetv2 bert --dir /tmp/tune \\
        --at 0 5 10 20 30 --rounds 7 --runs 30

A checkpoint at t minutes keeps every database line whose ``provenance.time`` falls within
the first t minutes of that model's tuning (job time, summed over its jobs); the last line
of a task wins, as in ``compile --tuning-db``.  A demotion by a job's in-model check (a
kernel that won in isolation but was slower inside the model) applies from its own time on
(``_record_time``), so a checkpoint before it still has the tuned kernel.  Tuning time counts everything the job does: task
extraction, measuring the defaults, the search and the final default-vs-tuned measurements.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model_path(d: str, name: str) -> str:
    path = os.path.join(d, f"{name}.onnx")
    if not os.path.exists(path):
        import onnx

        import zoo
        onnx.save(zoo.build(name), path)
    return path


def cmd_tune(args) -> int:
    jobs_file = os.path.join(args.dir, "jobs.json")
    jobs = json.load(open(jobs_file)) if os.path.exists(jobs_file) else []
    for name in args.models:
        path = _model_path(args.dir, name)
        db = os.path.join(args.dir, f"db_{name}")
        for budget in args.budgets:
            log = os.path.join(args.dir, f"tune_{name}_{len(jobs)}.log")
            start = time.time()
            with open(log, "w") as f:
                rc = subprocess.call([sys.executable, "-m", "compiler.cli", "tune", path,
                                      "--db", db, "--time-budget", str(budget)],
                                     stdout=f, stderr=subprocess.STDOUT)
            end = time.time()
            jobs.append({"model": name, "db": db, "budget_s": budget, "start": start,
                         "end": end, "rc": rc, "log": log,
                         "load": os.getloadavg()})
            json.dump(jobs, open(jobs_file, "w"), indent=1)
            print(f"{name}: {budget} s job took {end - start:.0f} s, rc {rc}, log {log}",
                  flush=True)
    return 0


def _record_time(rec: dict, jobs: list) -> float:
    """When the record was made: ``provenance.time``.  A demotion (the in-model check's
    record) written before demotions carried their own time has its tuned record's time:
    it was made by the in-model check at the end of a job, so it is placed at the end of
    the first job that ended after that time (not at the tuned record's time: a late
    demotion would then apply to earlier checkpoints)."""
    prov = rec["provenance"]
    t = dt.datetime.fromisoformat(prov["time"].replace("Z", "+00:00")).timestamp()
    legacy_demotion = str(rec.get("stop", "")).startswith("demoted") and "tuned_time" not in prov
    if legacy_demotion:
        ends = sorted(j["end"] for j in jobs if j["end"] >= t)
        if ends:
            return ends[0]
    return t


def _db_at(name: str, jobs: list, minutes: float, out_dir: str) -> tuple[str, int]:
    """A copy of the model's database with the lines saved within its first `minutes` of
    tuning; returns (directory, tuned records kept)."""
    mine = [j for j in jobs if j["model"] == name]
    offset, windows = 0.0, []
    for j in mine:                           # job time -> tuning-time offset
        windows.append((j["start"], j["end"], offset))
        offset += j["end"] - j["start"]
    cutoff = minutes * 60.0
    os.makedirs(out_dir, exist_ok=True)
    for f in glob.glob(os.path.join(out_dir, "*.jsonl")):
        os.remove(f)
    kept_tasks = {}
    for src in glob.glob(os.path.join(mine[0]["db"], "*.jsonl")):
        lines = []
        for line in open(src):
            try:
                rec = json.loads(line)
                t = _record_time(rec, mine)
            except (ValueError, KeyError, TypeError):
                continue
            at = next((off + t - s for s, e, off in windows if s - 1 <= t <= e + 1), None)
            if at is not None and at <= cutoff:
                lines.append(line if line.endswith("\n") else line + "\n")
                kept_tasks[rec["task"]] = rec.get("winner")
        with open(os.path.join(out_dir, os.path.basename(src)), "w") as f:
            f.writelines(lines)
    return out_dir, sum(1 for w in kept_tasks.values() if w == "tuned")


def cmd_curve(args) -> int:
    """Compile every checkpoint first, then measure them interleaved: each round measures
    every checkpoint once (onnxc and onnxruntime alternating, ``measure(rounds=1)``), so a
    burst of load on this shared machine hits all checkpoints alike; per checkpoint the
    median over rounds of the per-round ratio (and of the latencies)."""
    import statistics

    import compiler
    from compiler.tools.bench import measure

    jobs = json.load(open(os.path.join(args.dir, "jobs.json")))
    rows = []
    for name in args.models:
        path = _model_path(args.dir, name)
        points = []
        for minutes in args.at:
            db, tuned = _db_at(name, jobs, minutes, os.path.join(args.dir, f"at_{name}_{minutes:g}"))
            cm = compiler.compile(path, tuning_db=db if minutes > 0 else None)
            so = cm.export(os.path.join(args.dir, f"{name}_at{minutes:g}.so"))
            points.append({"model": name, "minutes": minutes, "so": so, "tuned_records": tuned,
                           "tuned_kernels": cm.report.get("tuned_kernels"), "rounds": []})
        for _ in range(args.rounds):
            for pt in points:
                r = measure(path, pt["so"], rounds=1, runs=args.runs, warmup=3)
                pt["rounds"].append((r["onnxc"]["median_ms"], r["onnxruntime"]["median_ms"],
                                     r["allclose"], max(r["max_abs_diff"])))
        for pt in points:
            rs = pt.pop("rounds")
            row = {k: v for k, v in pt.items() if k != "so"}
            row.update(onnxc_ms=statistics.median(x[0] for x in rs),
                       ort_ms=statistics.median(x[1] for x in rs),
                       ratio=statistics.median(x[0] / x[1] for x in rs),
                       ratios=[round(x[0] / x[1], 3) for x in rs],
                       match=all(x[2] for x in rs), max_abs_diff=max(x[3] for x in rs),
                       load=os.getloadavg()[0])
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    print("\n| model | tuning min | tuned kernels | onnxc ms | ORT ms | ratio (median of rounds) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['minutes']:g} | {r['tuned_kernels']} | {r['onnxc_ms']:.2f} "
              f"| {r['ort_ms']:.2f} | {r['ratio']:.2f}x |")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune")
    t.add_argument("--models", nargs="+", default=["resnet50", "mobilenetv2", "bert"])
    t.add_argument("--dir", default="tuning-curve")
    t.add_argument("--budgets", nargs="+", type=float, default=[600, 1200],
                   help="seconds per job; later jobs continue the same database")
    c = sub.add_parser("curve")
    c.add_argument("--models", nargs="+", default=["resnet50", "mobilenetv2", "bert"])
    c.add_argument("--dir", default="tuning-curve")
    c.add_argument("--at", nargs="+", type=float, default=[0, 5, 10, 20, 30])
    c.add_argument("--rounds", type=int, default=7)
    c.add_argument("--runs", type=int, default=30)
    c.add_argument("--json", default=None)
    args = p.parse_args()
    return cmd_tune(args) if args.cmd == "tune" else cmd_curve(args)


if __name__ == "__main__":
    sys.exit(main())
