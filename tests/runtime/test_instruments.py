"""Profiling (Chrome trace) and NaN/Inf checks of the graph runtime."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
import runtime
from tests.conftest import compiled, ort_run, zoo, zoo_model


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
    assert "1 NaN and 0 Inf" in msg and "shape [2, 4]" in msg
    # the Log shares its kernel with the Mul: the checked variant names the Log
    assert msg.startswith("node 'the_log' (Log) read only finite values") and "'l'" in msg


def test_check_nan_says_when_inputs_already_had_nan():
    sess = compiler.compile(_log_model()).session(runtime.SessionOptions(check_nan=True))
    x = np.full((2, 4), 3.0, np.float32)
    x[0, 0] = np.nan
    with pytest.raises(runtime.NonFiniteError, match="inputs already had some") as e:
        sess.run(None, {"x": x})
    assert "'x' (1 NaN, 0 Inf, a model input)" in str(e.value)
    assert "read only finite values" not in str(e.value)  # no node is blamed


def test_without_check_nan_runs_through():
    sess = compiler.compile(_log_model()).session()
    y, _ = sess.run(None, {"x": np.full((2, 4), 0.5, np.float32)})
    assert np.isnan(y).all()


def _sub_log_relu(n=4):
    """Sub -> Log -> Relu: one fused kernel; x < 1 makes the Log's NaN, which Relu keeps."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    g = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["s"], name="shift"),
         helper.make_node("Log", ["s"], ["l"], name="the_log"),
         helper.make_node("Relu", ["l"], ["y"], name="act")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])], [one])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_check_nan_names_the_node_inside_a_fused_kernel():
    cm = compiler.compile(_sub_log_relu())
    (call,) = cm.meta["graph"]["calls"]
    assert call["nodes"] == ["shift", "the_log", "act"]  # one kernel: needs the variant
    steps = call["checked"]["steps"]
    assert [(st["node"], st["op"], st["tensor"]) for st in steps] == [
        ("shift", "Sub", "s"), ("the_log", "Log", "l"), ("act", "Relu", "y")]
    assert cm.report["checked_kernels"] == 1
    sess = cm.session(runtime.SessionOptions(check_nan=True))
    x = np.full((2, 4), 3.0, np.float32)
    x[0, 1], x[1, 3] = 0.5, -2.0  # two NaN from Log(negative)
    with pytest.raises(runtime.NonFiniteError) as e:
        sess.run(None, {"x": x})
    msg = str(e.value)
    assert msg.startswith("node 'the_log' (Log) read only finite values and wrote 2 NaN and "
                          "0 Inf into tensor 'l' of shape [2, 4]")
    assert "'shift'" not in msg.split(";")[0] and "'act'" not in msg.split(";")[0]
    assert "fused_subtract" in msg  # the kernel is still named


def test_check_nan_blames_the_node_that_made_inf_not_its_readers():
    """Mul overflows to +inf from finite inputs; Log(inf) = inf and Relu only pass it on."""
    big = helper.make_tensor("big", TensorProto.FLOAT, [], [1e38])
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "big"], ["m"], name="scale"),
         helper.make_node("Log", ["m"], ["l"], name="the_log"),
         helper.make_node("Relu", ["l"], ["y"], name="act")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [big])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = compiler.compile(model).session(runtime.SessionOptions(check_nan=True))
    x = np.full((2, 4), 3e-3, np.float32)
    x[0, 0] = 10.0
    with pytest.raises(runtime.NonFiniteError) as e:
        sess.run(None, {"x": x})
    assert str(e.value).startswith("node 'scale' (Mul) read only finite values and wrote "
                                   "0 NaN and 1 Inf into tensor 'm'")


def test_check_nan_input_nan_blames_no_node():
    sess = compiler.compile(_sub_log_relu()).session(runtime.SessionOptions(check_nan=True))
    x = np.full((2, 4), 3.0, np.float32)
    x[1, 0] = np.nan
    with pytest.raises(runtime.NonFiniteError) as e:
        sess.run(None, {"x": x})
    msg = str(e.value)
    assert "'x' (1 NaN, 0 Inf, a model input)" in msg and "no node of this kernel" in msg
    assert "read only finite values" not in msg


class _SpyKernels:
    """The kernels module, recording which symbols a session looks up."""

    def __init__(self, kernels):
        self.kernels, self.looked_up = kernels, []

    def __getitem__(self, name):
        self.looked_up.append(name)
        return self.kernels[name]


def test_checked_variant_costs_nothing_until_a_check_fires(monkeypatch):
    from runtime import instruments
    from runtime.session import Session

    cm = compiler.compile(_sub_log_relu())
    calls = []
    real = instruments.run_checked
    monkeypatch.setattr(instruments, "run_checked",
                        lambda *a: calls.append(a[0]["kernel"]) or real(*a))
    nan_x = np.full((2, 4), 0.5, np.float32)
    for check in (False, True):
        spy = _SpyKernels(cm._kernels)
        sess = Session(cm.meta, cm._payload, spy, runtime.SessionOptions(check_nan=check))
        sess.run(None, {"x": np.full((2, 4), 3.0, np.float32)})  # finite: nothing extra
        if not check:
            assert np.isnan(sess.run(None, {"x": nan_x})[0]).all()  # check off: runs through
        assert not any(n.endswith("__checked") for n in spy.looked_up) and not calls
    with pytest.raises(runtime.NonFiniteError, match="the_log"):
        sess.run(None, {"x": nan_x})
    assert calls == ["fused_subtract_log_relu"]
    assert spy.looked_up[-1] == "fused_subtract_log_relu__checked"


def test_check_nan_inside_a_blocked_conv_kernel():
    """Conv (NCHW[b]c, folded BN) -> Sqrt of its negative outputs: the variant runs on the
    kernel's own transformed params and blocked layout and names the Sqrt."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Sqrt", ["c"], ["r"], name="root"),
         helper.make_node("Neg", ["r"], ["y"], name="neg")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiler.compile(model, layout="NCHWc")
    call = next(c for c in cm.meta["graph"]["calls"] if "root" in c["nodes"])
    assert call["nodes"] == ["conv", "root", "neg"] and call["checked"]
    assert cm.report["layout"]["convs_converted"] == 1
    sess = cm.session(runtime.SessionOptions(check_nan=True))
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    with pytest.raises(runtime.NonFiniteError) as e:
        sess.run(None, {"x": x})
    expected = int((ort_run(model, {"x": x})[0] != ort_run(model, {"x": x})[0]).sum())
    assert str(e.value).startswith(f"node 'root' (Sqrt) read only finite values and wrote "
                                   f"{expected} NaN")


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


def test_cli_check_nan_names_the_log(tmp_path):
    import subprocess
    import sys

    import onnx

    onnx.save(_sub_log_relu(), tmp_path / "m.onnx")
    assert subprocess.run([sys.executable, "-m", "compiler.cli", "compile", tmp_path / "m.onnx",
                           "-o", tmp_path / "m.so"]).returncode == 0
    x = np.full((2, 4), 3.0, np.float32)
    x[0, 2] = -1.0
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "run", tmp_path / "m.so",
                        "--input", f"x={tmp_path / 'x.npy'}", "--check-nan"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "node 'the_log' (Log) read only finite values and wrote 1 NaN" in r.stderr


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


def test_inplace_inputs_are_saved_for_the_check():
    """A call whose output reuses its input's buffer has overwritten that input by the time
    the check runs: the session saves it, and the check reads the saved copy."""
    from runtime.instruments import check_outputs, inplace_inputs

    tensors = [{"name": "a", "storage": "arena", "index": 0, "shape": [4], "dtype": "float32"},
               {"name": "b", "storage": "arena", "index": 0, "shape": [4], "dtype": "float32"},
               {"name": "w", "storage": "param", "index": 0, "shape": [4], "dtype": "float32"},
               {"name": "c", "storage": "arena", "index": 1, "shape": [4], "dtype": "float32"}]
    calls = [{"kernel": "k0", "args": [0, 2, 1], "num_outputs": 1, "nodes": ["log"],
              "ops": "Log"},
             {"kernel": "k1", "args": [1, 3], "num_outputs": 1, "nodes": ["neg"], "ops": "Neg"}]
    assert inplace_inputs({"tensors": tensors, "calls": calls}) == [[0], []]
    out = np.array([1.0, np.nan, 0.0, 2.0], np.float32)
    views = [out, out, np.ones(4, np.float32), np.zeros(4, np.float32)]  # a is b now
    with pytest.raises(runtime.NonFiniteError, match="inputs already had some"):
        check_outputs(calls[0], views, tensors)  # unsaved: the overwritten input looks bad
    with pytest.raises(runtime.NonFiniteError) as e:
        check_outputs(calls[0], views, tensors, saved={0: np.ones(4, np.float32)})
    assert str(e.value).startswith("node 'log' (Log) read only finite values and wrote 1 NaN")
