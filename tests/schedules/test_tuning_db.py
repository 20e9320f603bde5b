"""Tuning database: records per target, round trip, corrupt lines, durability under kill -9."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import tvm
import tvm_ffi

from schedules import default_schedule
from schedules.database import (DatabaseError, TuningDatabase, apply_record, private_copy,
                                target_file_name, task_key, trace_to_json,
                                workload_hash)
from tests.schedules.util import TARGET, fused_primfunc

from tvm import relax

TDICT = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 2}
OTHER = dict(TDICT, **{"num-cores": 4})


def _matmul(n=64):
    return fused_primfunc(lambda bb, a, b: bb.emit(relax.op.matmul(a, b)), [(n, n), (n, n)],
                          "matmul")


def record(func, target=TDICT, winner="default", trace=None, kernel="matmul", default=10.0,
           tuned=12.0):
    """A record as tuning writes it (schedules/tuning.py _decide_and_save)."""
    return {"format": 1, "task": task_key(func, target), "workload_hash": workload_hash(func),
            "target": dict(target), "kernel": kernel, "kernels": [kernel], "weight": 1,
            "flops": 2 * 64 ** 3, "winner": winner, "default_rule": "cpu.matmul",
            "trace": trace, "latency_us": {"default": default, "tuned": tuned},
            "trials": 8, "valid_trials": 8,
            "provenance": {"onnxc": "test", "tvm": tvm.__version__, "time": "now", "host": "h"}}


def default_trace_json(func):
    sch, _ = default_schedule(func, TARGET)
    return trace_to_json(sch.trace)


def test_round_trip_per_target(tmp_path):
    func = _matmul()
    db = TuningDatabase(tmp_path / "db", create=True)
    rec = record(func, winner="tuned", trace=default_trace_json(func), tuned=8.0)
    db.append(rec)
    db.append(record(func, target=OTHER))
    # one file per target, named after it
    assert sorted(db.targets()) == sorted([target_file_name(TDICT), target_file_name(OTHER)])
    again = TuningDatabase(tmp_path / "db")
    got = again.lookup(func, TDICT)
    assert got == json.loads(json.dumps(rec))
    assert again.lookup(func, OTHER)["winner"] == "default"
    # the symbol name is not part of the key: kernels of two identical layers share a record
    assert again.lookup(func.with_attr("global_symbol", "fused_matmul7"), TDICT) == got
    assert again.lookup(_matmul(32), TDICT) is None
    assert again.warnings == []


def test_last_record_of_a_task_wins(tmp_path):
    func = _matmul()
    db = TuningDatabase(tmp_path, create=True)
    db.append(record(func, default=10.0))
    db.append(record(func, default=9.0))
    assert db.lookup(func, TDICT)["latency_us"]["default"] == 9.0
    assert len(db.records(TDICT)) == 1


def test_corrupt_lines_are_skipped_with_a_warning(tmp_path, caplog):
    func, other = _matmul(), _matmul(32)
    db = TuningDatabase(tmp_path, create=True)
    db.append(record(func))
    path = db.file_for(TDICT)
    good2 = json.dumps(record(other, kernel="m32"))
    with open(path, "a") as f:
        f.write("{not json\n")
        f.write(json.dumps({"format": 1, "task": "x"}) + "\n")      # fields missing
        f.write(json.dumps(dict(record(other), winner="maybe")) + "\n")
        f.write(good2[: len(good2) // 2])                            # torn: killed mid-write
    with caplog.at_level(logging.WARNING, logger="onnxc.schedules"):
        recs = TuningDatabase(tmp_path).records(TDICT)
    assert list(recs) == [task_key(func, TDICT)]
    warned = [r.getMessage() for r in caplog.records if "corrupt record" in r.getMessage()]
    assert len(warned) == 4 and all(path in w for w in warned)
    assert ":2:" in warned[0] and "not JSON" in warned[0]
    # the next append starts on its own line, after the torn one
    db.append(record(other, kernel="m32"))
    fresh = TuningDatabase(tmp_path)
    assert fresh.lookup(other, TDICT)["kernel"] == "m32"
    assert len(fresh.warnings) == 4


def test_invalid_record_is_refused_and_missing_dir_is_an_error(tmp_path):
    db = TuningDatabase(tmp_path, create=True)
    with pytest.raises(ValueError, match="winner"):
        db.append(dict(record(_matmul()), winner="best"))
    with pytest.raises(ValueError, match="without a trace"):
        db.append(record(_matmul(), winner="tuned", trace=None))
    with pytest.raises(DatabaseError, match="does not exist"):
        TuningDatabase(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(DatabaseError, match="not a directory"):
        TuningDatabase(tmp_path / "file")


def test_apply_record_replays_the_trace_and_leaves_the_input_alone(tmp_path):
    func = _matmul().with_attr("global_symbol", "fused_matmul")
    before = tvm_ffi.structural_hash(func)
    sch, _ = default_schedule(func, TARGET)
    rec = record(func, winner="tuned", trace=default_trace_json(func))
    out = apply_record(func, rec)
    assert tvm_ffi.structural_equal(out.without_attr("global_symbol"),
                                     sch.mod["main"].without_attr("global_symbol"))
    # replaying onto a with_attr copy rewrote the original in place before private_copy
    assert tvm_ffi.structural_hash(func) == before
    assert apply_record(func, record(func)) is None  # the default won: nothing to replay


def test_apply_record_keeps_the_element_aligned_marking():
    """A tuned kernel that reads a model input is built element-aligned on it like a default
    one (the graph records that alignment): the replay keeps the marking relax() reads."""
    from compiler.lowering.input_alignment import ATTR

    func = _matmul().with_attr("global_symbol", "fused_matmul").with_attr(ATTR, [0])
    out = apply_record(func, record(func, winner="tuned", trace=default_trace_json(func)))
    assert [int(p) for p in out.attrs[ATTR]] == [0]


def test_private_copy_shares_nothing():
    func = _matmul()
    before = tvm_ffi.structural_hash(func)
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": private_copy(func)}))
    block = sch.get_sblock("matmul")
    i, _, _ = sch.get_loops(block)
    sch.split(i, [None, 4])
    assert tvm_ffi.structural_hash(func) == before


_WRITER = r"""
import sys, time
sys.path.insert(0, {repo!r})
from schedules.database import TuningDatabase
db = TuningDatabase({path!r}, create=True)
rec = {rec!r}
for i in range(100000):
    rec["task"] = f"task-{{i}}"
    db.append(rec)
    print(f"saved {{i}}", flush=True)
"""


def test_kill_9_loses_no_record_reported_saved(tmp_path):
    rec = record(_matmul())
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = _WRITER.format(repo=repo, path=str(tmp_path), rec=rec)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    saved = []
    deadline = time.monotonic() + 60
    for line in p.stdout:
        saved.append(line.split()[1])
        if len(saved) >= 30 or time.monotonic() > deadline:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    # what it printed before dying is all that counts as reported saved
    rest = p.stdout.read().split()
    saved += rest[1::2]
    recs = TuningDatabase(tmp_path).records(TDICT)
    assert len(saved) >= 30
    missing = [i for i in saved if f"task-{i}" not in recs]
    assert missing == []


def test_job_lock_refuses_a_second_job_and_is_released(tmp_path):
    from schedules.database import DatabaseBusyError

    db = TuningDatabase(tmp_path)
    with db.job_lock("first.onnx"):
        # flock conflicts between two open file descriptions, even in one process
        with pytest.raises(DatabaseBusyError, match=rf"in use by another tuning job \(pid "
                                                    rf"{os.getpid()} on .*first.onnx\)"):
            with TuningDatabase(tmp_path).job_lock("second.onnx"):
                pass
        db.append(record(_matmul()))  # appends are not blocked by the job lock
    with TuningDatabase(tmp_path).job_lock("third.onnx"):
        pass
    assert db.targets() == [target_file_name(TDICT)]  # the lock file is not a target file


def test_job_lock_dies_with_its_holder(tmp_path):
    code = ("import sys, time; sys.path.insert(0, {repo!r})\n"
            "from schedules.database import TuningDatabase\n"
            "with TuningDatabase({path!r}).job_lock('held'):\n"
            "    print('locked', flush=True); time.sleep(600)\n")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen([sys.executable, "-c", code.format(repo=repo, path=str(tmp_path))],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "locked\n"
    from schedules.database import DatabaseBusyError

    with pytest.raises(DatabaseBusyError, match=f"pid {p.pid} on"):
        with TuningDatabase(tmp_path).job_lock():
            pass
    p.kill()
    p.wait()
    with TuningDatabase(tmp_path).job_lock():  # kill -9 released it
        pass


def test_partial_measurements_round_trip_and_are_dropped_when_done(tmp_path):
    from schedules.database import PARTIAL_SUFFIX

    db = TuningDatabase(tmp_path)
    func = _matmul()
    key = task_key(func, TDICT)
    trace = [[], []]  # stored as given; replaying it is the job's business
    db.append_partial(TDICT, [{"task": key, "round": 0, "trace": trace, "secs": 1e-5,
                               "error": None},
                              {"task": key, "round": 0, "trace": trace, "secs": None,
                               "error": "timeout"}])
    db.append_partial(TDICT, [{"task": "other", "round": 0, "trace": trace, "secs": 2e-5,
                               "error": None}])
    path = db.partial_file_for(TDICT)
    assert path.endswith(PARTIAL_SUFFIX) and db.targets() == []  # not a record file
    with open(path, "a") as f:
        f.write('{"task": "' + key + '", "rou')  # torn by a kill: dropped silently
    got = db.partials(TDICT, key)
    assert [m["secs"] for m in got] == [1e-5, None]
    db.append_partial(TDICT, [{"task": key, "round": 1, "trace": trace, "secs": 3e-5,
                               "error": None}])  # starts on its own line after the torn one
    assert [m["round"] for m in db.partials(TDICT, key)] == [0, 0, 1]
    db.append(record(func))
    assert not db.drop_finished_partials(TDICT)  # "other" has no record yet
    assert os.path.exists(path)
