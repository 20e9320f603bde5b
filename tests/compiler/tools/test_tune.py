"""onnxc tune / compile --tuning-db: tasks from our pipeline, records applied, resume, RPC.

Fast tier: task extraction, applying records (hand-made from our default schedule's own
trace, so no search is needed), resume, CLI errors, and one real ``onnxc tune`` killed
twice (during start-up, right after its first saved record) with a second job refused by
the job lock.  Slow tier: real searches (local and through a loopback RPC tracker), kill -9
of a running ``onnxc tune`` at 20 random points, each followed by checks and a resume.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import random
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest

import compiler
import targets
from compiler.cli import main as onnxc_main
from compiler.driver import lower_to_kernels
from compiler.tools.tune import extract_tasks, tune
from schedules.database import LOCK_FILE, TuningDatabase, apply_record, trace_to_json
from schedules.tuning import ProgressBar, TuningError
from tests.conftest import REPO, assert_close, ort_run, zoo, zoo_model

HOST = targets.resolve("host")


def quiet():
    return ProgressBar(io.StringIO(), tty=False)


def matmul_model(n=64, seed=0):
    """One MatMul of an input by a constant n x n weight."""
    from tests.schedules.util import onnx_model
    from onnx import helper

    w = np.random.default_rng(seed).standard_normal((n, n)).astype("float32")
    return onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                      [("x", [n, n])], [("y", [n, n])], {"w": w})


def _record(task, winner, trace=None, default=10.0, tuned=None):
    import tvm

    return {"format": 1, "task": task.key, "workload_hash": task.key.split("-")[0],
            "target": dict(HOST.tvm), "kernel": task.kernel, "kernels": task.kernels,
            "weight": task.weight, "flops": task.flops, "winner": winner,
            "default_rule": task.default_rule, "trace": trace,
            "latency_us": {"default": default, "tuned": tuned}, "trials": 1, "valid_trials": 1,
            "provenance": {"onnxc": compiler.__version__, "tvm": tvm.__version__,
                           "time": "test", "host": socket.gethostname()}}


def test_tasks_come_from_our_pipeline_weighted_by_calls():
    model = zoo_model("transformer", layers=2)
    graph, prim_funcs = lower_to_kernels(model, HOST)
    calls = Counter(c["kernel"] for c in graph.calls)
    tasks = extract_tasks(model, HOST)
    assert sum(t.weight for t in tasks) == len(graph.calls)
    assert {k for t in tasks for k in t.kernels} == set(calls)
    assert len({t.key for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.weight == sum(calls[k] for k in t.kernels)
    # two identical layers: every layer kernel is called twice or more
    assert min(t.weight for t in tasks) >= 2
    # the same kernels compile() builds
    assert len(prim_funcs) == compiler.compile(model, HOST).report["distinct_kernels"]


def test_compile_applies_tuned_and_default_records(tmp_path):
    model = zoo_model("mlp")
    tasks = {t.kernel: t for t in extract_tasks(model, HOST)}
    db = TuningDatabase(tmp_path / "db", create=True)
    mm = tasks["fused_matmul_add_relu"]
    # a tuned record whose trace is our default schedule's own (any valid trace will do)
    db.append(_record(mm, "tuned", trace_to_json(mm.default_trace), default=10, tuned=9))
    db.append(_record(tasks["softmax"], "default"))
    cm = compiler.compile(model, HOST, tuning_db=str(tmp_path / "db"))
    r = cm.report
    assert r["tuned_kernels"] == 2 and r["untuned_kernels"] == len(tasks) - 2
    assert r["tuning"]["tuned_schedule"] == 1 and r["tuning"]["default_kept"] == 1
    assert r["tuning"]["no_record"] == len(tasks) - 2 and r["tuning"]["replay_failed"] == 0
    assert r["schedules"]["tuned"] == 1
    feeds = zoo.random_inputs(model, seed=1)
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds))


def test_record_that_does_not_replay_falls_back_to_the_default(tmp_path, caplog,
                                                              monkeypatch):
    from schedules.cpu import row_reduction

    model = zoo_model("mlp")
    # the softmax's schedule as a replayable trace (its default one aliases the exps into
    # the output after scheduling, which no trace records)
    monkeypatch.setattr(row_reduction, "_exp_in_output", lambda sch: sch)
    tasks = {t.kernel: t for t in extract_tasks(model, HOST)}
    monkeypatch.undo()
    db = TuningDatabase(tmp_path, create=True)
    wrong = trace_to_json(tasks["softmax"].default_trace)  # another kernel's trace
    db.append(_record(tasks["fused_matmul_add_relu"], "tuned", trace=wrong))
    cm = compiler.compile(model, HOST, tuning_db=db)
    assert cm.report["tuning"]["replay_failed"] == 1 and cm.report["tuned_kernels"] == 0
    assert any("does not apply" in r.getMessage() for r in caplog.records)
    feeds = zoo.random_inputs(model, seed=2)
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds))


def test_records_of_another_target_do_not_apply(tmp_path):
    model = zoo_model("mlp")
    task = extract_tasks(model, HOST)[0]
    db = TuningDatabase(tmp_path, create=True)
    other = dict(HOST.tvm, **{"num-cores": HOST.cores + 1})
    db.append(dict(_record(task, "default"), target=other))
    r = compiler.compile(model, HOST, tuning_db=db).report
    assert r["tuned_kernels"] == 0 and r["tuning"]["records_for_target"] == 0


def test_resume_skips_done_tasks(tmp_path):
    model = zoo_model("mlp")
    tasks = extract_tasks(model, HOST)
    db = TuningDatabase(tmp_path, create=True)
    for t in tasks[1:]:
        db.append(_record(t, "default"))
    from tests.schedules.test_tuning import FailingRunner

    runner = FailingRunner()
    # one task left: only its default gets measured (and fails, loudly)
    with pytest.raises(TuningError, match=r"every pending task \(1\)"):
        tune(model, HOST, tmp_path, trials=8, runner=runner, progress=quiet())
    assert runner.calls == 1
    db.append(_record(tasks[0], "default"))
    s = tune(model, HOST, tmp_path, trials=8, runner=runner, progress=quiet())
    assert s["already_done"] == len(tasks) and s["trials"] == 0 and runner.calls == 1


def test_cli_errors(tmp_path, capsys):
    mlp = tmp_path / "mlp.onnx"
    import onnx

    onnx.save(zoo_model("mlp"), mlp)
    assert onnxc_main(["tune", str(mlp), "--db", str(tmp_path / "d"),
                       "--rpc-tracker", "127.0.0.1:9"]) == 1
    assert "--rpc-tracker needs --rpc-key" in capsys.readouterr().err
    assert onnxc_main(["tune", str(mlp), "--db", str(tmp_path / "d"), "--rpc-tracker", "nohost",
                       "--rpc-key", "k", "--trials", "1"]) == 1
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert onnxc_main(["tune", str(mlp), "--db", str(tmp_path / "d"),
                       "--time-budget", "0"]) == 1
    assert "--time-budget must be > 0" in capsys.readouterr().err
    assert onnxc_main(["compile", str(mlp), "-o", str(tmp_path / "m.so"),
                       "--tuning-db", str(tmp_path / "missing")]) == 1
    assert "tuning database" in capsys.readouterr().err


def test_in_model_check_demotes_a_kernel_that_won_in_isolation(tmp_path):
    """The "never slower" checks below hold by construction (a record is "tuned" only when
    it won in isolation); here the in-model check must overrule such a win.  The record
    claims tuned 5 us < default 10 us, but its trace is the unscheduled kernel (no
    parallel loops, no vectors), far slower inside the model than our default."""
    import datetime

    import tvm
    from tvm import s_tir

    from compiler.tools.tune import check_in_model

    model = matmul_model(192)
    tasks = extract_tasks(model, HOST)
    (mm,) = [t for t in tasks if "matmul" in t.kernel]
    naive = trace_to_json(s_tir.Schedule(tvm.IRModule({"main": mm.func})).trace)
    db = TuningDatabase(tmp_path, create=True)
    won = _record(mm, "tuned", naive, default=10.0, tuned=5.0)
    won["provenance"]["time"] = "2026-01-01T00:00:00+00:00"
    db.append(won)
    before = compiler.compile(model, HOST, tuning_db=db).report
    assert before["tuning"]["tuned_schedule"] == 1  # the record applies: it did win
    out = check_in_model(model, HOST, db, tasks)
    assert out["demoted"] == [mm.kernel]
    rec = db.records(HOST)[mm.key]
    assert rec["winner"] == "default" and rec["stop"] == "demoted: slower inside the model"
    assert rec["latency_us"]["in_model_tuned"] > rec["latency_us"]["in_model_default"] * 1.03
    # the demotion carries its own time; the tuned record's is kept beside it
    assert rec["provenance"]["tuned_time"] == "2026-01-01T00:00:00+00:00"
    made = datetime.datetime.fromisoformat(rec["provenance"]["time"])
    assert abs((datetime.datetime.now(datetime.timezone.utc) - made).total_seconds()) < 600
    after = compiler.compile(model, HOST, tuning_db=db).report
    assert after["tuning"]["tuned_schedule"] == 0 and after["tuning"]["default_kept"] == 1


# -- slow: real searches -------------------------------------------------------------------


def _check_never_slower(db, target=HOST):
    recs = list(db.records(target).values())
    for rec in recs:
        lat = rec["latency_us"]
        chosen = lat["tuned"] if rec["winner"] == "tuned" else lat["default"]
        assert chosen <= lat["default"], rec
    return recs


@pytest.mark.slow
def test_tiny_model_tuned_then_compiled(tmp_path):
    model = matmul_model(64)
    s = tune(model, HOST, tmp_path, trials=16, progress=quiet())
    assert s["tuned"] + s["default_kept"] == 1 and s["valid_trials"] >= 1
    recs = _check_never_slower(TuningDatabase(tmp_path))
    assert len(recs) == 1 and recs[0]["trials"] >= 1
    cm = compiler.compile(model, HOST, tuning_db=str(tmp_path))
    assert cm.report["tuned_kernels"] >= 1 and cm.report["untuned_kernels"] == 0
    feeds = zoo.random_inputs(model, seed=3)
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds), rtol=1e-4, atol=1e-4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def rpc_tracker():
    """A TVM RPC tracker and two servers (key "test") on loopback; killed afterwards."""
    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
    from tvm.s_tir.meta_schedule.runner import RPCConfig

    # Each launcher runs the real tracker/server in a popen_worker child that outlives a
    # killed launcher: every one gets its own process group, killed whole afterwards.
    def start(*args):
        return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    port = _free_port()
    procs = [start("tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                   "--port-end", str(port + 1))]
    try:
        for _ in range(2):
            sp = _free_port()
            procs.append(start("tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}",
                               "--key", "test", "--host", "127.0.0.1", "--port", str(sp),
                               "--port-end", str(sp + 1)))
        config = RPCConfig(tracker_host="127.0.0.1", tracker_port=port, tracker_key="test",
                           session_timeout_sec=30)
        deadline = time.monotonic() + 90
        while True:
            try:
                if config.count_num_servers() >= 2:
                    break
            except ValueError:  # the tracker is not listening yet
                pass
            if time.monotonic() > deadline:
                pytest.fail("the RPC servers did not register with the tracker in 90 s")
            time.sleep(1)
        yield f"127.0.0.1:{port}"
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the launcher and its worker
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(timeout=30)


@pytest.mark.slow
def test_tune_through_rpc_tracker(tmp_path, rpc_tracker):
    model = matmul_model(32)
    s = tune(model, HOST, tmp_path, trials=8, rpc_tracker=rpc_tracker, rpc_key="test",
             progress=quiet())
    assert s["measured_with"] == f"rpc {rpc_tracker} key test"
    assert s["valid_trials"] >= 1
    (rec,) = _check_never_slower(TuningDatabase(tmp_path))
    assert rec["measured_with"].startswith("rpc ")
    cm = compiler.compile(model, HOST, tuning_db=str(tmp_path))
    feeds = zoo.random_inputs(model, seed=4)
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_rpc_key_without_servers_fails_loudly(tmp_path, rpc_tracker):
    with pytest.raises(TuningError, match="no RPC server registered under key 'nobody'"):
        tune(matmul_model(16), HOST, tmp_path, trials=4, rpc_tracker=rpc_tracker,
             rpc_key="nobody", progress=quiet())


@pytest.mark.slow
def test_cli_tune_killed_then_resumed(tmp_path):
    import onnx

    mlp = tmp_path / "mlp.onnx"
    onnx.save(zoo_model("mlp"), mlp)
    db = tmp_path / "db"
    cmd = [sys.executable, "-m", "compiler.cli", "tune", str(mlp), "--db", str(db),
           "--trials", "48"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=REPO)
    saved = []
    deadline = time.monotonic() + 400
    for line in p.stdout:
        if line.startswith("saved "):
            saved.append(line.split()[1])
            break
        if time.monotonic() > deadline:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert saved, "no task was saved before the deadline"
    recs = TuningDatabase(db).records(HOST)
    assert set(saved) <= {r["kernel"] for r in recs.values()}
    r = subprocess.run(cmd[:-1] + ["4"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert f"resuming: {len(recs)} of 4 tasks already in" in r.stderr
    assert f"4 tasks: {len(recs)} already in the database" in r.stdout
    report = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(mlp), "-o",
                        str(tmp_path / "m.so"), "--tuning-db", str(db), "--report", str(report)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rep = json.loads(report.read_text())
    assert rep["tuned_kernels"] == len(TuningDatabase(db).records(HOST)) >= len(recs)
    assert "tuning db" in r.stdout
    _check_never_slower(TuningDatabase(db))


# -- kill -9 at random points: durability and resume of a real `onnxc tune` -------------------


class _TuneRun:
    """``onnxc tune`` in a process group of its own (MetaSchedule's builder and runner
    workers included), its output lines collected by a thread as they come."""

    def __init__(self, mlp, db, trials=16):
        cmd = [sys.executable, "-m", "compiler.cli", "tune", str(mlp), "--db", str(db),
               "--trials", str(trials)]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, cwd=REPO, start_new_session=True)
        self.lines: list = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def saved(self) -> list:
        return [ln.split()[1] for ln in list(self.lines) if ln.startswith("saved ")]

    def wait_for(self, cond, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.p.poll() is None:
            if cond():
                return True
            time.sleep(0.05)
        return cond()

    def kill9(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()
        self._reader.join(timeout=10)


def _check_after_kill(run: _TuneRun, db, before: dict, tasks: dict) -> int:
    """Every kernel the run printed as saved has a record that loads (a tuned trace
    replays on its kernel); the run redid no task that was done before it; a resume
    counted the done tasks.  Returns how many saved records were checked."""
    database = TuningDatabase(db) if os.path.isdir(db) else None
    recs = database.records(HOST) if database else {}
    by_kernel = {r["kernel"]: r for r in recs.values()}
    saved = run.saved()
    assert set(saved) <= set(by_kernel), (saved, sorted(by_kernel), run.text()[-2000:])
    for kernel in saved:
        rec = by_kernel[kernel]
        if rec["winner"] == "tuned":
            assert apply_record(tasks[rec["task"]].func, rec) is not None
    assert all("not JSON" in w for w in (database.warnings if database else [])), \
        database.warnings  # at most a torn line (none expected: one write per record)
    redone = set(saved) & {r["kernel"] for r in before.values()}
    assert not redone, f"finished tasks tuned again: {redone}"
    if before and "resuming:" in run.text():
        assert f"resuming: {len(before)} of {len(tasks)} tasks already in" in run.text()
    return len(saved)


def _mlp(tmp_path):
    import onnx

    mlp = tmp_path / "mlp.onnx"
    onnx.save(zoo_model("mlp"), mlp)
    return mlp, {t.key: t for t in extract_tasks(zoo_model("mlp"), HOST)}


def test_tune_killed_at_start_and_after_a_save_resumes_and_locks(tmp_path):
    mlp, tasks = _mlp(tmp_path)
    db = tmp_path / "db"
    rng = random.Random(1)
    run = _TuneRun(mlp, db)  # killed during start-up
    time.sleep(rng.uniform(0.3, 3.0))
    run.kill9()
    _check_after_kill(run, db, {}, tasks)

    run = _TuneRun(mlp, db)
    lock = db / LOCK_FILE
    assert run.wait_for(lambda: lock.exists() and f'"pid": {run.p.pid}' in lock.read_text(),
                        60), run.text()
    second = subprocess.run([sys.executable, "-m", "compiler.cli", "tune", str(mlp), "--db",
                             str(db), "--trials", "16"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert second.returncode == 1
    assert f"is in use by another tuning job (pid {run.p.pid} on" in second.stderr
    assert run.wait_for(lambda: run.saved(), 300), run.text()[-3000:]
    time.sleep(rng.uniform(0, 0.3))  # killed right after its first "saved" line
    run.kill9()
    n = _check_after_kill(run, db, {}, tasks)
    before = TuningDatabase(db).records(HOST)
    assert n >= 1 and len(before) >= 1

    run = _TuneRun(mlp, db)  # the resume: counts the finished tasks, does not redo them
    assert run.wait_for(lambda: "resuming:" in run.text(), 120), run.text()
    time.sleep(rng.uniform(0, 2.0))
    run.kill9()
    _check_after_kill(run, db, before, tasks)


@pytest.mark.slow
def test_tune_kill_9_at_20_random_points(tmp_path, capsys):
    """20 kills at uniformly random times within the duration of a whole run (measured by
    a first run that is not killed: on a loaded machine a fixed window never reached a
    save); a run that finishes first is not killed.  When a database holds every task,
    the next runs start a fresh one, so kills keep landing in real tuning."""
    mlp, tasks = _mlp(tmp_path)
    rng = random.Random(20)
    rounds, kills, checked, resumed, finished_runs = 0, 0, 0, 0, 0
    db = tmp_path / f"db{rounds}"
    t0 = time.monotonic()
    run = _TuneRun(mlp, db)  # calibration: one whole run (tunes one task)
    assert run.p.wait(timeout=900) == 0, run.text()[-3000:]
    run.kill9()
    whole = time.monotonic() - t0
    checked += _check_after_kill(run, db, {}, tasks)
    while kills < 20:
        before = TuningDatabase(db).records(HOST) if db.is_dir() else {}
        run = _TuneRun(mlp, db)
        run.wait_for(lambda: False, rng.uniform(0.3, 1.1 * whole))
        finished = run.p.poll() is not None
        run.kill9()
        kills += not finished
        finished_runs += finished
        checked += _check_after_kill(run, db, before, tasks)
        resumed += bool(before) and "resuming:" in run.text()
        if finished:
            assert run.p.returncode == 0, run.text()[-3000:]
        if len(TuningDatabase(db).records(HOST)) == len(tasks):
            rounds += 1
            db = tmp_path / f"db{rounds}"
    before = TuningDatabase(db).records(HOST) if db.is_dir() else {}
    run = _TuneRun(mlp, db)  # a last run, not killed, resumes and finishes
    assert run.p.wait(timeout=900) == 0, run.text()[-3000:]
    run.kill9()
    checked += _check_after_kill(run, db, before, tasks)
    with capsys.disabled():
        print(f"\n{kills} kills (whole run {whole:.0f} s; {finished_runs} runs finished before "
              f"their kill time), {checked} saved records checked, {resumed} resumes checked, "
              f"{rounds} databases completed")
    assert checked >= 3 and resumed >= 3


@pytest.mark.slow
def test_interrupted_task_resumes_from_its_saved_measurements(tmp_path):
    """A job killed after a round of its only task was measured (but before the task's
    record was saved) is resumed from those measurements, not from scratch."""
    import onnx

    from schedules.database import PARTIAL_SUFFIX

    model = tmp_path / "mm.onnx"
    onnx.save(matmul_model(64), model)
    db = tmp_path / "db"
    run = _TuneRun(model, db, trials=64)
    partial = lambda: [p for p in db.glob(f"*{PARTIAL_SUFFIX}")] if db.is_dir() else []  # noqa
    assert run.wait_for(lambda: partial() and partial()[0].read_text().count("\n") >= 16, 300), \
        run.text()[-3000:]
    run.kill9()
    assert not run.saved() and not TuningDatabase(db).records(HOST)
    saved = len([ln for ln in partial()[0].read_text().splitlines() if ln.strip()])
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "tune", str(model), "--db", str(db),
                        "--trials", str(saved)], capture_output=True, text=True, cwd=REPO,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from {saved} saved measurements ({saved} valid" in r.stderr
    assert f", {saved} saved by an interrupted job)" in r.stdout
    # the job's record is the first line (the in-model check may append a demotion)
    rec = json.loads(next(db.glob("*.jsonl")).read_text().splitlines()[0])
    # its share (all the trials it needs) was spent before the kill: no new candidate
    assert rec["resumed_trials"] == rec["trials"] == saved and "trial share spent" in rec["stop"]
    assert not partial()  # dropped once the task has its record
