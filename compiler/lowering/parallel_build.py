"""Build the kernels (``tvm.compile``) split over worker processes, so LLVM runs on every core.

``tvm.compile`` of the scheduled kernel module runs TVM's TIR lowering passes and LLVM's
optimiser on one core: 18.7 s of CPU for DenseNet-121's 134 kernels, more than every other
stage together.  The kernels are independent PrimFuncs (none calls another), so the module
splits into groups that build separately, each by the same pipeline for the same target:

* the groups balance an estimate of each kernel's build cost (the size of its IR,
  largest first onto the group with the least so far: LPT scheduling, a heuristic);
* group 0 builds here; every other group builds in a forked child, which writes its
  kernels as an object file (LLVM emits their machine code there, in parallel too);
* each object is imported into group 0's module as a static library:
  ``export_library`` links them all into the one ``.so``, and the in-memory session's
  ``Executable.jit()`` links the same objects (``tvm.runtime.executable``); the static
  library holds the object's bytes, so no file outlives the build.

A forked child rather than a spawned one: spawning pays TVM's import (2 s of CPU) per
build; the fork inherits it, and the child only compiles (it never launches kernels, so
the parent's thread pools are not needed there).  A child that fails names its error; one
killed by a signal is a ``CompileError`` naming the signal.

``ONNXC_BUILD_WORKERS`` (default: the CPU count, at most 2) sets the number of groups;
``ONNXC_BUILD_WORKERS=1`` builds the whole module here in one ``tvm.compile`` (the kill
switch).  Modules of fewer than :data:`MIN_KERNELS` kernels always build in one piece.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

ENV_WORKERS = "ONNXC_BUILD_WORKERS"
MAX_WORKERS = 2  # the build machines have 2 cores; more groups would only contend
MIN_KERNELS = 8  # below this a fork costs more than it saves
# group 0 also waits for its children to start; the children emit machine code, which the
# parent defers to export/jit: give them a little less
_CHILD_SHARE = 0.9


def build_workers() -> int:
    """How many groups to build in parallel (``ONNXC_BUILD_WORKERS``, else the CPU count up
    to :data:`MAX_WORKERS`)."""
    value = os.environ.get(ENV_WORKERS, "").strip()
    if value:
        try:
            return max(int(value), 1)
        except ValueError:
            raise ValueError(f"{ENV_WORKERS}={value!r} is not a whole number") from None
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def partition(mod, groups: int) -> list:
    """Split ``mod``'s PrimFuncs into at most ``groups`` lists of global vars with balanced
    build cost (LPT on the serialised IR size; group 0, built by the parent, takes a
    larger share).  Deterministic: ties break by kernel name."""
    import tvm

    items = sorted(((len(tvm.ir.save_json(f)), gv.name_hint, gv)
                    for gv, f in mod.functions.items()), key=lambda t: (-t[0], t[1]))
    loads = [0.0] * groups
    out: list = [[] for _ in range(groups)]
    for size, _, gv in items:
        k = min(range(groups), key=lambda g: (loads[g] / (1.0 if g == 0 else _CHILD_SHARE), g))
        loads[k] += size
        out[k].append(gv)
    return [g for g in out if g]


def build(mod, target, workers: int | None = None):
    """``tvm.compile(mod, target)``, its groups built in ``workers`` processes.

    Returns ``(executable, kernels per group)``: the same kind of object ``tvm.compile``
    returns, whose functions (``executable[name]``) and ``export_library`` cover every
    kernel.  Raises what ``tvm.compile`` raises, or RuntimeError for a child that died.
    """
    import tvm

    workers = build_workers() if workers is None else max(int(workers), 1)
    if workers < 2 or len(mod.functions) < MIN_KERNELS:
        return tvm.compile(mod, target=target), [len(mod.functions)]
    groups = [tvm.IRModule({gv: mod[gv] for gv in g}, attrs=mod.attrs)
              for g in partition(mod, workers)]
    tmp = tempfile.mkdtemp(prefix="onnxc-build-")
    try:
        children = [(_fork_build(g, target, os.path.join(tmp, f"group{i}.o")), g,
                     os.path.join(tmp, f"group{i}.o")) for i, g in enumerate(groups[1:], 1)]
        try:
            executable = tvm.compile(groups[0], target=target)
        except BaseException:
            for pid, _, _ in children:
                _kill(pid)
            raise
        failures = [msg for msg in (_wait(pid, obj) for pid, _, obj in children) if msg]
        if failures:
            raise RuntimeError(failures[0])
        for _, g, obj in children:
            # the static library holds the object's bytes (the file goes with tmp):
            # export_library and jit link them in
            names = [gv.name_hint for gv in g.functions]
            executable.mod.import_module(tvm.runtime.load_static_library(obj, names))
        return executable, [len(g.functions) for g in groups]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fork_build(group, target, obj_path: str) -> int:
    """Fork a child that builds ``group`` and writes its object to ``obj_path`` (its error
    message, if any, to ``obj_path + '.err'``)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: never returns into the parent's code, never runs its exit handlers
        import tvm

        tvm.compile(group, target=target).mod.write_to_file(obj_path)
        code = 0
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        try:
            with open(obj_path + ".err", "w", encoding="utf-8") as f:
                f.write(f"{type(e).__name__}: {lines[-1] if lines else 'no message'}")
        except OSError:
            pass
    finally:
        os._exit(code)


def _wait(pid: int, obj_path: str) -> str:
    """'' if the child built its object, else what went wrong."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"a build worker was killed by {signal.Signals(sig).name}"
    if os.WEXITSTATUS(status) != 0 or not os.path.exists(obj_path):
        try:
            with open(obj_path + ".err", encoding="utf-8") as f:
                return f.read()
        except OSError:
            return f"a build worker exited with status {os.WEXITSTATUS(status)}"
    return ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass

