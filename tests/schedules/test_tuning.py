"""Tuning jobs (schedules/tuning.py): tasks, budget split, progress bar, failing loudly.

The MetaSchedule search itself (TuneContext) costs 15-25 s to start on this machine (its
tensor intrinsics load once per process), so tests that search are in the slow tier;
the fast ones stop before it (resume, a runner that measures nothing) or test the parts.
"""

from __future__ import annotations

import io
import math

import pytest
from tvm import relax

import targets
from schedules.database import TuningDatabase
from schedules.tuning import (ProgressBar, TuneOptions, TuningError, _Job, _TaskRun, make_tasks,
                              tune_tasks)
from tests.schedules.util import fused_primfunc

TINFO = targets.resolve({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5",
                         "num-cores": 2})


def _matmul(n):
    return fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)), [(n, n), (n, n)],
                          "matmul")


def test_make_tasks_merges_equal_kernels_and_weights_by_calls():
    a, b, c = _matmul(32), _matmul(32), _matmul(16)
    tasks = make_tasks({"mm_a": a, "mm_b": b, "mm_c": c, "dead": _matmul(8)},
                       {"mm_a": 2, "mm_b": 3, "mm_c": 1}, TINFO)
    by = {t.kernel: t for t in tasks}
    assert sorted(by) == ["mm_a", "mm_c"]  # "dead" has no call: nothing to tune
    assert by["mm_a"].kernels == ["mm_a", "mm_b"] and by["mm_a"].weight == 5
    assert by["mm_a"].flops == 2 * 32 ** 3
    assert by["mm_a"].default_rule == "cpu.matmul"
    assert by["mm_a"].default_trace is not None  # replayable: it seeds the search


def test_progress_bar_redraws_one_line_on_a_terminal():
    out = io.StringIO()
    bar = ProgressBar(out, width=10, tty=True)
    bar.draw(0.5, "task 1/2 mm  trials 8/16  best 12.0 GFLOP/s  ETA 0m30s")
    bar.draw(0.6, "task 1/2 mm")
    bar.message("saved mm")
    bar.draw(1.0, "done")
    bar.close()
    text = out.getvalue()
    assert text.startswith("\r[#####.....]  50% task 1/2 mm  trials 8/16  best 12.0 GFLOP/s")
    # the shorter line is padded over the longer one; a message clears the bar first
    second = text.split("\r")[2]
    assert second.startswith("[######....]  60% task 1/2 mm") and second.endswith(" ")
    assert "saved mm\n" in text and text.endswith("[##########] 100% done\n")


def test_progress_bar_in_a_log_prints_lines_sparingly():
    out = io.StringIO()
    bar = ProgressBar(out, width=4, tty=False, log_every=3600)
    bar.draw(0.25, "first")
    bar.draw(0.5, "dropped: too soon")
    bar.draw(0.75, "forced", force=True)
    assert out.getvalue() == "[#...]  25% first\n[###.]  75% forced\n"


def _job(options, tasks=()):
    job = _Job(list(tasks), TINFO, None, options, {}, ProgressBar(io.StringIO(), tty=False), None)
    return job


def test_budget_is_split_by_expected_gain():
    tasks = make_tasks({"big": _matmul(32), "small": _matmul(16)}, {"big": 1, "small": 4}, TINFO)
    runs = {t.kernel: _TaskRun(t, default_s=s) for t, s in zip(tasks, (3e-3, 1e-4))}
    job = _job(TuneOptions(trials=100, trials_per_round=8, time_budget=60), tasks)
    job.total_trials = 100
    gains = {k: job._gain(r) for k, r in runs.items()}
    assert gains["big"] == pytest.approx(3e-3) and gains["small"] == pytest.approx(4e-4)
    total = sum(gains.values())
    trials, secs = job._shares(runs["big"], total)
    assert trials == int(100 * 3e-3 / total) and 50 < secs <= 60 * 3e-3 / total + 1e-6
    # at least one round, never more than what is left
    assert job._shares(runs["small"], total)[0] == 11
    job.trials_done = 95
    assert job._shares(runs["small"], total)[0] == 5
    job.trials_done = 100
    assert job._shares(runs["small"], total)[0] == 0


def test_gains_flatten():
    job = _job(TuneOptions(patience=2, min_gain=0.01))
    assert not job._flat([10.0, 9.0])
    assert not job._flat([10.0, 9.0, 8.0])           # still improving
    assert job._flat([10.0, 9.0, 8.99, 8.95])        # < 1% over the last two rounds
    assert not job._flat([None, None, 5.0])          # nothing valid before


class _Result:
    def __init__(self, error):
        self.run_secs, self.error_msg = None, error


class _Future:
    def __init__(self, error):
        self._error = error

    def result(self):
        return _Result(self._error)


class FailingRunner:
    """A runner that reports every measurement as failed, as a lost device does."""

    def __init__(self):
        self.calls = 0

    def run(self, inputs):
        self.calls += len(inputs)
        return [_Future("RPCRunner: device lost") for _ in inputs]


def test_nothing_measured_raises(tmp_path):
    tasks = make_tasks({"mm": _matmul(16)}, {"mm": 1}, TINFO)
    runner = FailingRunner()
    db = TuningDatabase(tmp_path, create=True)
    with pytest.raises(TuningError, match="nothing was measured.*device lost") as e:
        tune_tasks(tasks, TINFO, db, TuneOptions(trials=8), runner=runner,
                   progress=ProgressBar(io.StringIO(), tty=False))
    assert runner.calls == 1  # the default: no point searching with a runner like that
    assert e.value.summary["tuned"] == 0
    assert db.records(TINFO) == {}


def test_nothing_to_do_when_every_task_is_done(tmp_path):
    tasks = make_tasks({"mm": _matmul(16)}, {"mm": 1}, TINFO)
    db = TuningDatabase(tmp_path, create=True)
    from tests.schedules.test_tuning_db import record

    db.append(record(tasks[0].func, target=TINFO.tvm))
    out = io.StringIO()
    s = tune_tasks(tasks, TINFO, db, TuneOptions(trials=8), runner=FailingRunner(),
                   progress=ProgressBar(out, tty=False))
    assert s["already_done"] == 1 and s["trials"] == 0 and s["tuned"] == 0
    assert "resuming: 1 of 1 tasks already in" in out.getvalue()


class FailAfter:
    """A real LocalRunner for the first ``n`` measurements (the defaults), then failures."""

    def __init__(self, n):
        from tvm.s_tir.meta_schedule.runner import LocalRunner

        self.inner, self.left = LocalRunner(), n

    def run(self, inputs):
        if self.left > 0:
            self.left -= len(inputs)
            return self.inner.run(inputs)
        return [_Future("segfault in the kernel") for _ in inputs]


@pytest.mark.slow
def test_search_that_measures_nothing_raises_and_saves_nothing(tmp_path):
    tasks = make_tasks({"mm": _matmul(16)}, {"mm": 1}, TINFO)
    db = TuningDatabase(tmp_path, create=True)
    with pytest.raises(TuningError, match="nothing was measured for 1 task.*segfault") as e:
        tune_tasks(tasks, TINFO, db, TuneOptions(trials=4, trials_per_round=4),
                   runner=FailAfter(1), progress=ProgressBar(io.StringIO(), tty=False))
    (task,) = e.value.summary["per_task"]
    assert task["trials"] == 4 and task["valid"] == 0
    assert db.records(TINFO) == {}


@pytest.mark.slow
def test_search_seeded_with_default_never_stores_a_slower_schedule(tmp_path):
    tasks = make_tasks({"mm": _matmul(64)}, {"mm": 1}, TINFO)
    db = TuningDatabase(tmp_path, create=True)
    s = tune_tasks(tasks, TINFO, db, TuneOptions(trials=16, trials_per_round=8),
                   progress=ProgressBar(io.StringIO(), tty=False))
    assert s["tuned"] + s["default_kept"] == 1 and s["valid_trials"] >= 1
    (rec,) = db.records(TINFO).values()
    lat = rec["latency_us"]
    if rec["winner"] == "tuned":
        assert lat["tuned"] < lat["default"] and rec["trace"]
    else:
        assert rec["trace"] is None
    assert math.isfinite(lat["default"]) and rec["provenance"]["tvm"]


def test_gain_weighs_distance_from_the_best_rate():
    """A kernel far below the FLOP rate the job's best default reached gets the budget
    before an equally long one that is already near it."""
    tasks = make_tasks({"slow": _matmul(32), "fast": _matmul(16)}, {"slow": 1, "fast": 1},
                       TINFO)
    slow, fast = (_TaskRun(t, default_s=1e-3) for t in tasks)
    job = _job(TuneOptions(trials=100), tasks)
    assert job._gain(slow) == job._gain(fast)          # defaults not measured yet
    slow.task.flops, fast.task.flops = 10**6, 10**8    # 1 vs 100 GFLOP/s
    job.best_rate = 1e11
    assert job._gain(fast) == pytest.approx(1e-3 * 0.1)    # at the best rate: floor
    assert job._gain(slow) == pytest.approx(1e-3 * 0.99)
