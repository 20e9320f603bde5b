"""parallel_build: kernels built in groups over worker processes, one artifact."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import compiler
import runtime
from compiler.lowering import parallel_build
from tests.conftest import zoo, zoo_model


def _kernel_symbols(path) -> set:
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                         text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    # __tvm_ffi__library_bin / _ctx: TVM's own; *__checked: the NaN-check variants
    # (compiler/lowering/checked.py), built apart at -O0
    return {n for n in names if n.startswith("__tvm_ffi_") and not n.startswith("__tvm_ffi__")
            and not n.endswith("__checked")}


def _compile(name, monkeypatch, workers: str):
    monkeypatch.setenv(parallel_build.ENV_WORKERS, workers)
    return compiler.compile(zoo_model(name), target="host")


def test_parallel_build_equals_serial(monkeypatch, tmp_path):
    """cnn (10 kernels) in two processes: same kernel symbols, bit-identical outputs, in
    memory and from the exported artifact."""
    serial = _compile("cnn", monkeypatch, "1")
    parallel = _compile("cnn", monkeypatch, "2")
    n = serial.report["distinct_kernels"]
    assert n >= parallel_build.MIN_KERNELS
    assert serial.report["build_groups"] == [n]
    assert len(parallel.report["build_groups"]) == 2 and sum(parallel.report["build_groups"]) == n
    paths = [tmp_path / "serial.so", tmp_path / "parallel.so"]
    serial.export(str(paths[0]))
    parallel.export(str(paths[1]))
    assert _kernel_symbols(paths[0]) == _kernel_symbols(paths[1])
    assert len(_kernel_symbols(paths[0])) == n
    feeds = zoo.random_inputs(zoo_model("cnn"), seed=4)
    want = serial.session().run(None, feeds)
    for got in (parallel.session().run(None, feeds), runtime.load(str(paths[1])).run(None, feeds)):
        assert all(np.array_equal(a, b) for a, b in zip(want, got))


def _tree(module) -> list:
    return [module] + [m for child in module.imports for m in _tree(child)]


def test_parallel_build_leaves_export_only_linking(monkeypatch, tmp_path):
    """Every group and the checked variants are emitted where they are built: the kernels'
    import tree holds only static libraries (objects), so export and the in-memory session
    link them and run no LLVM code generation; the artifact carries every kernel and every
    checked variant (which still run)."""
    cm = _compile("cnn", monkeypatch, "2")
    assert cm.report["checked_kernels"] > 0 and "build_checked" not in cm.report["stages"]
    kinds = [m.kind for m in _tree(cm._kernels.mod)]
    assert kinds == ["static_library"] * 3  # group 0 (the root), group 1, the checked variants
    path = tmp_path / "m.so"
    cm.export(str(path))
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                         text=True, check=True).stdout
    checked = {ln.split()[-1] for ln in out.splitlines() if ln.endswith("__checked")}
    assert len(checked) == cm.report["checked_kernels"]
    sess = runtime.load(str(path))
    feeds = zoo.random_inputs(zoo_model("cnn"), seed=4)
    want = cm.session().run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(want, sess.run(None, feeds)))


def test_side_module_failure_names_it():
    """The side module (the checked variants) fails in its own child: the error names it."""
    import tvm

    ok, bad = _ok_and_bad_kernels()

    mod = tvm.IRModule({f"ok{k}": ok.with_attr("global_symbol", f"ok{k}") for k in range(8)})
    side = tvm.IRModule({"bad": bad.with_attr("global_symbol", "bad")})
    with pytest.raises(RuntimeError, match="^the side kernels: "):
        parallel_build.build(mod, {"kind": "llvm"}, workers=2,
                             side=(side, {"kind": "llvm"}, "the side kernels"))


def test_work_between_build_local_and_finish_overlaps_the_workers():
    """build_local() builds group 0 and returns while the worker still builds its group:
    what runs before finish() (the memory plan) overlaps it; finish() then collects every
    kernel.  finish() without build_local() and without group 0 is refused."""
    import tvm

    ok, _ = _ok_and_bad_kernels()
    mod = tvm.IRModule({f"ok{k}": ok.with_attr("global_symbol", f"ok{k}") for k in range(8)})
    with parallel_build.start(mod, {"kind": "llvm"}, workers=2) as plan:
        plan.build_local(plan.local)
        assert plan._children, "the worker is still to be collected after build_local()"
        executable, _, groups = plan.finish()
    assert sum(groups) == 8 and len(groups) == 2
    a = tvm.runtime.tensor(np.arange(4, dtype="float32"))
    for k in range(8):
        b = tvm.runtime.tensor(np.zeros(4, dtype="float32"))
        executable[f"ok{k}"](a, b)
        assert np.array_equal(b.numpy(), np.arange(4, dtype="float32") + 1)
    with parallel_build.start(mod, {"kind": "llvm"}, workers=2) as plan:
        with pytest.raises(ValueError, match="build_local"):
            plan.finish()
        assert not plan._children  # the workers were killed, none left behind


def test_compile_plans_memory_after_the_workers_report_their_rules(monkeypatch):
    """The driver's stages: this process's group ("build"), the wait for the workers
    ("build_wait"), then the memory plan, which reads every kernel's rule (a softmax runs
    in place only under cpu.row_reduction)."""
    cm = _compile("cnn", monkeypatch, "2")
    stages = list(cm.report["stages"])
    assert stages.index("schedule") < stages.index("build") < stages.index("build_wait") \
        < stages.index("plan_memory")


def test_small_module_builds_in_one_piece(monkeypatch):
    """dwsep has fewer kernels than MIN_KERNELS: no worker even when two are allowed."""
    cm = _compile("dwsep", monkeypatch, "2")
    assert cm.report["distinct_kernels"] < parallel_build.MIN_KERNELS
    assert cm.report["build_groups"] == [cm.report["distinct_kernels"]]


def test_partition_covers_every_kernel_once_and_is_deterministic():
    from compiler.driver import schedule_kernels

    mod, _, _ = schedule_kernels(zoo_model("cnn"), "host")
    groups = parallel_build.partition(mod, 2)
    names = [gv.name_hint for g in groups for gv in g]
    assert sorted(names) == sorted(gv.name_hint for gv in mod.functions)
    assert len(groups) == 2 and all(groups)
    assert [[gv.name_hint for gv in g] for g in parallel_build.partition(mod, 2)] == \
        [[gv.name_hint for gv in g] for g in groups]
    assert len(parallel_build.partition(mod, 1)) == 1


def test_worker_failure_is_an_error_naming_it():
    """A kernel LLVM cannot build (a GPU thread binding on a CPU target) fails the build
    whichever process it lands in, with TVM's message, never a hang or a partial module."""
    import tvm

    ok, bad = _ok_and_bad_kernels()

    funcs = {f"ok{k}": ok.with_attr("global_symbol", f"ok{k}") for k in range(8)}
    funcs["bad"] = bad.with_attr("global_symbol", "bad")
    mod = tvm.IRModule(funcs)
    with pytest.raises(Exception) as info:
        parallel_build.build(mod, {"kind": "llvm"}, workers=2)
    assert str(info.value).strip()


