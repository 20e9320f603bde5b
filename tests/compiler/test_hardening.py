"""Hardening: broken models end in documented errors (fuzzed), untrusted artifact locations."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.cli import UsageError, check_trusted_location
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import fuzz_models  # noqa: E402


def _fuzz(n: int, seed: int, jobs: int = 2):
    cases = list(fuzz_models.generate(n, seed))
    results = fuzz_models.run_all(cases, jobs=jobs, timeout=120)
    assert len(results) == n
    bad = [(m, r) for m, r in results
           if r["outcome"] in ("crash", "hang") or r["outcome"].startswith("unclean")]
    assert not bad, "\n".join(f"#{m['id']} {m['base']} {m['mutation']}: {m['what']} -> "
                              f"{r['outcome']}: {r.get('message')}\n{r.get('traceback', '')}"
                              for m, r in bad[:5])
    return results


def test_fuzz_sample_has_no_crash_hang_or_unclean_error():
    results = _fuzz(60, seed=1)
    outcomes = {r["outcome"].split(":")[0] for _, r in results}
    assert "clean" in outcomes  # the sample does exercise the error paths


@pytest.mark.slow
def test_fuzz_1000():
    _fuzz(1000, seed=0)


def test_fuzz_utf8_mutations_go_through_every_stage_without_a_traceback():
    """Issue #19: strings that are not UTF-8, by a bit flip in the file and through the
    protobuf API, end in a ModelError naming the field, or (free text) compile, export,
    load and run."""
    cases = list(fuzz_models.generate(16, seed=5, only={"utf8_flip", "utf8_field"}))
    assert {c["mutation"] for c in cases} == {"utf8_flip", "utf8_field"}
    results = fuzz_models.run_all(cases, jobs=2, timeout=120)
    for m, r in results:
        assert r["outcome"] == "ok" or (r["outcome"] == "clean:compiler.errors.ModelError"
                                        and r["stage"] == "compile"
                                        and "not valid UTF-8" in r["message"]), (m, r)
    stages = fuzz_models.stage_counts(results)
    assert sum(stages["compile"].values()) == 16
    for name in ("export", "load", "run"):  # what compiled went through every stage
        assert stages[name]["passed"] + stages[name]["skipped"] == \
            stages["compile"]["passed"]  # (a DynamicModel skips export and load)


def test_fuzz_cases_are_deterministic():
    a = [c["data"] for c in fuzz_models.generate(20, seed=3)]
    b = [c["data"] for c in fuzz_models.generate(20, seed=3)]
    assert a == b


# -- what the loader validates beyond onnx.checker ----------------------------------------

def _add_model():
    b = numpy_helper.from_array(np.ones(3, np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["s"], name="add"),
         helper.make_node("ReduceMean", ["s"], ["y"], name="mean", axes=[1], keepdims=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])], [b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_attribute_without_value_names_node_and_attribute():
    m = _add_model()
    a = m.graph.node[1].attribute[1]
    assert a.name == "keepdims"
    a.ClearField("i")  # type INT, no value: onnx.checker accepts it (inference reads 0)
    m.graph.output[0].type.tensor_type.shape.dim.pop()
    with pytest.raises(compiler.ModelError, match=r"'mean'.*'keepdims'.*no value"):
        compiler.compile(m)


def test_initializer_data_must_match_dims():
    m = _add_model()
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.float_data.extend([1.0] * 5)  # 5 values for dims [3]: the checker does not look
    with pytest.raises(compiler.ModelError, match=r"initializer 'b' has 5 values.*need 3"):
        compiler.compile(m)


def test_non_utf8_name_is_a_model_error(tmp_path):
    m = _add_model()
    m.graph.node[0].input[1] = "zzzz"  # dangling: the checker's message quotes the name
    data = m.SerializeToString()
    i = data.index(b"zzzz")
    bad = data[:i] + b"\xe1\xff\xfe\xfd" + data[i + 4:]
    path = tmp_path / "bad.onnx"
    path.write_bytes(bad)
    with pytest.raises(compiler.ModelError, match="UTF-8"):
        compiler.compile(str(path))


def test_huge_dimension_is_refused_by_name():
    m = _add_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2 ** 45
    m.graph.output[0].type.tensor_type.shape.dim[0].Clear()
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    with pytest.raises(compiler.ModelError, match=r"'x'.*elements\), more than onnxc handles"):
        compiler.compile(m)


def test_huge_dimension_with_symbolic_input_is_not_deferred():
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2 ** 62])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2 ** 62])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(compiler.ModelError, match="more than onnxc handles"):
        compiler.compile(m)


def test_cycle_and_dangling_input_are_model_errors():
    m = _add_model()
    m.graph.node[0].input[0] = "y"  # Add reads the ReduceMean output: a cycle
    with pytest.raises(compiler.ModelError):
        compiler.compile(m)
    m = _add_model()
    m.graph.node[0].input[1] = "nowhere"
    with pytest.raises(compiler.ModelError, match="nowhere"):
        compiler.compile(m)


# -- onnxc run refuses artifacts in locations others can write ----------------------------

def _artifact(d):
    p = d / "m.so"
    p.write_bytes(b"not really an artifact")
    p.chmod(0o644)
    return p


def test_world_writable_file_is_refused(tmp_path):
    p = _artifact(tmp_path)
    p.chmod(0o666)
    with pytest.raises(UsageError, match="writable by every user"):
        check_trusted_location(str(p))


def test_world_writable_directory_without_sticky_bit_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    p = _artifact(d)
    d.chmod(0o777)
    try:
        with pytest.raises(UsageError, match="no sticky bit"):
            check_trusted_location(str(p))
        link = tmp_path / "link.so"  # a symlink from a safe place does not hide it
        link.symlink_to(p)
        with pytest.raises(UsageError, match="no sticky bit"):
            check_trusted_location(str(link))
        d.chmod(0o1777)  # sticky, and the file is ours: accepted
        check_trusted_location(str(p))
    finally:
        d.chmod(0o755)


def test_private_location_is_accepted(tmp_path):
    tmp_path.chmod(0o755)
    check_trusted_location(str(_artifact(tmp_path)))


def test_cli_run_refuses_unless_allowed(tmp_path, cnn_so):
    d = tmp_path / "shared"
    d.mkdir()
    so = d / "cnn.so"
    so.write_bytes(cnn_so.read_bytes())
    d.chmod(0o777)
    try:
        def run(*extra):
            return subprocess.run([sys.executable, "-m", "compiler.cli", "run", str(so),
                                   "--random-inputs", *extra], capture_output=True, text=True,
                                  cwd=str(REPO))
        r = run()
        assert r.returncode == 1
        assert "refusing to load" in r.stderr and "--allow-untrusted-location" in r.stderr
        assert "Traceback" not in r.stderr
        r = run("--allow-untrusted-location")
        assert r.returncode == 0, r.stderr
    finally:
        d.chmod(0o755)


def test_cli_compile_of_a_truncated_model_exits_1(tmp_path):
    import tests.conftest as c

    data = c.zoo_model("mlp").SerializeToString()
    p = tmp_path / "t.onnx"
    p.write_bytes(data[: len(data) // 3])
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(p), "-o",
                        str(tmp_path / "t.so")], capture_output=True, text=True, cwd=str(REPO))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "error:" in r.stderr


def test_gather_axis_out_of_range_is_a_model_error():
    """Found by fuzz_models.py (seed 0, case 38): onnx shape inference and TVM accept
    axis 2^40, and the index-bounds check then indexed the data shape with it."""
    table = numpy_helper.from_array(np.ones((4, 3), np.float32), "table")
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="gather", axis=2**40)],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [table])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(compiler.ModelError, match=f"axis {2**40} is out of range .* rank 2"):
        compiler.compile(m)


def test_huge_input_is_refused_before_shape_inference():
    """A 2^62-element input feeding Range (BlackmanWindow's expanded body, found by
    `fuzz_models.py --conformance-ops`): onnx's shape inference with data propagation never
    returned; the size is now checked first."""
    from onnx.backend.test.case.node import collect_testcases

    (case,) = [c for c in collect_testcases(None) if c.name == "test_blackmanwindow_expanded"]
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    dims = m.graph.input[0].type.tensor_type.shape
    del dims.dim[:]
    dims.dim.add().dim_value = 2 ** 62
    with pytest.raises(compiler.ModelError, match=r"'x'.*more than onnxc handles"):
        compiler.compile(m)


def test_sequence_input_with_a_failing_compile_is_not_deferred():
    """A model with a sequence input and a shape-determining input (Loop's trip count) is
    refused as unsupported at compile time, not turned into a dynamic model that crashed
    with a KeyError on the sequence input (fuzzer, test_loop13_seq)."""
    from onnx.backend.test.case.node import collect_testcases

    (case,) = [c for c in collect_testcases(None) if c.name == "test_loop13_seq"]
    with pytest.raises(compiler.UnsupportedError, match="not a tensor"):
        compiler.compile(case.model)


@pytest.mark.parametrize("op, idx_shape, bad, good, attrs", [
    # GatherND's coordinates: a column per addressed axis (sizes 2, 3)
    ("GatherND", [3, 2], [[0, 0], [1, 2], [1, 3]], [[0, 0], [1, -1], [-2, 2]], {}),
    ("GatherElements", [2, 3, 4], None, None, {"axis": 1}),
])
def test_fed_indices_out_of_range_are_refused_not_read_past(op, idx_shape, bad, good, attrs):
    """Indices fed by the caller into GatherND / GatherElements are checked by the session
    (as Gather's token ids were): out of range, the kernel read outside its table (GatherND:
    a segfault); in range, negative ones included, the outputs match onnxruntime."""
    import onnxruntime as ort

    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    g = helper.make_graph([helper.make_node(op, ["data", "idx"], ["y"], name="pick", **attrs)],
                          "g", [helper.make_tensor_value_info("idx", TensorProto.INT64,
                                                             idx_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(data, "data")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    sess = compiler.compile(m).session()
    if bad is None:  # GatherElements along axis 1 (size 3)
        rng = np.random.default_rng(0)
        good = rng.integers(-3, 3, idx_shape)
        bad = good.copy()
        bad[1, 2, 3] = 3
    with pytest.raises(ValueError, match=r"input 'idx'.*'pick'.*must lie in \[-3, 2\]; got 3"):
        sess.run(None, {"idx": np.array(bad, np.int64)})
    feeds = {"idx": np.array(good, np.int64)}
    want = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
