"""Profiling (Chrome trace) and NaN/Inf checks of the graph runtime."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
import runtime
from tests.conftest import compiled, zoo, zoo_model


def _log_model():
    """y = Log(x - 1) * 2: a negative x - 1 gives NaN in the Log."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    g = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["s"], name="shift"),
         helper.make_node("Softmax", ["s"], ["p"], name="softmax_block", axis=-1),
         helper.make_node("Log", ["s"], ["l"], name="the_log"),
         helper.make_node("Mul", ["l", "two"], ["y"], name="scale")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 4])], [one, two])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_check_nan_names_the_kernel_and_tensor():
    sess = compiler.compile(_log_model()).session(runtime.SessionOptions(check_nan=True))
    x = np.full((2, 4), 3.0, np.float32)
    sess.run(None, {"x": x})  # all finite: no error
    x[1, 2] = 0.5
    with pytest.raises(runtime.NonFiniteError) as e:
        sess.run(None, {"x": x})
    msg = str(e.value)
    assert "log" in msg and "1 NaN and 0 Inf" in msg and "shape [2, 4]" in msg
    assert "inputs were all finite" in msg


def test_check_nan_says_when_inputs_already_had_nan():
    sess = compiler.compile(_log_model()).session(runtime.SessionOptions(check_nan=True))
    x = np.full((2, 4), 3.0, np.float32)
    x[0, 0] = np.nan
    with pytest.raises(runtime.NonFiniteError, match="inputs already had some"):
        sess.run(None, {"x": x})


def test_without_check_nan_runs_through():
    sess = compiler.compile(_log_model()).session()
    y, _ = sess.run(None, {"x": np.full((2, 4), 0.5, np.float32)})
    assert np.isnan(y).all()


def test_profile_trace_has_one_event_per_kernel_call(tmp_path):
    cm = compiled("cnn")
    opts = runtime.SessionOptions(enable_profiling=True,
                                  profile_file_prefix=str(tmp_path / "prof"))
    sess = cm.session(opts)
    feeds = zoo.random_inputs(zoo_model("cnn"))
    for _ in range(3):
        sess.run(None, feeds)
    path = sess.end_profiling()
    trace = json.loads(open(path).read())
    events = trace["traceEvents"]
    assert len(events) == 3 * cm.report["kernels"]
    kernels = [c["kernel"] for c in cm.meta["graph"]["calls"]]
    assert [e["name"] for e in events[:len(kernels)]] == kernels
    e = events[0]
    assert e["ph"] == "X" and e["dur"] >= 0 and e["args"]["outputs"]
    assert any(ev["args"]["flops"] > 0 and ev["args"]["gflops_per_s"] > 0 for ev in events)
    summary = sess.profile_summary()
    assert "share" in summary and f"{len(events)} kernel calls" in summary


def test_end_profiling_when_off_is_an_error():
    with pytest.raises(RuntimeError, match="profiling is off"):
        compiled("mlp").session().end_profiling()


def test_cli_check_nan_exit_1(tmp_path):
    import subprocess
    import sys

    import onnx

    onnx.save(_log_model(), tmp_path / "m.onnx")
    assert subprocess.run([sys.executable, "-m", "compiler.cli", "compile", tmp_path / "m.onnx",
                           "-o", tmp_path / "m.so"]).returncode == 0
    np.save(tmp_path / "x.npy", np.full((2, 4), -1.0, np.float32))
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "run", tmp_path / "m.so",
                        "--input", f"x={tmp_path / 'x.npy'}", "--check-nan"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "NaN" in r.stderr and "Traceback" not in r.stderr


def test_nominal_peak_from_cpuinfo(tmp_path, monkeypatch):
    """The profile's yardstick: GHz x lanes x 2 (FMA) x 2 pipes x threads, from cpuinfo."""
    from runtime import cpu_features

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu MHz\t\t: 2400.000\nprocessor\t: 1\ncpu MHz\t\t: 2500.0\n")
    assert cpu_features.cpu_ghz(str(info)) == 2.5
    monkeypatch.setattr(cpu_features, "cpu_ghz", lambda: 2.5)
    assert cpu_features.nominal_peak_gflops(8, 2) == 2.5 * 8 * 2 * 2 * 2
    assert cpu_features.nominal_peak_gflops(0, 2) is None
    monkeypatch.setattr(cpu_features, "cpu_ghz", lambda: None)
    assert cpu_features.nominal_peak_gflops(16, 1) is None


def test_summary_states_share_of_peak():
    from runtime.instruments import Profiler

    p = Profiler("x", peak_gflops=100.0)
    p.record({"kernel": "k", "args": [0, 1], "num_outputs": 1, "flops": 2_000_000},
             0, 100_000, [{"shape": [1]}, {"shape": [1]}], 0)    # 2 MFLOP in 100 us
    text = p.summary()
    assert "20.00" in text and "20.0%" in text and "of the nominal fp32 peak 100" in text