def test_bad_worker_count_is_refused(monkeypatch):
    monkeypatch.setenv(parallel_build.ENV_WORKERS, "two")
    with pytest.raises(ValueError, match="ONNXC_BUILD_WORKERS"):
        parallel_build.build_workers()


def _ok_and_bad_kernels():
    """A kernel LLVM builds, and one it cannot (a GPU thread binding on a CPU target)."""
    from tvm.script import tirx as T

    @T.prim_func
    def ok(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i] + T.float32(1)

    @T.prim_func
    def bad(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in T.thread_binding(4, thread="threadIdx.x"):
            b[i] = a[i]

    return ok, bad


@pytest.mark.parametrize("workers", ["1", "2"])
def test_kernels_built_without_argument_checks_unless_asked(monkeypatch, tmp_path, workers):
    """TVM's per-argument checks (and their error strings) are left out of the kernels by
    default, in this process and in the build workers; ONNXC_KERNEL_ASSERTS=1 keeps them.
    Same outputs either way."""
    def build(asserts):
        if asserts:
            monkeypatch.setenv(parallel_build.ENV_ASSERTS, "1")
        else:
            monkeypatch.delenv(parallel_build.ENV_ASSERTS, raising=False)
        cm = _compile("cnn", monkeypatch, workers)
        path = tmp_path / f"cnn_{asserts}.so"
        cm.export(str(path))
        return path, runtime.load(str(path))

    def checks(path) -> int:  # TVM's argument-check messages in the library's strings
        out = subprocess.run(["strings", str(path)], capture_output=True, text=True,
                             check=True).stdout
        return sum("on argument #" in line for line in out.splitlines())

    plain, sp = build(False)
    checked, sc = build(True)
    assert checks(checked) > 0
    assert checks(plain) == 0
    assert plain.stat().st_size < checked.stat().st_size
    x = np.random.default_rng(0).standard_normal(
        tuple(sp.get_inputs()[0].shape)).astype(np.float32)
    name = sp.get_inputs()[0].name
    np.testing.assert_array_equal(sp.run(None, {name: x})[0], sc.run(None, {name: x})[0])
