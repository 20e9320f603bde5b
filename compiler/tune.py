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

from . import __version__
from .driver import lower_to_kernels

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
         runner=None, **compile_kwargs) -> dict:
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
    database = TuningDatabase(db, create=True)
    tasks = extract_tasks(model, tinfo, **compile_kwargs)
    provenance = {"onnxc": __version__, "model": _model_id(model)}
    summary = tune_tasks(tasks, tinfo, database, opts, provenance=provenance,
                         progress=progress or ProgressBar(), runner=runner)
    summary["database"] = database.path
    summary["target_file"] = os.path.basename(database.file_for(tinfo))
    return summary


def _model_id(model) -> dict:
    if isinstance(model, onnx.ModelProto):
        data, name = model.SerializeToString(), model.graph.name or "model"
    else:
        with open(os.fspath(model), "rb") as f:
            data = f.read()
        name = os.path.basename(os.fspath(model))
    return {"name": name, "sha256": hashlib.sha256(data).hexdigest()}
