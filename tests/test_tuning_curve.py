"""scripts/tuning_curve.py: which database records each checkpoint keeps.  A demotion
applies from its own time, not from the time of the tuned record it overrules."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import tuning_curve  # noqa: E402

T0 = 1_800_000_000.0  # the first job's start (epoch seconds)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def _rec(task: str, winner: str, at: float, **extra) -> dict:
    return {"task": task, "winner": winner, "provenance": {"time": _iso(at)}, **extra}


def _setup(tmp_path, records):
    """Two jobs of 600 s each (the second starts 100 s after the first ended), and a
    database holding ``records``."""
    db = tmp_path / "db_m"
    db.mkdir()
    (db / "host.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    jobs = [{"model": "m", "db": str(db), "start": T0, "end": T0 + 600},
            {"model": "m", "db": str(db), "start": T0 + 700, "end": T0 + 1300}]
    return jobs


def _winners(tmp_path, jobs, minutes) -> dict:
    out, _ = tuning_curve._db_at("m", jobs, minutes, str(tmp_path / f"at{minutes}"))
    winners = {}
    for line in (Path(out) / "host.jsonl").read_text().splitlines():
        rec = json.loads(line)
        winners[rec["task"]] = rec["winner"]  # the last record of a task wins
    return winners


def test_late_demotion_applies_from_its_own_time(tmp_path):
    # tuned 2 minutes into job 1; demoted by job 2's in-model check, 19 minutes of tuning in
    jobs = _setup(tmp_path, [
        _rec("a", "tuned", T0 + 120),
        _rec("a", "default", T0 + 700 + 540, stop="demoted: slower inside the model",
             provenance={"time": _iso(T0 + 700 + 540), "tuned_time": _iso(T0 + 120)})])
    assert _winners(tmp_path, jobs, 5) == {"a": "tuned"}     # before: the tuned kernel
    assert _winners(tmp_path, jobs, 10) == {"a": "tuned"}
    assert _winners(tmp_path, jobs, 20) == {"a": "default"}  # from 19 min on: demoted


def test_legacy_demotion_is_placed_at_the_end_of_its_job(tmp_path):
    # written before demotions had their own time: it carries the tuned record's time, and
    # the in-model check that made it ran at the end of a job (job 1 ends at 10 minutes)
    jobs = _setup(tmp_path, [
        _rec("a", "tuned", T0 + 120),
        _rec("a", "default", T0 + 120, stop="demoted: slower inside the model")])
    assert _winners(tmp_path, jobs, 5) == {"a": "tuned"}     # it used to be "default" here
    assert _winners(tmp_path, jobs, 10) == {"a": "default"}


def test_records_after_the_checkpoint_are_left_out(tmp_path):
    jobs = _setup(tmp_path, [_rec("a", "tuned", T0 + 120), _rec("b", "default", T0 + 900)])
    assert _winners(tmp_path, jobs, 5) == {"a": "tuned"}
    assert _winners(tmp_path, jobs, 20) == {"a": "tuned", "b": "default"}
