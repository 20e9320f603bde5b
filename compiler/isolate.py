"""Run a function in a child process, so that a crash inside TVM/LLVM becomes an error, not a core dump.

TVM's C++ passes and LLVM are not hardened against every input (docs/security.md): a
segfault or abort there would kill the process that compiles.  ``onnxc compile`` (and
``compiler.compile(..., isolate=True)``, ``compiler/api.py``) therefore run the whole
compilation, up to writing the artifact, through :func:`run_in_child`: a fresh child
process (``multiprocessing`` "spawn": nothing of the parent's threads or TVM state is
inherited), waited for.  It knows nothing of what the function compiles:

* the child's result comes back through a pipe: the report, and the artifact it wrote;
* an exception raised in the child (``CompileError``, ``UnsupportedError``, ``ValueError``,
  ...) is pickled and raised again in the parent with the same type and message (the
  child's traceback is attached as its ``__cause__``).  Only our own child's exceptions are
  unpickled; artifacts never are;
* a child killed by a signal raises :class:`CompileCrashError` naming the model, the signal
  and the compile stage that was running (the driver logs each stage it enters to the
  ``onnxc.stage`` logger, which the child forwards), with the innermost Python frames of
  the crash (``faulthandler``);
* with ``timeout``, a child still running after that many seconds is killed (with its own
  children: it leads a process group) and :class:`CompileTimeoutError` names the stage.

No core file is written (the child sets ``RLIMIT_CORE`` to 0), and the child dies with the
parent (``PR_SET_PDEATHSIG``).  Custom operators registered in the parent
(``compiler.registry.register_op``) are sent to the child: a converter that pickles (a
module-level function) is sent by reference, otherwise the module that registered it is
imported there.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import tempfile
import time
import traceback

from .errors import CompileCrashError, CompileError, CompileTimeoutError

STAGE_LOGGER = "onnxc.stage"  # driver._Stages logs "stage <name>" here (DEBUG) as it enters one


class RemoteTraceback(Exception):
    """The child's traceback, attached as ``__cause__`` of an error raised again here."""

    def __str__(self):
        return self.args[0]


def run_in_child(fn, args: tuple, *, where: str, timeout=None, partial_output=None):
    """Run ``fn(*args)`` in a spawned child; return its result or raise (see module doc).

    ``fn`` and ``args`` must pickle.  ``partial_output``: the artifact path the child
    writes, whose temporary file (``.<name>.<child pid>.tmp.so``) is removed if it dies.
    """
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    ctx = mp.get_context("spawn")
    crash_dir = tempfile.mkdtemp(prefix="onnxc-child-")
    crash_file = os.path.join(crash_dir, "faulthandler.txt")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    setup = {"log_level": logging.getLogger().getEffectiveLevel(), "log_format": _log_format(),
             "crash_file": crash_file, "registrations": _custom_registrations()}
    proc = ctx.Process(target=_child_main, args=(child_conn, setup, fn, args),
                       name="onnxc-compile", daemon=False)
    stage, result = None, None
    try:
        proc.start()
        child_conn.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        while result is None:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait([parent_conn, proc.sentinel], timeout=wait)
            if not ready:  # timed out
                _kill_group(proc)
                raise CompileTimeoutError(
                    f"{where}: compilation did not finish within {timeout:g} s"
                    + (f" (stage {stage!r} was running)" if stage else "")
                    + "; the compile process was killed. Allow more time (--timeout), or "
                      "compile in-process (--no-isolate) to attach a debugger", stage)
            # drain what the child sent before looking at whether it died
            while parent_conn.poll():
                try:
                    msg = parent_conn.recv()
                except (EOFError, OSError):
                    break
                if msg[0] == "stage":
                    stage = msg[1]
                else:
                    result = msg
                    break
            if result is None and not proc.is_alive():
                proc.join()
                raise _died(proc.exitcode, where, stage, crash_file)
        proc.join(timeout=30)
        if proc.is_alive():  # finished its work but hangs on the way out
            _kill_group(proc)
    except BaseException:
        if proc.is_alive():
            _kill_group(proc)
        if partial_output and proc.pid:
            _remove_partial(partial_output, proc.pid)
        raise
    finally:
        parent_conn.close()
        shutil.rmtree(crash_dir, ignore_errors=True)
    if result[0] == "ok":
        return result[1]
    raise _rebuild_error(result[1])


def _died(code, where, stage, crash_file) -> CompileError:
    try:
        with open(crash_file, errors="replace") as f:
            dump = f.read()
    except OSError:
        dump = ""
    frames = [ln.strip() for ln in dump.splitlines() if ln.strip().startswith("File ")]
    at = ("\n  innermost Python frames of the crashed process:\n    "
          + "\n    ".join(frames[:4])) if frames else ""
    during = f" during stage {stage!r}" if stage else ""
    if code is not None and code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        what = signal.strsignal(-code) or sig
        return CompileCrashError(
            f"{where}: the compiler crashed with {sig} ({what}){during}. Compilation ran in a "
            f"child process, so only that process died and no artifact was written. This is "
            f"a bug in TVM, onnxc or a custom operator converter; --no-isolate (Python: "
            f"isolate=False) compiles in-process for a debugger.{at}", sig, stage, dump)
    return CompileCrashError(
        f"{where}: the compile process exited with status {code}{during} without a result "
        f"(its own error output, above, says why); no artifact was written.{at}", None, stage,
        dump)


