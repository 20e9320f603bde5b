"""The onnxc command line: compile, run, memplan, bench; exit codes and error style."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, assert_close, ort_run, zoo, zoo_model

EXAMPLE = str(REPO / "examples" / "cnn.onnx")


def onnxc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "compiler.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def compiled_cli(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    r = onnxc("compile", EXAMPLE, "-o", d / "cnn.so", "--report", d / "r.json")
    assert r.returncode == 0, r.stderr
    return d


def test_compile_writes_so_and_report(compiled_cli):
    assert (compiled_cli / "cnn.so").stat().st_size > 0
    report = json.loads((compiled_cli / "r.json").read_text())
    for key in ("kernels", "passes", "memory", "compile_seconds", "target", "tuned_kernels",
                "untuned_kernels"):
        assert key in report
    assert report["memory"]["arena_bytes"] >= report["memory"]["lower_bound_bytes"] > 0


def test_run_with_input_files_matches_onnxruntime(compiled_cli, tmp_path):
    feeds = zoo.random_inputs(zoo_model("cnn"), seed=4)
    np.save(tmp_path / "x.npy", feeds["input"])
    r = onnxc("run", compiled_cli / "cnn.so", "--input", f"input={tmp_path / 'x.npy'}",
              "--output-dir", tmp_path / "out", "--repeat", "3")
    assert r.returncode == 0, r.stderr
    assert "logits: float32[1, 10]" in r.stdout and "latency: median" in r.stdout
    assert_close([np.load(tmp_path / "out" / "logits.npy")], ort_run(zoo_model("cnn"), feeds))


def test_run_random_inputs(compiled_cli):
    r = onnxc("run", compiled_cli / "cnn.so", "--random-inputs")
    assert r.returncode == 0 and "logits" in r.stdout


def test_no_memory_reuse_flag(tmp_path):
    r = onnxc("compile", EXAMPLE, "-o", tmp_path / "m.so", "--no-memory-reuse",
              "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    mem = json.loads((tmp_path / "r.json").read_text())["memory"]
    assert mem["arena_bytes"] == mem["no_reuse_bytes"] and not mem["memory_reuse"]


def test_dump_ir_writes_one_file_per_pass(tmp_path):
    r = onnxc("compile", EXAMPLE, "-o", tmp_path / "m.so", "--dump-ir", tmp_path / "ir",
              "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    ran = [p["name"] for p in json.loads((tmp_path / "r.json").read_text())["passes"]
           if not p.get("skipped")]
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    stages = ["import"] + ran + ["lowered"]
    assert names == [f"{i:03d}_{s}.txt" for i, s in enumerate(stages)]
    assert "R.nn.conv2d" in (tmp_path / "ir" / "000_import.txt").read_text()


@pytest.mark.parametrize("args, message", [
    (("run", "missing.so"), "missing.so: no such file"),
    (("compile", "missing.onnx", "-o", "x.so"), "missing.onnx: no such file"),
    (("compile", EXAMPLE, "-o", "x.so", "--target", "sparc"), "unknown target 'sparc'"),
    (("compile", EXAMPLE, "-o", "x.so", "--disable-pass", "nosuch"), "unknown pass 'nosuch'"),
    (("compile", EXAMPLE, "-o", "/no/such/dir/x.so"), "does not exist"),
])
def test_user_errors_exit_1_without_traceback(tmp_path, args, message):
    r = onnxc(*args, cwd=tmp_path)
    assert r.returncode == 1
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_run_missing_input_says_what_to_do(compiled_cli):
    r = onnxc("run", compiled_cli / "cnn.so")
    assert r.returncode == 1
    assert "input 'input'" in r.stderr and "--random-inputs" in r.stderr


def test_bad_input_file(compiled_cli, tmp_path):
    (tmp_path / "bad.npy").write_text("nope")
    r = onnxc("run", compiled_cli / "cnn.so", "--input", f"input={tmp_path / 'bad.npy'}")
    assert r.returncode == 1 and "not a readable .npy file" in r.stderr


def test_wrong_shape_input_file(compiled_cli, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    r = onnxc("run", compiled_cli / "cnn.so", "--input", f"input={tmp_path / 'x.npy'}")
    assert r.returncode == 1 and "expected shape [1, 3, 32, 32], got [1, 3, 8, 8]" in r.stderr


def test_bad_arguments_exit_2():
    assert onnxc("compile").returncode == 2
    assert onnxc("frobnicate").returncode == 2


def test_memplan(compiled_cli):
    r = onnxc("memplan", compiled_cli / "cnn.so")
    assert r.returncode == 0, r.stderr
    assert "arena:" in r.stdout and "lower bound:" in r.stdout and "no reuse:" in r.stdout


def test_bench_compares_with_onnxruntime():
    r = onnxc("bench", EXAMPLE, "--rounds", "1", "--runs", "2")
    assert r.returncode == 0, r.stderr
    assert "onnxc / onnxruntime latency" in r.stdout and "outputs match" in r.stdout


def test_bench_feeds_symbolic_dims_at_opt(tmp_path):
    """A model exported with a dynamic batch: both engines get the same feed at OPT (it
    failed in the onnxruntime worker, which read the declared ['batch', ...] as a shape)."""
    import onnx

    m = onnx.load(EXAMPLE)
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(m, tmp_path / "dyn.onnx")
    r = onnxc("bench", tmp_path / "dyn.onnx", "--dim", "batch=1..4:3", "--rounds", "1",
              "--runs", "2")
    assert r.returncode == 0, r.stderr
    assert "symbolic dims timed at batch=3" in r.stdout
    assert "outputs match" in r.stdout and "float32[3, " in r.stdout


def test_bench_of_a_model_without_one_artifact_says_why(tmp_path):
    """A shape computed from an input's values: no one artifact to time (it was a
    KeyError traceback)."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "value_shaped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "v.onnx")
    r = onnxc("bench", tmp_path / "v.onnx", "--rounds", "1", "--runs", "1")
    assert r.returncode == 1 and "cannot benchmark" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_inspect_supported_model():
    r = onnxc("inspect", EXAMPLE)
    assert r.returncode == 0, r.stderr
    assert "stem.conv" in r.stdout or "Conv" in r.stdout
    assert "25 of 25 nodes supported" in r.stdout and "supported (tvm)" in r.stdout


def test_inspect_unsupported_exits_1(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="ok_relu"),
                           helper.make_node("Frob", ["t"], ["y"], name="bad_frob",
                                            domain="com.acme")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.acme", 1)])
    onnx.save(m, tmp_path / "m.onnx")
    r = onnxc("inspect", tmp_path / "m.onnx")
    assert r.returncode == 1
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("bad_frob"))
    assert "Frob" in line and "com.acme" in line and "UNSUPPORTED" in line
    assert "no converter is registered" in line
    assert "1 of 2 nodes supported" in r.stdout


def test_memplan_png(compiled_cli, tmp_path):
    pytest.importorskip("matplotlib")
    r = onnxc("memplan", compiled_cli / "cnn.so", "--png", tmp_path / "plan.png")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


def test_compile_precision_bf16_refused_on_a_target_without_it_and_emulated_reported(tmp_path):
    from tests.passes.test_pack_bf16_matmul import mlp

    model = tmp_path / "mlp.onnx"
    model.write_bytes(mlp()[0].SerializeToString())
    r = onnxc("compile", model, "-o", tmp_path / "a.so", "--target", "x86-avx2",
              "--precision", "bf16", "--no-isolate")
    assert r.returncode == 1 and "AVX512-BF16" in r.stderr and "Traceback" not in r.stderr
    r = onnxc("compile", model, "-o", tmp_path / "b.so", "--precision", "bf16-emulated",
              "--report", tmp_path / "r.json", "--no-isolate")
    assert r.returncode == 0, r.stderr
    p = json.loads((tmp_path / "r.json").read_text())["precision"]
    assert p["mode"] == "bf16-emulated" and 0 < p["max_rel_error"] < 2e-2
