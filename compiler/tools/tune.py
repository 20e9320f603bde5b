"""``onnxc tune``: a model's kernels as tuning tasks, tuned into a tuning database.

Tasks come from our own pipeline (``driver.lower_to_kernels``: the same stages as
``compile()``, stopped before scheduling), so the tuned kernels are exactly the ones
``compile(..., tuning_db=DIR)`` builds, provided the graph-pass options are the same.
Structurally equal kernels are one task, weighted by how many calls the model makes to
them.  The tuning itself (``schedules/tuning.py``) knows nothing of ONNX.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter

import onnx

import targets
from schedules.database import TuningDatabase
from schedules.tuning import ProgressBar, TuneOptions, make_tasks, parse_tracker, tune_tasks

from .. import __version__
from ..driver import lower_to_kernels
from ..frontend.loader import text

__all__ = ["extract_tasks", "tune"]


def extract_tasks(model, target="host", **compile_kwargs) -> list:
    """The model's distinct kernels as :class:`schedules.tuning.Task` s for ``target``.

    ``compile_kwargs`` (opt_level, disabled_passes, ...) must match the later compile's:
    they decide which kernels exist.
    """
    tinfo = targets.resolve(target)
    graph, prim_funcs = lower_to_kernels(model, tinfo, **compile_kwargs)
    counts = Counter(call["kernel"] for call in graph.calls)
    return make_tasks(prim_funcs, counts, tinfo, flops=graph.flops)


def tune(model, target="host", db="tuning-db", *, trials: int | None = None,
         time_budget: float | None = None, rpc_tracker: str | None = None,
         rpc_key: str | None = None, options: TuneOptions | None = None, progress=None,
         runner=None, check_model: bool = True, **compile_kwargs) -> dict:
    """Tune ``model``'s kernels for ``target`` and append the winners to the database ``db``.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
    target : str or dict
        As for ``compile()``; records are kept per target.
    db : str or os.PathLike
        The database directory (created if missing).  Tasks it already has a record for
        are skipped, so running the same command again resumes an interrupted job.
    trials : int, optional
        Measured candidates over all tasks (default: 32 per task, or no limit with a
        ``time_budget``).
    time_budget : float, optional
        Seconds for the whole job, shared among tasks by expected gain.
    rpc_tracker, rpc_key : str, optional
        Measure on the RPC servers registered at the tracker ``HOST:PORT`` under ``KEY``.
    options : schedules.tuning.TuneOptions, optional
        Every other knob; ``trials`` etc. above override its fields when given.
    progress : schedules.tuning.ProgressBar, optional
        Where the progress bar goes (default: stderr).
    runner : MetaSchedule Runner, optional
        Replaces the local / RPC runner (tests).
    check_model : bool
        After tuning, run the model here untuned and tuned (:func:`check_in_model`) and
        demote tuned kernels that are slower inside the model (local measurement only).

    Returns
    -------
    dict
        The job summary (tasks, already done, tuned, default kept, trials, per task ...).

    Raises
    ------
    schedules.tuning.TuningError
        When a task (or everything) measured nothing.
    """
    tinfo = targets.resolve(target)
    opts = options or TuneOptions()
    for name, value in (("trials", trials), ("time_budget", time_budget),
                        ("rpc_tracker", rpc_tracker), ("rpc_key", rpc_key)):
        if value is not None:
            setattr(opts, name, value)
    if opts.time_budget is not None and opts.time_budget <= 0:
        raise ValueError(f"--time-budget must be > 0 seconds, got {opts.time_budget}")
    if opts.rpc_tracker:
        parse_tracker(opts.rpc_tracker)  # a typo fails now, not after extracting the tasks
        if not opts.rpc_key:
            raise ValueError("--rpc-tracker needs --rpc-key (the key the RPC servers "
                             "registered)")
    elif runner is None and tinfo.toolchain is not None:
        raise ValueError(f"target {tinfo.name!r} is for {tinfo.host_arch}, which this "
                         f"{targets._this_arch()} host cannot run: measure on such a device "
                         "with --rpc-tracker HOST:PORT --rpc-key KEY (docs/targets.md)")
    database = TuningDatabase(db, create=True)
    provenance = {"onnxc": __version__, "model": _model_id(model)}
    with database.job_lock(provenance["model"]["name"]):  # one job per directory: refuse a second
        tasks = extract_tasks(model, tinfo, **compile_kwargs)
        bar = progress or ProgressBar()
        summary = tune_tasks(tasks, tinfo, database, opts, provenance=provenance, progress=bar,
                             runner=runner)
        if check_model and runner is None and not opts.rpc_tracker:
            summary["model_check"] = check_in_model(model, tinfo, database, tasks,
                                                    compile_kwargs=compile_kwargs, progress=bar)
        else:
            summary["model_check"] = {"skipped": "measured elsewhere (RPC or a custom "
                                                 "runner): the model cannot run here"}
    summary["database"] = database.path
    summary["target_file"] = os.path.basename(database.file_for(tinfo))
    return summary


def _model_id(model) -> dict:
    if isinstance(model, onnx.ModelProto):
        data, name = model.SerializeToString(), text(model.graph.name) or "model"
    else:
        with open(os.fspath(model), "rb") as f:
            data = f.read()
        name = os.path.basename(os.fspath(model))
    return {"name": name, "sha256": hashlib.sha256(data).hexdigest()}



def check_in_model(model, target, database: TuningDatabase, tasks: list, *,
                   compile_kwargs: dict | None = None, margin: float = 0.03, rounds: int = 5,
                   min_runs: int = 20, progress=None) -> dict:
    """Profile the model untuned and tuned in this process, alternately, and demote every
    tuned kernel that is slower inside the model than our default by more than ``margin``
    (3%): a record keeping the default is appended (the last record of a task wins), with
    its own ``provenance.time`` (the tuned record's is kept as ``tuned_time``).  If the
    tuned model is then still slower as a whole, every tuned kernel of it is demoted.

    The tuning measurement times each kernel alone; inside the model its neighbours'
    data and the thread pool's state differ, so this is the check that a tuned model is
    not slower than the untuned one, on this machine, within its noise.
    """
    import runtime

    from .. import driver

    tinfo = targets.resolve(target)
    kw = dict(compile_kwargs or {})
    by_key = {t.key: t for t in tasks}
    out = {"demoted": []}
    for attempt in range(3):  # measure, demote, measure again (what is left), at most twice
        tuned_keys = [k for k, r in database.records(tinfo).items()
                      if r["winner"] == "tuned" and k in by_key]
        if not tuned_keys:
            if not out["demoted"]:
                out["skipped"] = "no tuned kernel in this model"
            else:
                out["tuned_ms"] = out.get("untuned_ms")  # everything demoted: the untuned model
            return out
        base = driver.compile_static(model, tinfo, **kw)
        tuned = driver.compile_static(model, tinfo, tuning_db=database, **kw)
        try:
            (b_kernels, b_total), (t_kernels, t_total) = _profile_alternately(
                [base, tuned], rounds, min_runs)
        except runtime.ArtifactError as e:  # built for CPU features this host lacks
            return {"skipped": f"the model cannot run on this host: {e}"}
        out.update(untuned_ms=round(b_total * 1e3, 3), tuned_ms=round(t_total * 1e3, 3))
        if attempt == 2:
            break
        slower = []
        for key in tuned_keys:
            syms = by_key[key].kernels
            b = sum(b_kernels.get(s, 0.0) for s in syms)
            t = sum(t_kernels.get(s, 0.0) for s in syms)
            if b and t > b * (1 + margin):
                slower.append((key, b, t))
        if not slower and t_total > b_total * (1 + margin):
            slower = [(k, None, None) for k in tuned_keys]  # slower as a whole: all of them
        if not slower:
            break
        for key, b, t in slower:
            rec = dict(database.records(tinfo)[key])
            why = ("slower inside the model" if b is not None else
                   "the tuned model was slower as a whole")
            rec.update(winner="default", trace=None, stop=f"demoted: {why}",
                       latency_us=dict(rec["latency_us"],
                                       in_model_default=None if b is None else round(b * 1e6, 3),
                                       in_model_tuned=None if t is None else round(t * 1e6, 3)),
                       # the demotion's own time (scripts/tuning_curve.py applies a record
                       # at its time); the tuned record's is kept beside it
                       provenance=dict(rec.get("provenance", {}), time=_now(),
                                       tuned_time=rec.get("provenance", {}).get("time")))
            database.append(rec)
            out["demoted"].append(rec["kernel"])
            if progress is not None:
                detail = (f"{t * 1e6:.1f} us vs default {b * 1e6:.1f} us per run" if b else why)
                progress.message(f"demoted {rec['kernel']}: {why} ({detail}); the default "
                                 "schedule stays")
    if progress is not None and "tuned_ms" in out:
        progress.message(f"model check: untuned {out['untuned_ms']:.3f} ms, tuned "
                         f"{out['tuned_ms']:.3f} ms per run (kernel time, this process)")
    return out


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _profile_alternately(models: list, rounds: int, min_runs: int) -> list:
    """[({kernel: seconds per run}, median seconds per run)] per compiled model."""
    import json
    import statistics
    import tempfile

    import runtime

    from .bench import random_feeds

    tmp = tempfile.mkdtemp(prefix="onnxc-tune-check-")
    sessions = [cm.session(runtime.SessionOptions(
        enable_profiling=True, profile_file_prefix=os.path.join(tmp, f"m{i}")))
        for i, cm in enumerate(models)]
    feeds = random_feeds([(i.name, i.shape, i.dtype) for i in sessions[0].get_inputs()])
    per_round = max(2, -(-min_runs // rounds))
    for sess in sessions:
        sess.run(None, feeds)  # warm up: first-call costs stay out of the comparison
    for _ in range(rounds):
        for sess in sessions:
            for _ in range(per_round):
                sess.run(None, feeds)
    out = []
    for sess in sessions:
        path = sess.end_profiling()
        with open(path) as f:
            trace = json.load(f)
        os.remove(path)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        runs: dict = {}
        for ev in events:
            run = ev.get("args", {}).get("run")
            if ev.get("cat") == "kernel" and run is not None and run > 0:  # run 0: warm-up
                runs.setdefault(run, {}).setdefault(ev["name"], 0.0)
                runs[run][ev["name"]] += ev["dur"] / 1e6
        names = {n for r in runs.values() for n in r}
        kernels = {n: statistics.median(r.get(n, 0.0) for r in runs.values()) for n in names}
        total = statistics.median(sum(r.values()) for r in runs.values())
        out.append((kernels, total))
    os.rmdir(tmp)
    return out
