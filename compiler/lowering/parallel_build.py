"""Schedule, build and emit the kernels split over worker processes, so they use every core.

``tvm.compile`` of the scheduled kernel module runs TVM's TIR lowering passes and LLVM's
optimiser on one core (18 s of CPU for DenseNet-121's 134 kernels, with 3 s of
scheduling before it), and LLVM emits the machine code only when the module is written
(``write_to_file``, which ``export_library`` and the in-memory session's ``jit`` call): 24 s
more, serially, at export.  The kernels are independent PrimFuncs (none calls another), so
the module splits into groups that are scheduled, built and emitted separately, each by the
same rules and pipeline for the same target:

* the groups balance an estimate of each kernel's cost (the size of its IR, largest
  first onto the least loaded group: LPT scheduling, a heuristic);
* group 0 is scheduled and built here; every other group in a forked child; each process
  emits its group's machine code as an object file right after building it;
* a *side* module (the checked kernel variants, ``compiler/lowering/checked.py``, built
  unscheduled at -O0 for a target of their own: 6 s of build and 12 s of emission for
  DenseNet) is built and emitted in one more forked child from the start;
* each object is loaded as a static library (which holds the object's bytes), group 0's as
  the root importing the others: ``export_library`` then only links the objects into the
  one ``.so`` (no LLVM code generation left), and the in-memory session's
  ``Executable.jit()`` links the same (``tvm.runtime.executable``).

A forked child rather than a spawned one: spawning pays TVM's import (2 s of CPU) per
build; the fork inherits it, and the child only schedules and compiles (it never launches
kernels, so the parent's thread pools are not needed there).  A child that fails names
its error; one killed by a signal is an error naming the signal.

``ONNXC_BUILD_WORKERS`` (default: the CPU count, at most 2) sets the number of groups;
``ONNXC_BUILD_WORKERS=1`` schedules and builds the whole module here in one piece (the side
module after it, by the caller) and leaves the code generation to export as before (the
kill switch).  Modules of fewer than :data:`MIN_KERNELS` kernels always build in one piece.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile

log = logging.getLogger("onnxc")

ENV_WORKERS = "ONNXC_BUILD_WORKERS"
MAX_WORKERS = 2  # the build machines have 2 cores; more groups would only contend
MIN_KERNELS = 8  # below this a fork costs more than it saves
# a child's load relative to group 0's: every group is scheduled, built and emitted alike
_CHILD_SHARE = 1.0


ENV_ASSERTS = "ONNXC_KERNEL_ASSERTS"


def kernel_asserts() -> bool:
    """Whether kernels keep TVM's argument checks (``ONNXC_KERNEL_ASSERTS=1``)."""
    return os.environ.get(ENV_ASSERTS, "").strip() not in ("", "0")


