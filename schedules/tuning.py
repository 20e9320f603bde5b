"""Tuning jobs: MetaSchedule's evolutionary search with its XGBoost cost model, one kernel
at a time, seeded with our default schedule and measured against it.

What a job does (``tune_tasks``):

1. skip the tasks the database already has a record for on this target (resume);
2. build and measure every pending task's *default* schedule (our rules) with the runner
   that will measure the candidates: the start point, and each task's expected gain
   ``weight x default latency`` (weight = how many calls the model makes to the kernel);
3. tune the tasks in order of expected gain.  Each gets the share of the remaining trials
   and of the remaining time budget that its gain is of the remaining gain, at least one
   round.  Its search starts from the default: the default's trace and latency are put in
   the search's database (so the evolutionary search's initial population holds it) and
   in the cost model's training data.  A task stops when its share is spent, when the
   search has nothing new, or when its best latency stopped improving (``patience`` rounds
   with less than ``min_gain`` improvement);
4. measure the default and the best candidate again, alternately, with the same runner,
   and store the winner: the tuned trace only if it beats the default by ``win_margin``,
   otherwise a record that keeps the default.  So a tuned model is never slower than the
   untuned one by these measurements.  A record is durable once reported saved;
5. fail loudly (:class:`TuningError`) for a task with no valid measurement at all:
   MetaSchedule itself can report success after zero valid measurements (apache/tvm#20314).

Interrupted tasks resume: every round's measured candidates are saved to the database's
partial file before the next round starts.  A task that has some when it starts (its job
was killed before its record was saved) replays their traces, puts the valid ones in the
search's database and the cost model's training data as it does the default, and counts
them against its trial share and flattening history: it goes on from where it stopped
instead of starting over.  (The XGBoost model is not saved; it is retrained from them.)

Candidates are built in worker processes (MetaSchedule's LocalBuilder) and measured by
MetaSchedule's LocalRunner, or through a TVM RPC tracker (RPCRunner).  This module knows
nothing of ONNX: PrimFuncs and call counts in, records out (``compiler/tune.py`` extracts
the tasks from a model).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field

from .flops import estimate as estimate_flops
from .lets import vectorizable
from .database import (TuningDatabase, canonical_target, private_copy, task_key,
                       trace_to_json, workload_hash)

log = logging.getLogger("onnxc.schedules")


class TuningError(RuntimeError):
    """A tuning job that measured nothing (for some task, or at all), or cannot measure."""

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary


@dataclass
class Task:
    """One tuning task: a distinct kernel (structurally equal kernels merged)."""

    key: str
    kernel: str                 # the first symbol with this structure
    kernels: list               # every symbol with this structure
    func: object                # the unscheduled PrimFunc
    weight: int                 # calls per model run
    flops: int
    default_rule: str
    default_func: object        # the PrimFunc as the default rule schedules it
    default_trace: object = None  # its schedule trace, when it replays to the same function


@dataclass
class TuneOptions:
    """How a job spends its budget and decides winners.

    ``trials``: measured candidates over all tasks (None: 32 per pending task, or no limit
    with a ``time_budget``); ``time_budget``: wall-clock seconds for the whole job.
    """

    trials: int | None = None
    time_budget: float | None = None
    trials_per_round: int = 16
    patience: int = 2            # rounds without min_gain improvement before a task stops
    min_gain: float = 0.01
    win_margin: float = 0.02     # the tuned schedule must be this much faster to replace ours
    final_measurements: int = 3  # alternating default/tuned measurements per task at the end
    population: int = 256        # evolutionary search population (MetaSchedule's default 512)
    seed: int | None = None
    rpc_tracker: str | None = None  # "HOST:PORT"
    rpc_key: str | None = None
    build_workers: int | None = None
    timeout_s: float = 60.0      # per build / per measurement
    # Each timed run starts with the kernel's weights flushed from the caches, as in the
    # model, where the other kernels' data evict them.  Timed hot (MetaSchedule's default,
    # number=3, min_repeat_ms=100), tuned GEMMs of BERT looked 15 % faster than ours and
    # were 30-50 % slower inside the model; flushed, the measurement ranks them as the
    # model does.  Median of `repeat` single runs.
    cache_flush: bool = True
    repeat: int = 5


@dataclass
class _Measured:
    secs: float | None = None
    error: str | None = None


@dataclass
class _TaskRun:
    task: Task
    default_s: float | None = None
    best_s: float | None = None
    best_trace: object = None
    best_func: object = None
    trials: int = 0
    valid: int = 0
    rounds: int = 0
    history: list = field(default_factory=list)
    resumed_trials: int = 0     # measured by an interrupted earlier job (partial file)
    first_error: str | None = None
    stop: str = ""
    seconds: float = 0.0


# -- tasks -------------------------------------------------------------------------------


def make_tasks(prim_funcs: dict, counts: dict, target, flops: dict | None = None) -> list:
    """Distinct kernels of ``prim_funcs`` {symbol: PrimFunc} as :class:`Task` s, weighted by
    ``counts`` {symbol: calls}; each with its default schedule for ``target`` (TargetInfo)."""
    import tvm_ffi

    from . import default_schedule

    tvm_target = target.tvm_target()
    by_key: dict = {}
    for name, func in prim_funcs.items():
        key = task_key(func, target)
        t = by_key.get(key)
        if t is not None:
            if not tvm_ffi.structural_equal(_strip(t.func), _strip(func)):
                log.warning("kernels %s and %s share a structural hash but differ; %s is not "
                            "tuned", t.kernel, name, name)
                continue
            t.kernels.append(name)
            t.weight += counts.get(name, 0)
            continue
        sch, rule = default_schedule(func, tvm_target, name)
        default_func = vectorizable(sch.mod["main"]) if sch is not None else func
        n_flops = (flops or {}).get(name)
        by_key[key] = Task(key=key, kernel=name, kernels=[name], func=_strip(func),
                           weight=counts.get(name, 0),
                           flops=int(n_flops if n_flops is not None else estimate_flops(func)),
                           default_rule=rule, default_func=_strip(default_func),
                           default_trace=_replayable(sch, func))
    return [t for t in by_key.values() if t.weight > 0]


def _strip(func):
    if func.attrs is not None and "global_symbol" in func.attrs:
        return func.without_attr("global_symbol")
    return func


def _main(func):
    import tvm

    return tvm.IRModule({"main": private_copy(func)})


def _replayable(sch, func):
    """The default schedule's trace if replaying it gives the same function, else None
    (a rule that changed the function outside the schedule primitives)."""
    if sch is None:
        return None
    import tvm_ffi
    from tvm import s_tir

    try:
        fresh = s_tir.Schedule(_main(func))
        sch.trace.apply_to_schedule(fresh, remove_postproc=False)
        same = tvm_ffi.structural_equal(_strip(fresh.mod["main"]), _strip(sch.mod["main"]))
        return sch.trace if same else None
    except Exception as e:
        log.debug("default schedule of %s does not replay: %s", func, e)
        return None


# -- measurement -------------------------------------------------------------------------


def _build_function():
    # Nested, so that cloudpickle ships it by value to the build workers: the workers then
    # import neither this package nor tvm.s_tir.tensor_intrin, which TVM's default build
    # function imports (12 s per worker, and LocalBuilder starts new workers every batch).
    def build(mod, target, _params):
        from tvm.driver import build as tvm_build
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm_build(mod, target=target)

    return build


def _export_function(cxx: str):
    # A candidate for another architecture (--target arm) is linked here with the cross g++
    # into a .so the remote RPC server loads as is: MetaSchedule's default export writes a
    # .tar of object files, which the server would link with its own compiler (an emulated
    # aarch64 Python has none).  Nested for cloudpickle, like _build_function.
    def export(mod) -> str:
        import os as _os
        import tempfile as _tempfile

        path = _os.path.join(_tempfile.mkdtemp(), "tvm_tmp_mod.so")
        mod.export_library(path, cc=cxx)
        return path

    return export


class Measurer:
    """Builds scheduled kernels and measures them, always with the same runner.

    Parameters
    ----------
    target : tvm.target.Target
    options : TuneOptions
    runner : a MetaSchedule Runner, optional
        Replaces the LocalRunner / RPCRunner the options ask for (tests).
    toolchain : dict, optional
        ``targets.TargetInfo.toolchain`` when the target is another architecture: candidates
        are then linked with its ``cxx`` (they can only be measured over RPC).
    """

    def __init__(self, target, options: TuneOptions, runner=None, toolchain=None):
        from tvm.s_tir.meta_schedule.builder import LocalBuilder
        from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner

        self.target = target
        workers = options.build_workers or max(1, min(os.cpu_count() or 1, 4))
        export = {} if toolchain is None else {"f_export": _export_function(toolchain["cxx"])}
        self.builder = LocalBuilder(max_workers=workers, timeout_sec=options.timeout_s,
                                    f_build=_build_function(), **export)
        evaluator = EvaluatorConfig(number=1, repeat=options.repeat, min_repeat_ms=0,
                                    enable_cpu_cache_flush=options.cache_flush)
        self.where = "local"
        if runner is not None:
            self.runner, self.where = runner, "custom"
        elif options.rpc_tracker:
            self.runner = _rpc_runner(options, evaluator)
            self.where = f"rpc {options.rpc_tracker} key {options.rpc_key}"
        else:
            self.runner = LocalRunner(timeout_sec=options.timeout_s, evaluator_config=evaluator)

    def build(self, mods: list) -> list:
        """[(artifact path, None) or (None, error)] per IRModule."""
        from tvm.s_tir.meta_schedule.builder import BuilderInput

        if not mods:
            return []
        results = self.builder.build([BuilderInput(m, self.target) for m in mods])
        return [(r.artifact_path, None) if r.error_msg is None else (None, _short(r.error_msg))
                for r in results]

    def run(self, artifact: str, args_info) -> _Measured:
        """Measure one built artifact (mean seconds per call)."""
        from tvm.s_tir.meta_schedule.runner import RunnerInput

        try:
            (future,) = self.runner.run([RunnerInput(artifact, "cpu", args_info)])
            res = future.result()
        except Exception as e:  # a runner that raises instead of reporting
            return _Measured(error=_short(f"{type(e).__name__}: {e}"))
        if res.error_msg:
            return _Measured(error=_short(res.error_msg))
        secs = [float(s) for s in (res.run_secs or [])]
        if not secs or not all(math.isfinite(s) and 0 < s < 1e9 for s in secs):
            return _Measured(error=f"no valid time in {secs}")
        return _Measured(secs=statistics.median(secs))

    def measure(self, mods: list, args_info) -> list:
        """Build and measure each IRModule: [_Measured]."""
        out = []
        for artifact, err in self.build(mods):
            out.append(_Measured(error=err) if artifact is None else self.run(artifact, args_info))
            remove_artifact(artifact)
        return out


def remove_artifact(path) -> None:
    if path:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _short(msg: str) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return " | ".join(lines[-2:])[:400] if lines else "no message"


def parse_tracker(spec: str) -> tuple:
    host, sep, port = str(spec).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--rpc-tracker {spec!r}: expected HOST:PORT")
    return host, int(port)


def _rpc_runner(options: TuneOptions, evaluator):
    from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

    if not options.rpc_key:
        raise ValueError("--rpc-tracker needs --rpc-key (the key the RPC servers registered)")
    host, port = parse_tracker(options.rpc_tracker)
    config = RPCConfig(tracker_host=host, tracker_port=port, tracker_key=options.rpc_key,
                       session_timeout_sec=int(options.timeout_s))
    try:
        n = config.count_num_servers(allow_missing=True)
    except Exception as e:
        raise TuningError(f"cannot reach the RPC tracker at {host}:{port}: "
                          f"{_short(str(e))}") from None
    if n == 0:
        raise TuningError(f"no RPC server registered under key {options.rpc_key!r} at the "
                          f"tracker {host}:{port} (python -m tvm.exec.query_rpc_tracker "
                          f"--host {host} --port {port} lists them)")
    # one measurement at a time: servers on one machine would disturb each other's timings
    return RPCRunner(config, evaluator, max_workers=1)


# -- progress ----------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar redrawn with a carriage return (on a terminal); elsewhere
    (a log file, a pipe) one plain line per update, at most every ``log_every`` seconds."""

    def __init__(self, stream=None, width: int = 24, tty: bool | None = None,
                 log_every: float = 10.0):
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_every = log_every
        self._shown = 0
        self._last = -math.inf

    def draw(self, fraction: float, text: str, force: bool = False) -> None:
        fraction = min(max(fraction, 0.0), 1.0)
        filled = int(round(fraction * self.width))
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {fraction * 100:3.0f}% {text}"
        now = time.monotonic()
        if self.tty:
            pad = max(0, self._shown - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._shown = len(line)
        elif force or now - self._last >= self.log_every:
            self.stream.write(line + "\n")
            self._last = now
        self.stream.flush()

    def message(self, text: str) -> None:
        """A permanent line above the bar."""
        if self.tty and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self._shown = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\n")
            self._shown = 0
        self.stream.flush()


def _duration(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _gflops(task: Task, secs: float | None) -> str:
    """GFLOP/s, or the latency for kernels with next to no arithmetic (softmax of 10)."""
    if not secs:
        return "-"
    if task.flops and task.flops / secs >= 1e8:
        return f"{task.flops / secs / 1e9:.1f} GFLOP/s"
    return f"{secs * 1e6:.1f} us"


# -- the job -----------------------------------------------------------------------------


def tune_tasks(tasks: list, target, database: TuningDatabase, options: TuneOptions | None = None,
               *, provenance: dict | None = None, progress: ProgressBar | None = None,
               runner=None) -> dict:
    """Tune ``tasks`` (from :func:`make_tasks`) for ``target`` (TargetInfo); append the
    winners to ``database``.  Returns a summary dict; raises :class:`TuningError` when a
    task measured nothing (after saving every other task's record)."""
    return _Job(tasks, target, database, options or TuneOptions(), provenance or {},
                progress or ProgressBar(), runner).run()


class _Job:
    def __init__(self, tasks, target, database, options, provenance, progress, runner):
        self.tasks, self.tinfo, self.db, self.opt = tasks, target, database, options
        self.provenance, self.bar, self.custom_runner = provenance, progress, runner
        self.target = target.tvm_target()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + options.time_budget if options.time_budget else math.inf
        self.trials_done = 0
        self.summary = {"tasks": len(tasks), "already_done": 0, "tuned": 0, "default_kept": 0,
                        "failed": 0, "not_started": 0, "trials": 0, "valid_trials": 0,
                        "measured_with": None, "per_task": []}

    # -- driver ------------------------------------------------------------------------

    def run(self) -> dict:
        done = self.db.records(self.tinfo)
        pending = [t for t in self.tasks if t.key not in done]
        self.summary["already_done"] = len(self.tasks) - len(pending)
        if self.summary["already_done"]:
            self.bar.message(f"resuming: {self.summary['already_done']} of {len(self.tasks)} "
                             f"tasks already in {self.db.file_for(self.tinfo)}")
        if not pending:
            return self._finish([])
        if self.opt.trials is not None and self.opt.trials < 1:
            raise ValueError(f"--trials must be >= 1, got {self.opt.trials}")
        self.total_trials = (self.opt.trials if self.opt.trials is not None else
                             None if self.opt.time_budget else 32 * len(pending))
        from tvm.s_tir.meta_schedule.cost_model import XGBModel

        self.measurer = Measurer(self.target, self.opt, self.custom_runner,
                                 toolchain=self.tinfo.toolchain)
        self.summary["measured_with"] = self.measurer.where
        self.cost_model = XGBModel(num_tuning_cores=self._cores())
        runs = self._measure_defaults(pending)
        unmeasurable = [r for r in runs if r.default_s is None]
        runs = [r for r in runs if r.default_s is not None]
        if not runs:
            raise TuningError(
                f"nothing was measured: the default schedule of every pending task "
                f"({len(unmeasurable)}) failed to build or run with the {self.measurer.where} "
                f"runner; first error: {unmeasurable[0].first_error}", self.summary)
        rates = [r.task.flops / r.default_s for r in runs if r.task.flops]
        self.best_rate = max(rates) if rates else None
        for r in unmeasurable:  # no baseline, so no winner can be chosen: not tuned
            r.stop = "skipped: the default schedule failed to measure"
        runs.sort(key=lambda r: -self._gain(r))
        remaining_gain = sum(self._gain(r) for r in runs)
        failures = []
        for i, r in enumerate(runs):
            share_trials, share_secs = self._shares(r, remaining_gain)
            remaining_gain -= self._gain(r)
            if share_trials == 0 or time.monotonic() >= self.deadline:
                r.stop = "not started: budget spent"
                continue
            self._tune_one(r, i, len(runs), share_trials, share_secs)
            if r.trials == 0:  # the budget ran out while its first candidates were built
                r.stop = f"not started: {r.stop or 'budget spent'}"
                continue
            if r.valid == 0:
                failures.append(r)
                self.bar.message(f"task {r.task.kernel}: NOTHING MEASURED in {r.trials} trials "
                                 f"({r.first_error})")
                continue
            self._decide_and_save(r)
        self.bar.close()
        return self._finish(runs + unmeasurable, failures)

    def _finish(self, runs, failures=()) -> dict:
        s = self.summary
        s["not_started"] = sum(1 for r in runs if r.stop.startswith("not started"))
        s["skipped"] = sum(1 for r in runs if r.stop.startswith("skipped"))
        s["failed"] = len(failures)
        s["trials"] = sum(r.trials for r in runs)
        s["valid_trials"] = sum(r.valid for r in runs)
        s["resumed_trials"] = sum(r.resumed_trials for r in runs)
        try:  # saved measurements of tasks that now have a record are of no further use
            self.db.drop_finished_partials(self.tinfo)
        except OSError as e:
            log.warning("could not remove finished partial measurements: %s", e)
        s["seconds"] = round(time.monotonic() - self.t0, 1)
        s["per_task"] = [self._task_summary(r) for r in runs]
        if failures:
            names = ", ".join(f"{r.task.kernel} ({r.first_error})" for r in failures[:5])
            raise TuningError(f"nothing was measured for {len(failures)} task(s): {names}; "
                              "their records were not saved", s)
        return s

    def _task_summary(self, r: _TaskRun) -> dict:
        return {"kernel": r.task.kernel, "kernels": r.task.kernels, "weight": r.task.weight,
                "default_us": _us(r.default_s), "best_us": _us(r.best_s), "trials": r.trials,
                "valid": r.valid, "resumed_trials": r.resumed_trials, "stop": r.stop,
                "seconds": round(r.seconds, 1)}

    def _cores(self) -> int:
        return int(self.tinfo.cores or os.cpu_count() or 1)

    def _gain(self, r: _TaskRun) -> float:
        return r.task.weight * (r.best_s or r.default_s) * self._headroom(r)

    def _headroom(self, r: _TaskRun) -> float:
        """How far the task's default is from the best FLOP rate any default of this job
        reached (1 before the defaults are measured)."""
        best = getattr(self, "best_rate", None)
        if not best or not r.default_s:
            return 1.0
        if not r.task.flops:
            return 0.5  # copies, layout transforms: no FLOP rate to compare
        return max(0.1, 1.0 - (r.task.flops / r.default_s) / best)

    def _shares(self, r: _TaskRun, remaining_gain: float) -> tuple:
        frac = self._gain(r) / remaining_gain if remaining_gain > 0 else 1.0
        per_round = self.opt.trials_per_round
        if self.total_trials is None:
            trials = 10_000  # bounded by time only
        else:
            left = self.total_trials - self.trials_done
            trials = min(left, max(per_round, int(left * frac)))
        secs = (self.deadline - time.monotonic()) * frac if math.isfinite(self.deadline) else math.inf
        return max(0, trials), secs

    # -- defaults ----------------------------------------------------------------------

    def _measure_defaults(self, pending: list) -> list:
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo

        runs = [_TaskRun(t) for t in pending]
        self.bar.draw(0, f"measuring the default schedules of {len(pending)} tasks", force=True)
        built = self.measurer.build([_main(t.default_func) for t in pending])
        for k, (r, (artifact, err)) in enumerate(zip(runs, built)):
            m = _Measured(error=err) if artifact is None else self.measurer.run(
                artifact, ArgInfo.from_prim_func(r.task.func))
            remove_artifact(artifact)
            r.default_s, r.first_error = m.secs, m.error
            if m.error:
                self.bar.message(f"task {r.task.kernel}: the default schedule "
                                 f"({r.task.default_rule}) failed to measure: {m.error}")
            self.bar.draw(0, f"default {k + 1}/{len(runs)} {r.task.kernel}: "
                             f"{_gflops(r.task, m.secs)}")
        return runs

    # -- one task ----------------------------------------------------------------------

    def _tune_one(self, r: _TaskRun, index: int, n: int, share_trials: int, share_secs: float):
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo
        from tvm.s_tir.meta_schedule.runner import RunnerResult
        from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

        t = r.task
        if "tvm.s_tir.tensor_intrin" not in sys.modules:
            self.bar.draw(0, "preparing MetaSchedule (its tensor intrinsics load once, slowly)",
                          force=True)
            import tvm.s_tir.tensor_intrin  # noqa: F401  (TuneContext imports them anyway)
        start = time.monotonic()
        task_deadline = min(self.deadline, start + share_secs)
        args_info = ArgInfo.from_prim_func(t.func)
        ctx = ms.TuneContext(
            mod=_main(t.func), target=self.target, space_generator="post-order-apply",
            search_strategy=ms.search_strategy.EvolutionarySearch(
                population_size=self.opt.population),
            task_name=t.kernel, rand_state=-1 if self.opt.seed is None else self.opt.seed + index,
            num_threads=self._cores())
        ms_db = ms.database.MemoryDatabase()
        workload = ms_db.commit_workload(ctx.mod)
        if t.default_trace is not None:
            # seed: the search's initial population draws on the measured records, and
            # the cost model learns where the default stands
            ms_db.commit_tuning_record(ms.database.TuningRecord(
                t.default_trace, workload, [r.default_s], self.target, args_info))
            try:
                from tvm import s_tir

                seed_sch = s_tir.Schedule(_main(t.func))
                t.default_trace.apply_to_schedule(seed_sch, remove_postproc=False)
                self.cost_model.update(ctx, [MeasureCandidate(seed_sch, args_info)],
                                       [RunnerResult([r.default_s], None)])
            except Exception as e:  # the seed is a help, not a requirement
                log.debug("cost model seed for %s failed: %s", t.kernel, e)
        self._resume_partial(r, ctx, ms_db, workload, args_info)
        per_round = max(1, min(self.opt.trials_per_round, share_trials))
        ctx.pre_tuning(share_trials, per_round, ctx.generate_design_space(), ms_db,
                       self.cost_model)
        label = f"task {index + 1}/{n} {t.kernel}"

        def show(extra=""):
            self._draw(label, r, share_trials, extra)

        show("generating candidates")
        while True:
            if time.monotonic() >= task_deadline:
                r.stop = "time share spent" if time.monotonic() < self.deadline else "time budget"
                break
            if r.trials >= share_trials:
                r.stop = "trial share spent"
                break
            cands = ctx.generate_measure_candidates()
            if not cands:
                r.stop = "search space exhausted"
                break
            show(f"building {len(cands)}")
            built = self.measurer.build([c.sch.mod for c in cands])
            results, measured = [], []
            for c, (artifact, err) in zip(cands, built):
                if artifact is not None and time.monotonic() >= self.deadline:
                    remove_artifact(artifact)  # left unmeasured: it must not teach anything
                    results.append(RunnerResult(None, "not measured: time budget spent"))
                    continue
                m = _Measured(error=err) if artifact is None else self.measurer.run(
                    artifact, args_info)
                remove_artifact(artifact)
                measured.append(len(results))
                r.trials += 1
                self.trials_done += 1
                if m.secs is None:
                    r.first_error = r.first_error or m.error
                    results.append(RunnerResult(None, m.error))
                else:
                    r.valid += 1
                    results.append(RunnerResult([m.secs], None))
                    if r.best_s is None or m.secs < r.best_s:
                        r.best_s, r.best_trace, r.best_func = m.secs, c.sch.trace, c.sch.mod["main"]
                show()
            # durable before the next round: a killed job resumes from these (_resume_partial)
            self.db.append_partial(self.tinfo, [
                {"task": t.key, "round": r.rounds, "trace": trace_to_json(cands[k].sch.trace),
                 "secs": (float(getattr(results[k].run_secs[0], "value", results[k].run_secs[0]))
                          if results[k].run_secs else None),
                 "error": None if results[k].run_secs else _short(str(results[k].error_msg))}
                for k in measured])
            for k in measured:
                ms_db.commit_tuning_record(ms.database.TuningRecord(
                    cands[k].sch.trace, workload, results[k].run_secs, self.target, args_info))
            self.cost_model.update(ctx, [cands[k] for k in measured],
                                   [results[k] for k in measured])
            ctx.notify_runner_results(cands, results)
            r.rounds += 1
            r.history.append(r.best_s)
            if self._flat(r.history):
                r.stop = "gains flattened"
                break
            if time.monotonic() >= self.deadline:
                r.stop = "time budget"
                break
        ctx.post_tuning()
        r.seconds = time.monotonic() - start

    def _resume_partial(self, r: _TaskRun, ctx, ms_db, workload, args_info) -> None:
        """Take up the measurements an interrupted job saved for this task (see module doc)."""
        from tvm import s_tir
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.meta_schedule.runner import RunnerResult
        from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

        saved = self.db.partials(self.tinfo, r.task.key)
        if not saved:
            return
        cands, results, rounds, unusable = [], [], {}, 0
        for m in saved:
            try:
                sch = s_tir.Schedule(_main(r.task.func))
                s_tir.Trace.apply_json_to_schedule(m["trace"], sch)
            except Exception:  # from another TVM version: skip it
                unusable += 1
                continue
            r.trials += 1
            r.resumed_trials += 1
            if m["secs"] is None:
                r.first_error = r.first_error or m.get("error")
            else:
                r.valid += 1
                ms_db.commit_tuning_record(ms.database.TuningRecord(
                    sch.trace, workload, [m["secs"]], self.target, args_info))
                cands.append(MeasureCandidate(sch, args_info))
                results.append(RunnerResult([m["secs"]], None))
                if r.best_s is None or m["secs"] < r.best_s:
                    r.best_s, r.best_trace, r.best_func = m["secs"], sch.trace, sch.mod["main"]
            rounds[m["round"]] = r.best_s  # the best after that round
        r.rounds = len(rounds)
        r.history = [rounds[k] for k in sorted(rounds)]
        if cands:
            try:
                self.cost_model.update(ctx, cands, results)
            except Exception as e:  # a help, as the default's seed is
                log.debug("cost model update from saved measurements failed: %s", e)
        self.bar.message(f"task {r.task.kernel}: resuming from {r.resumed_trials} saved "
                         f"measurements ({r.valid} valid, {r.rounds} rounds) of an interrupted "
                         f"job" + (f"; {unusable} did not replay" if unusable else ""))

    def _flat(self, history: list) -> bool:
        p = self.opt.patience
        if len(history) <= p or history[-1] is None or history[-1 - p] is None:
            return False
        return history[-1] > history[-1 - p] * (1 - self.opt.min_gain)

    def _draw(self, label: str, r: _TaskRun, share: int, extra: str = ""):
        elapsed = time.monotonic() - self.t0
        fracs, etas = [], []
        if math.isfinite(self.deadline):
            budget = self.deadline - self.t0
            fracs.append(elapsed / budget)
            etas.append(max(0.0, self.deadline - time.monotonic()))
        if self.total_trials:
            fracs.append(self.trials_done / self.total_trials)
            if self.trials_done:
                etas.append(elapsed / self.trials_done * (self.total_trials - self.trials_done))
        share_txt = f"/{share}" if share < 10_000 else ""
        text = (f"{label}  trials {r.trials}{share_txt}  best {_gflops(r.task, r.best_s)} "
                f"(default {_gflops(r.task, r.default_s)})  "
                f"ETA {_duration(min(etas)) if etas else '?'}")
        self.bar.draw(max(fracs) if fracs else 0.0, text + (f"  {extra}" if extra else ""))

    # -- winner ------------------------------------------------------------------------

    def _decide_and_save(self, r: _TaskRun) -> None:
        """Measure default and best alternately with the same runner; store the winner."""
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo

        t = r.task
        args_info = ArgInfo.from_prim_func(t.func)
        built = self.measurer.build([_main(t.default_func), _main(r.best_func)])
        d_times, t_times = [], []
        if all(a is not None for a, _ in built):
            for _ in range(self.opt.final_measurements):
                for (artifact, _), times in zip(built, (d_times, t_times)):
                    m = self.measurer.run(artifact, args_info)
                    if m.secs is not None:
                        times.append(m.secs)
        for artifact, _ in built:
            remove_artifact(artifact)
        default_s = statistics.median(d_times) if d_times else r.default_s
        tuned_s = statistics.median(t_times) if t_times else None
        tuned_wins = tuned_s is not None and tuned_s < default_s * (1 - self.opt.win_margin)
        record = {
            "format": 1,
            "task": t.key,
            "workload_hash": workload_hash(t.func),
            "target": canonical_target(self.tinfo),
            "kernel": t.kernel,
            "kernels": t.kernels,
            "weight": t.weight,
            "flops": t.flops,
            "winner": "tuned" if tuned_wins else "default",
            "default_rule": t.default_rule,
            "trace": trace_to_json(r.best_trace) if tuned_wins else None,
            "latency_us": {"default": _us(default_s), "tuned": _us(tuned_s),
                           "default_while_tuning": _us(r.default_s),
                           "best_while_tuning": _us(r.best_s)},
            "trials": r.trials,
            "resumed_trials": r.resumed_trials,
            "valid_trials": r.valid,
            "rounds": r.rounds,
            "stop": r.stop,
            "tuning_seconds": round(r.seconds, 1),
            "measured_with": self.measurer.where,
            "provenance": {**self.provenance, **_provenance()},
        }
        self.db.append(record)  # durable before it is reported
        self.summary["tuned" if tuned_wins else "default_kept"] += 1
        verdict = (f"tuned {_us(tuned_s)} us beats default {_us(default_s)} us "
                   f"({default_s / tuned_s:.2f}x)" if tuned_wins else
                   f"default kept ({_us(default_s)} us; best tuned "
                   f"{_us(tuned_s) if tuned_s else 'unmeasured'} us)")
        self.bar.message(f"saved {t.kernel} x{t.weight}: {verdict}; {r.trials} trials "
                         f"({r.valid} valid), {r.stop}")


def _us(secs) -> float | None:
    return None if secs is None else round(secs * 1e6, 3)


def _provenance() -> dict:
    import datetime

    import tvm

    try:
        import tvm_ffi

        ffi = tvm_ffi.__version__
    except Exception:
        ffi = None
    return {"tvm": tvm.__version__, "tvm_ffi": ffi,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname()}