def _rebuild_error(payload: dict) -> BaseException:
    """The child's exception, unpickled; a CompileError with its text if that fails."""
    err = None
    if payload.get("pickled") is not None:
        try:
            err = pickle.loads(payload["pickled"])
        except Exception:  # its class does not unpickle here: keep type name and message
            err = None
    if not isinstance(err, BaseException):
        err = CompileError(f"{payload['type']}: {payload['message']}")
    err.__cause__ = RemoteTraceback(f"\n(in the compile process)\n{payload['traceback']}")
    return err


def _kill_group(proc) -> None:
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    proc.join(timeout=30)


def _remove_partial(output: str, pid: int) -> None:
    path = os.path.abspath(output)
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{pid}.tmp.so")
    try:
        os.unlink(partial)
    except OSError:
        pass


def _log_format():
    for h in logging.getLogger().handlers:
        if h.formatter is not None:
            return h.formatter._fmt
    return "%(name)s: %(message)s"


def _custom_registrations() -> list:
    """Custom operator entries of the registry, as the child can repeat them: the pickled
    entry (module-level converters pickle by reference), else the module to import.  One
    the child cannot repeat matters only to models that use it (see _explain_missing)."""
    from .frontend.registry import REGISTRY

    out = []
    for versions in REGISTRY.entries.values():
        for e in versions:
            if not e.implementation.startswith("custom"):
                continue
            try:  # what it replaces is the child's own entry, not this process's
                blob = pickle.dumps(dataclasses.replace(e, replaces=None))
            except Exception:  # a closure (register_te_op): its module registers it
                blob = None
            out.append({"key": (e.domain, e.op_type, e.since, e.until), "entry": blob,
                        "override": e.replaces is not None,
                        "module": getattr(e.converter, "__module__", None)})
    return out


def _apply_registrations(regs: list) -> None:
    from .frontend.registry import REGISTRY

    def present(key):
        return any((e.domain, e.op_type, e.since, e.until) == key
                   for e in REGISTRY.versions(key[0], key[1]))

    missing = []
    for r in regs:
        if r["entry"] is not None:
            try:
                entry = pickle.loads(r["entry"])
            except Exception:
                entry = None
            # unpickling a converter imports its module, which may register it already
            if entry is not None and not present(r["key"]):
                REGISTRY.add(entry, override=r["override"])
            if entry is not None:
                continue
        if not present(r["key"]) and r["module"] and r["module"] != "__main__":
            try:
                __import__(r["module"])
            except Exception:
                pass
        if not present(r["key"]):
            missing.append(f"{r['key'][0]}:{r['key'][1]}")
    return missing


def _explain_missing(e: BaseException, missing: list):
    """An error about an op this process could not register: say why (else None)."""
    hit = [m for m in missing if m.split(":", 1)[1] in str(e)]
    if not hit or not isinstance(e, CompileError):
        return None
    return CompileError(
        f"custom operator(s) {', '.join(hit)} cannot be registered in the compile process: "
        f"define the converter at module level of an importable module (or register it when "
        f"that module is imported), or compile in-process (--no-isolate / isolate=False). "
        f"The compile process said: {e}")


def _child_main(conn, setup: dict, fn, args) -> None:
    import faulthandler
    import resource

    try:
        os.setpgid(0, 0)  # a group of our own: a timeout kills our cc/linker children too
    except OSError:
        pass
    _die_with_parent()
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file
    except (ValueError, OSError):
        pass
    crash = open(setup["crash_file"], "w")
    faulthandler.enable(file=crash, all_threads=False)
    logging.basicConfig(level=setup["log_level"], format=setup["log_format"])

    class ToParent(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if msg.startswith("stage "):
                conn.send(("stage", msg[len("stage "):]))

    stage_log = logging.getLogger(STAGE_LOGGER)
    stage_log.addHandler(ToParent())
    stage_log.setLevel(logging.DEBUG)
    stage_log.propagate = False
    missing = []
    try:
        stage_log.debug("stage start")
        import compiler  # noqa: F401  (converters register at import)

        missing = _apply_registrations(setup["registrations"])
        result = ("ok", fn(*args))
    except BaseException as e:  # noqa: BLE001 -- everything goes back to the parent
        e = _explain_missing(e, missing) or e
        try:
            blob = pickle.dumps(e)
            pickle.loads(blob)
        except Exception:
            blob = None
        result = _error_payload(e, blob)
    try:
        conn.send(result)
    except Exception as e:  # the result itself does not pickle
        conn.send(_error_payload(CompileError(f"the compile process's result cannot be sent "
                                              f"back: {e}"), None))
    conn.close()


def _error_payload(e: BaseException, blob) -> tuple:
    return ("error", {"pickled": blob, "type": f"{type(e).__module__}.{type(e).__name__}",
                      "message": str(e), "traceback": traceback.format_exc()})


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the parent dies (no orphaned compiles)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