def compile_kernels(mod, target):
    """``tvm.compile(mod, target)`` of kernels, by default without TVM's argument checks.

    TVM wraps every kernel in a packed-function entry that checks each argument (type,
    rank, dtype, every dim, strides, device, alignment) and keeps an error message per
    check: three quarters of a small kernel's code, and of its build (DenseNet-121's BN +
    ReLU kernels: 1.67 -> 0.69 CPU s per 20, its convs 3.25 -> 1.85).  onnxc's runtime
    makes every call from the planned graph and checks the feeds itself (dtype, shape,
    symbolic ranges, index bounds), so the checks never fire there; ``ONNXC_KERNEL_ASSERTS=1``
    keeps them (to chase a suspected runtime bug).
    """
    import tvm

    from .assume_dim_ranges import assume_dim_ranges
    from .input_alignment import relax

    mod = relax(mod)
    current = tvm.transform.PassContext.current()
    config = {**dict(current.config), "tirx.disable_assert": not kernel_asserts()}

    def build(m):
        with tvm.transform.PassContext(opt_level=current.opt_level, config=config,
                                       required_pass=list(current.required_pass),
                                       disabled_pass=list(current.disabled_pass),
                                       instruments=list(current.instruments)):
            return tvm.compile(m, target=target)

    stated = assume_dim_ranges(mod)
    if stated is mod:
        return build(mod)
    try:
        return build(stated)
    except Exception as e:  # noqa: BLE001 - TVM's analysis with the ranges known, not ours
        # the ranges only speed up the lowering: build as before rather than fail
        log.info("kernels built again without their dims' ranges (TVM failed with them: %s)",
                 str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
        return build(assume_dim_ranges(mod, state=False))


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
    cost (LPT on the serialised IR size; group 0, built by the parent, takes the larger
    share).  Deterministic: ties break by kernel name."""
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


class Plan:
    """Groups 1.. of a module (and a side module) being prepared and built in forked children.

    ``local`` is group 0, for this process to prepare; :meth:`finish` builds it, waits
    for the children and returns everything as one executable.  Use it as a context
    manager: leaving the block by an exception kills the children.
    """

    def __init__(self, local, target, children=(), tmp=None, groups=(), side=None):
        self.local, self.target = local, target
        self._children, self._tmp = list(children), tmp  # (pid, object path, label)
        self.groups = list(groups) or [len(local.functions)]
        # the side module when no child builds it: (module, target, label) for the caller
        self.side = side
        self.worker_cpu = 0.0  # CPU seconds the children used, once finished
        self._local_built = None  # group 0's executable, once build_local() ran

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.abort()
        return False

    def build_local(self, prepared_local) -> None:
        """Build group 0 here (``prepared_local``: it as prepared); with forked children,
        also emit its object.  The children keep building meanwhile: what this process
        does between this and :meth:`finish` (the memory plan) overlaps them."""
        import tvm

        try:
            executable = compile_kernels(prepared_local, self.target)
            if self._children:  # emit here while the children finish theirs
                obj = os.path.join(self._tmp, "group0.o")
                executable.mod.write_to_file(obj)
                executable = tvm.runtime.Executable(tvm.runtime.load_static_library(
                    obj, [gv.name_hint for gv in prepared_local.functions]))
        except BaseException:
            self.abort()
            raise
        self._local_built = executable

    def finish(self, prepared_local=None):
        """``(executable, info from the children's prepare, kernels per group)``.

        Builds group 0 first unless :meth:`build_local` did.  Forked children: group 0 is
        emitted here too, and every object becomes a static library, group 0's the root,
        the side module's imported.  One piece: the built module as ``tvm.compile``
        returns it (emitted at export), and :attr:`side` left to the caller."""
        import tvm

        try:
            if self._local_built is None:
                if prepared_local is None:
                    raise ValueError("finish() needs the prepared group 0 when build_local() "
                                     "did not build it")
                self.build_local(prepared_local)
            executable, self._local_built = self._local_built, None
            before = _children_cpu()
            failures = [f"{label}: {msg}" if label else msg
                        for msg, label in ((_wait(pid, obj), label)
                                           for pid, obj, label in self._children) if msg]
            self.worker_cpu = round(_children_cpu() - before, 3)
            objects = [obj for _, obj, _ in self._children]
            self._children = []
            if failures:
                raise RuntimeError(failures[0])
            info: dict = {}
            for obj in objects:
                with open(obj + ".json", encoding="utf-8") as f:
                    part = json.load(f)
                info.update(part["info"])
                for name, level, message in part["logs"]:
                    logging.getLogger(name).log(level, "%s", message)
                # the static library holds the object's bytes (the file goes with tmp):
                # export_library and jit link them in
                executable.mod.import_module(
                    tvm.runtime.load_static_library(obj, part["symbols"]))
            return executable, info, self.groups
        finally:
            self.abort()

    def abort(self):
        for pid, _, _ in self._children:
            _kill(pid)
        self._children = []
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def start(mod, target, prepare=None, workers: int | None = None, side=None) -> Plan:
    """Split ``mod`` and fork a child per group but the first: each runs
    ``prepare(group) -> (module, info dict)`` (None: the group as it is, no info), builds
    the module and writes its object.  ``side`` (``(module, target, label)``, or None): one
    more module built, for a target of its own, in a child of its own (left in the plan's
    :attr:`Plan.side` when the build stays in one piece); ``label`` names it in errors.  Returns the :class:`Plan`
    holding group 0."""
    workers = build_workers() if workers is None else max(int(workers), 1)
    if side is not None and not side[0].functions:
        side = None
    if workers < 2 or len(mod.functions) < MIN_KERNELS:
        return Plan(mod, target, side=side)
    import tvm

    groups = [tvm.IRModule({gv: mod[gv] for gv in g}, attrs=mod.attrs)
              for g in partition(mod, workers)]
    tmp = tempfile.mkdtemp(prefix="onnxc-build-")
    children = []
    try:
        for k, g in enumerate(groups[1:], 1):
            obj = os.path.join(tmp, f"group{k}.o")
            children.append((_fork_build(g, target, prepare, obj), obj, ""))
        if side is not None:
            obj = os.path.join(tmp, "side.o")
            children.append((_fork_build(side[0], side[1], None, obj), obj, side[2]))
    except BaseException:
        Plan(groups[0], target, children, tmp).abort()
        raise
    return Plan(groups[0], target, children, tmp, [len(g.functions) for g in groups])


def build(mod, target, workers: int | None = None, side=None):
    """``tvm.compile(mod, target)`` with its groups built in ``workers`` processes.

    Returns ``(executable, kernels per group)``: the kind of object ``tvm.compile``
    returns, whose functions (``executable[name]``) and ``export_library`` cover every
    kernel (and ``side``'s: see :func:`start`).  Raises what ``tvm.compile`` raises, or
    RuntimeError for a child that failed or died.
    """
    import tvm

    with start(mod, target, workers=workers, side=side) as plan:
        executable, _, groups = plan.finish(plan.local)
    if plan.side is not None:
        executable.mod.import_module(compile_kernels(plan.side[0], plan.side[1]).mod)
    return executable, groups


def _fork_build(group, target, prepare, obj_path: str) -> int:
    """Fork a child that prepares and builds ``group``, writing its object to ``obj_path``
    and its symbols and ``prepare``'s info to ``obj_path + '.json'`` (an error message to
    ``obj_path + '.err'``)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: never returns into the parent's code, never runs its exit handlers
        import tvm

        logs = _collect_logs()
        mod, info = prepare(group) if prepare is not None else (group, {})
        compile_kernels(mod, target).mod.write_to_file(obj_path)
        with open(obj_path + ".json", "w", encoding="utf-8") as f:
            json.dump({"symbols": [gv.name_hint for gv in mod.functions], "info": info,
                       "logs": logs}, f)
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


def _collect_logs() -> list:
    """In a child: keep its log records (name, level, message) for the parent to emit,
    instead of writing them through handlers it shares with the parent (a pipe to the
    compile's parent process, a file)."""
    records: list = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.levelno, record.getMessage()))

    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            logger.handlers = []
    logging.root.handlers = [Collect()]
    return records


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


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # children waited for so far
    return usage.ru_utime + usage.ru_stime


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass

