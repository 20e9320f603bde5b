"""onnxc's parallel launcher (runtime/parallel.py, runtime/native/parallel_launch.c).

Every kernel with a parallel loop runs through it once an artifact is loaded: the results
must equal onnxruntime's at any thread count, from concurrent Python threads (the busy pool
falls back to TVM's), in a forked child, and with the kill switch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import compiler
import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model() -> onnx.ModelProto:
    """Conv -> Relu -> MatMul: parallel loops of several extents (channels, rows, 1 x N)."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [24, 3, 3, 3],
                           rng.standard_normal(24 * 27).astype(np.float32))
    m = helper.make_tensor("m", TensorProto.FLOAT, [37, 19],
                           rng.standard_normal(37 * 19).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "m"], ["y"], name="matmul")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 3, 29, 37])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [1, 24, 29, 19])], [w, m])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("parallel") / "model.so")
    model = _model()
    compiler.compile(model, target="host").export(path)
    x = np.random.default_rng(1).standard_normal((1, 3, 29, 37)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return path, x, expected


def test_artifact_carries_the_launcher_and_load_installs_it(artifact):
    path, x, expected = artifact
    sess = runtime.load(path)
    assert runtime.parallel.status[path] == "onnxc"
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_results_equal_onnxruntime_at_any_thread_count(artifact, threads):
    # 7 threads on a 2-CPU host is capped to the CPUs (runtime/threads.py); 3 and 7 chunk
    # the loops into extents that do not divide them
    path, x, expected = artifact
    sess = runtime.load(path, runtime.SessionOptions(intra_op_num_threads=threads))
    for _ in range(20):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-4, atol=1e-4)


def test_concurrent_callers_fall_back_without_wrong_results(artifact):
    # two Python threads in kernels at once: one gets the pool, the other TVM's launcher
    path, x, expected = artifact
    sessions = [runtime.load(path) for _ in range(2)]
    errors = []

    def work(sess):
        try:
            for _ in range(30):
                np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected,
                                           rtol=1e-4, atol=1e-4)
        except Exception as e:  # reported below, in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def _child(code: str, env: dict | None = None, cwd: str = ROOT) -> str:
    env = {**os.environ, **(env or {})}
    if cwd != ROOT:  # the project still importable from another working directory
        env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, text=True,
                       capture_output=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_forked_child_runs_after_the_parent_used_the_pool(artifact):
    path, x, expected = artifact
    np.save(os.path.join(os.path.dirname(path), "x.npy"), x)
    np.save(os.path.join(os.path.dirname(path), "y.npy"), expected)
    out = _child(f"""
        import os, numpy as np, runtime
        d = {os.path.dirname(path)!r}
        x, y = np.load(d + "/x.npy"), np.load(d + "/y.npy")
        s = runtime.load({path!r})
        s.run(None, {{"x": x}})
        pid = os.fork()
        if pid == 0:
            ok = np.allclose(s.run(None, {{"x": x}})[0], y, rtol=1e-4, atol=1e-4)
            os._exit(0 if ok else 3)
        print("child", os.waitpid(pid, 0)[1] >> 8)
    """)
    assert "child 0" in out


def test_artifact_loaded_by_a_relative_name_gets_the_launcher(artifact):
    # `onnxc run model.so`, scripts/ab_artifacts.py a.so b.so: a name without a slash
    path, x, expected = artifact
    name = os.path.basename(path)
    np.save(path + ".x.npy", x)
    np.save(path + ".y.npy", expected)
    out = _child(f"""
        import numpy as np, runtime
        s = runtime.load({name!r}, runtime.SessionOptions(intra_op_num_threads=2))
        y = s.run(None, {{"x": np.load({path + '.x.npy'!r})}})[0]
        print(runtime.parallel.status[{name!r}],
              float(np.abs(y - np.load({path + '.y.npy'!r})).max()))
    """, cwd=os.path.dirname(path))
    status, diff = out.split()
    assert status == "onnxc" and float(diff) < 1e-3


def test_kill_switch_keeps_tvm_pool(artifact):
    path, x, expected = artifact
    out = _child(f"""
        import numpy as np, runtime
        s = runtime.load({path!r})
        print(runtime.parallel.status[{path!r}])
    """, env={"ONNXC_PARALLEL": "tvm"})
    assert out.strip() == "tvm (ONNXC_PARALLEL=tvm)"


def test_library_without_the_launcher_stays_on_tvm_pool(tmp_path):
    # a kernel library linked without onnxc's object (an artifact from before the launcher)
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def add(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in T.parallel(64):
            b[i] = a[i] + T.float32(1)

    lib = str(tmp_path / "old.so")
    tvm.compile(tvm.IRModule({"add": add}), target="llvm").export_library(lib)
    out = _child(f"""
        import tvm, runtime
        tvm.runtime.load_module({lib!r})
        print(runtime.parallel.install({lib!r}))
    """)
    assert out.strip() == "tvm (artifact built without onnxc's launcher)"


def test_recompiled_artifact_at_the_same_path_loads_the_new_kernels(tmp_path):
    # dlopen hands back the library already loaded under a name; runtime.load must not run
    # a new graph against the old file's kernels
    path = str(tmp_path / "same.so")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for op, want in (("Relu", np.maximum(x, 0)), ("Sigmoid", 1 / (1 + np.exp(-x))),
                     ("Relu", np.maximum(x, 0))):
        g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        compiler.compile(model, target="host").export(path)
        got = runtime.load(path).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_barrier_check_reads_relocations_not_definitions(artifact, tmp_path):
    # the NaN-check variants are built at -O0, which keeps an unused
    # __TVMBackendParallelBarrier definition: only a relocation means a kernel calls it
    path, _, _ = artifact
    names = runtime.parallel._relocated_symbols(path)
    assert "__TVMBackendParallelLaunch" in names
    assert "__TVMBackendParallelBarrier" not in names
    not_elf = tmp_path / "x.so"
    not_elf.write_bytes(b"not an ELF file")
    assert runtime.parallel._relocated_symbols(str(not_elf)) == set()
