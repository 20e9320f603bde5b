"""Tuning databases: a directory of append-only JSON-lines files, one file per target.

A record says, for one kernel (a TIR PrimFunc, keyed by its structural hash) on one
target, which schedule won a tuning job: ``"tuned"`` (a MetaSchedule trace, stored as
the trace's JSON) or ``"default"`` (our default rule beat everything tuning found, so
the kernel keeps it).  Both latencies are stored, measured with the same runner.

Durability: every record is one line, appended under an exclusive ``flock`` and
``fsync``-ed before :meth:`TuningDatabase.append` returns, so a record reported saved
survives ``kill -9`` or a power cut.  A torn last line (killed mid-write) or any other
line that is not a valid record is skipped with a warning when the file is read; the
next append starts on a fresh line.  When a task has several records the last one wins.

One tuning job at a time: :meth:`TuningDatabase.job_lock` takes an exclusive, non-blocking
``flock`` on ``DIR/.onnxc-tune.lock`` for the whole job; a second job on the same directory
is refused (:class:`DatabaseBusyError`, naming the holder's pid, host and start time)
rather than made to wait.  The kernel drops the lock when its holder dies (even by
``kill -9``), so a lock is never stale.

Partial measurements: while a task is tuned, every round's measured candidates (trace
JSON and latency) are appended, durably, to ``<target file>.partial`` next to the records
(:meth:`TuningDatabase.append_partial`).  A task interrupted before its record was saved
resumes from them (:meth:`TuningDatabase.partials`); the file is removed once every task
it mentions has a record.  A torn or unreadable line there is dropped silently: it is
one lost measurement, not a lost result.

This module knows nothing of ONNX: TIR functions and TVM target dicts in, records out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re

log = logging.getLogger("onnxc.schedules")

FORMAT = 1
SUFFIX = ".jsonl"
PARTIAL_SUFFIX = ".partial"
LOCK_FILE = ".onnxc-tune.lock"
WINNERS = ("tuned", "default")
# field -> accepted types; a line missing one of these (or of another type) is corrupt
_REQUIRED = {"format": int, "task": str, "workload_hash": str, "target": dict, "kernel": str,
             "winner": str, "latency_us": dict, "provenance": dict}


class DatabaseError(ValueError):
    """A tuning database that cannot be used (not a directory, unwritable)."""


class DatabaseBusyError(DatabaseError):
    """Another tuning job holds the database's job lock."""


def canonical_target(target) -> dict:
    """The TVM target as a plain dict (from a dict, a ``tvm.target.Target`` or anything
    with a ``tvm`` dict attribute, such as ``targets.TargetInfo``)."""
    if isinstance(target, dict):
        return dict(target)
    if isinstance(getattr(target, "tvm", None), dict):
        return dict(target.tvm)
    export = getattr(target, "export", None)
    if export is not None:  # tvm.target.Target
        return {str(k): _plain(v) for k, v in dict(export()).items()}
    raise TypeError(f"not a target: {target!r}")


def _plain(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict) or hasattr(v, "items"):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) or hasattr(v, "__len__"):
        return [_plain(x) for x in v]
    return str(v)


def target_hash(target) -> str:
    """8 hex digits naming the target (its canonical JSON)."""
    text = json.dumps(canonical_target(target), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def workload_hash(func) -> str:
    """The structural hash of a PrimFunc (its symbol name left out), as 16 hex digits.

    Structurally equal kernels (``fused_matmul_add`` and ``fused_matmul_add3`` of two
    identical layers) share it, so one record serves both.
    """
    import tvm_ffi

    # the opts and ranges: compiler/lowering/symbolic.py; the element-aligned parameters (set
    # on the kernels reading model inputs, applied after scheduling): input_alignment.py
    for attr in ("global_symbol", "onnxc.dim_opt", "onnxc.dim_range", "onnxc.element_aligned"):
        if func.attrs is not None and attr in func.attrs:
            func = func.without_attr(attr)
    return format(tvm_ffi.structural_hash(func) & (2**64 - 1), "016x")


def task_key(func, target) -> str:
    """A tuning task's key: the kernel's structural hash and the target's."""
    return f"{workload_hash(func)}-{target_hash(target)}"


def target_file_name(target) -> str:
    """``llvm_znver5_2c_1a2b3c4d.jsonl``: readable, and unique per target dict."""
    t = canonical_target(target)
    parts = [str(t.get("kind", "target")), str(t.get("mcpu", "") or t.get("arch", ""))]
    if "num-cores" in t:
        parts.append(f"{t['num-cores']}c")
    stem = "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p) for p in parts if p)
    return f"{stem}_{target_hash(t)}{SUFFIX}"


class TuningDatabase:
    """A tuning database directory (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        The directory.
    create : bool
        Create the directory if it does not exist (``onnxc tune``); otherwise a missing
        directory is an error (``onnxc compile --tuning-db``).
    """

    def __init__(self, path, create: bool = False):
        self.path = os.fspath(path)
        if create:
            try:
                os.makedirs(self.path, exist_ok=True)
            except OSError as e:
                raise DatabaseError(f"tuning database {self.path}: cannot create it ({e})") from None
        if not os.path.isdir(self.path):
            what = "is not a directory" if os.path.exists(self.path) else "does not exist"
            raise DatabaseError(f"tuning database {self.path} {what} (`onnxc tune MODEL "
                                f"--db {self.path}` creates one)")
        self.warnings: list[str] = []
        self._cache: dict = {}  # file name -> (mtime_ns, size, {task: record})

    @contextlib.contextmanager
    def job_lock(self, job: str = ""):
        """Hold the directory's job lock while the ``with`` body runs; refuse if taken.

        Raises :class:`DatabaseBusyError` at once (no waiting) when another job holds it:
        two jobs would tune the same tasks twice, and their in-model checks would judge
        each other's half-written results.  ``job`` (say, the model) is shown to a refused
        second job.
        """
        import socket
        import time

        path = os.path.join(self.path, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise DatabaseError(f"tuning database {self.path}: cannot create its lock file "
                                f"({e})") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DatabaseBusyError(
                    f"tuning database {self.path} is in use by another tuning job "
                    f"({_holder(fd)}); wait for it to finish (rerunning then resumes), or "
                    f"tune into another --db directory") from None
            info = {"pid": os.getpid(), "host": socket.gethostname(), "job": job,
                    "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # drops the flock

    def file_for(self, target) -> str:
        return os.path.join(self.path, target_file_name(target))

    def targets(self) -> list[str]:
        """The record files in the directory (one per target)."""
        return sorted(f for f in os.listdir(self.path) if f.endswith(SUFFIX))

    def records(self, target) -> dict:
        """{task key: record} for ``target``; the last record of a task wins."""
        path = self.file_for(target)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return {}
        cached = self._cache.get(path)
        if cached and cached[0] == (st.st_mtime_ns, st.st_size):
            return cached[1]
        want = canonical_target(target)
        out: dict = {}
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                rec, why = _parse(raw)
                if rec is not None and rec["target"] != want:
                    rec, why = None, "its target differs from the file's"
                if rec is None:
                    msg = f"tuning database {path}:{lineno}: skipping a corrupt record ({why})"
                    log.warning(msg)
                    self.warnings.append(msg)
                    continue
                out[rec["task"]] = rec
        self._cache[path] = ((st.st_mtime_ns, st.st_size), out)
        return out

    def lookup(self, func, target):
        """The record for this kernel on this target, or None."""
        return self.records(target).get(task_key(func, target))

    def append(self, record: dict) -> None:
        """Append one record and make it durable (flush + fsync) before returning."""
        rec, why = _parse(json.dumps(record).encode())
        if rec is None:
            raise ValueError(f"not a valid tuning record ({why}): {record!r}")
        self._append_durably(self.file_for(record["target"]),
                             json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")

    # -- partial measurements of unfinished tasks ---------------------------------------

    def partial_file_for(self, target) -> str:
        return self.file_for(target)[:-len(SUFFIX)] + PARTIAL_SUFFIX

    def append_partial(self, target, measurements: list) -> None:
        """Append measured candidates of unfinished tasks, durably, in one write.

        Each is ``{"task": key, "round": n, "trace": trace JSON, "secs": float or None,
        "error": str or None}``.
        """
        if measurements:
            self._append_durably(self.partial_file_for(target), "".join(
                json.dumps(m, sort_keys=True, separators=(",", ":")) + "\n"
                for m in measurements))

    def partials(self, target, task: str) -> list:
        """The measurements saved for ``task`` (oldest first); unreadable lines dropped."""
        out = []
        try:
            with open(self.partial_file_for(target), "rb") as f:
                for raw in f:
                    try:
                        m = json.loads(raw)
                    except (ValueError, UnicodeDecodeError):
                        continue  # a torn last line
                    if (isinstance(m, dict) and m.get("task") == task
                            and isinstance(m.get("trace"), list)
                            and isinstance(m.get("round"), int)
                            and (m.get("secs") is None or isinstance(m["secs"], (int, float)))):
                        out.append(m)
        except FileNotFoundError:
            pass
        return out

    def drop_finished_partials(self, target) -> bool:
        """Remove the partial file once every task it mentions has a record."""
        path = self.partial_file_for(target)
        done = self.records(target)
        try:
            with open(path, "rb") as f:
                keys = set()
                for raw in f:
                    try:
                        keys.add(json.loads(raw).get("task"))
                    except (ValueError, UnicodeDecodeError, AttributeError):
                        continue
        except FileNotFoundError:
            return False
        if keys - set(done):
            return False
        os.unlink(path)
        return True

    def _append_durably(self, path: str, line: str) -> None:
        created = not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # a writer killed mid-line left a torn line: start this record on its own line
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line
            data = line.encode()
            while data:
                n = os.write(fd, data)
                data = data[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(self.path)


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote into the lock file."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f"pid {info['pid']} on {info['host']}, started {info['started']}"
                + (f", tuning {info['job']}" if info.get("job") else ""))
    except (ValueError, KeyError, TypeError, OSError):
        return "holder unknown: it is just starting"


def _parse(raw: bytes):
    """(record, None) or (None, why it is corrupt)."""
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"not JSON: {e}"
    if not isinstance(rec, dict):
        return None, "not a JSON object"
    for k, typ in _REQUIRED.items():
        if not isinstance(rec.get(k), typ):
            return None, f"field {k!r} missing or not a {typ.__name__}"
    if rec["format"] > FORMAT:
        return None, f"format {rec['format']} is newer than this onnxc's ({FORMAT})"
    if rec["winner"] not in WINNERS:
        return None, f"winner {rec['winner']!r} is not one of {WINNERS}"
    if rec["winner"] == "tuned" and not isinstance(rec.get("trace"), list):
        return None, "a tuned record without a trace"
    if not isinstance(rec["latency_us"].get("default"), (int, float)):
        return None, "no default latency"
    return rec, None


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems refuse fsync on directories
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def apply_record(func, record):
    """The kernel scheduled by replaying a tuned record's trace, or None for a record
    whose winner is the default.  Raises if the trace does not replay on ``func``."""
    import tvm
    from tvm import s_tir

    if record["winner"] != "tuned":
        return None
    sch = s_tir.Schedule(tvm.IRModule({"main": private_copy(func)}))
    s_tir.Trace.apply_json_to_schedule(record["trace"], sch)
    return sch.mod["main"]


def trace_to_json(trace) -> list:
    """A schedule trace as plain JSON (lists, strings, numbers), postprocessing included,
    as ``Trace.apply_json_to_schedule`` reads it back."""
    return json.loads(json.dumps(trace.as_json(remove_postproc=False), default=_ffi_plain))


def _ffi_plain(o):
    if hasattr(o, "items"):
        return {str(k): v for k, v in o.items()}
    if hasattr(o, "value"):  # IntImm / FloatImm / StringImm
        return o.value
    if hasattr(o, "__len__") and hasattr(o, "__getitem__"):
        return list(o)
    raise TypeError(f"{type(o).__name__} in a schedule trace has no JSON form")


def private_copy(func):
    """A deep copy of ``func`` named ``main``, safe to schedule.

    Scheduling a PrimFunc that was just made by ``with_attr`` (so uniquely referenced)
    but shares its body with another PrimFunc rewrites that other function in place
    (TVM 0.27: the copy-on-write check stops at the function node), which corrupted the
    kernel graph's unscheduled functions.  A JSON round trip shares nothing.
    """
    import tvm

    # the opts and ranges: compiler/lowering/symbolic.py.  The element-aligned parameters
    # stay: the build applies them to the tuned kernel too (lowering/input_alignment.py)
    for attr in ("global_symbol", "onnxc.dim_opt", "onnxc.dim_range"):
        if func.attrs is not None and attr in func.attrs:
            func = func.without_attr(attr)
    return tvm.ir.load_json(tvm.ir.save_json(func)).with_attr("global_symbol", "main")
