"""runtime.threads: sessions size TVM's thread pool to the compiled-for cores (TVM alone
would use half the logical CPUs: one thread on a 2-vCPU machine)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from runtime import threads

_PROBE = textwrap.dedent("""
    import os, sys, numpy as np
    from onnx import helper, TensorProto
    import compiler, runtime
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    want = int(sys.argv[1])
    cm = compiler.compile(m, target={"kind": "llvm", "num-cores": 2})
    s = cm.session(runtime.SessionOptions(intra_op_num_threads=want))
    s.run(None, {"x": np.ones((64, 64), "float32")})
    print(s.num_threads, os.environ.get("TVM_NUM_THREADS"), len(os.sched_getaffinity(0)))
""")


def _probe(want: int, env=None) -> list:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(want)], capture_output=True,
                         text=True, check=True, env=env).stdout.split()
    return out


def test_default_uses_the_compiled_for_cores_up_to_available():
    import os
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    n, env_value, _ = _probe(0, env)
    assert int(n) == min(2, threads.available_cpus())
    assert env_value == n


def test_intra_op_num_threads_one_does_not_pin_the_process():
    n, _, cpus_after = _probe(1)
    assert int(n) == 1
    # TVM pins the calling thread unless told not to: the process then saw one CPU, and
    # the next compile for "host" targeted one core
    assert int(cpus_after) == threads.available_cpus()


def test_user_env_is_respected_when_not_requested():
    import os
    n, env_value, _ = _probe(0, {**os.environ, "TVM_NUM_THREADS": "1"})
    assert int(n) == 1 and env_value == "1"
