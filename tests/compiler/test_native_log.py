"""TVM's C++ log lines go through logging (onnxc.tvm) while we compile; nothing else is held."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.native_log import routed
from tests.conftest import REPO, assert_close, ort_run

FAST_MODE = "Fast mode segfaults"


def gather_model():
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    node = helper.make_node("Gather", ["table", "ids"], ["y"], name="gather0")
    graph = helper.make_graph(
        [node], "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_tvm_lines_become_records_other_lines_pass_through(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="onnxc.tvm")
    with routed():
        os.write(2, b"[12:34:56] /src/tvm/a.cc:12: Warning: a tvm warning\n")
        os.write(2, b"[12:34:56] /src/tvm/b.cc:34: an info line\n")
        os.write(2, b"[12:34:56] /src/tvm/c.cc:56: Error: a tvm error\n")
        os.write(2, b"LLVM ERROR: Cannot select: something real\n")
        # one write: print() writes the text and its newline separately, and the pump
        # thread's pass-through of the line above may land between the two
        sys.stderr.write("python's own stderr\n")
        sys.stderr.flush()
        os.write(2, b"no newline at the end")
    err = capfd.readouterr().err
    assert "a tvm warning" not in err and "an info line" not in err and "a tvm error" not in err
    assert "LLVM ERROR: Cannot select: something real\n" in err
    assert "python's own stderr\n" in err
    assert err.endswith("no newline at the end")
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "onnxc.tvm"]
    assert got == [(logging.DEBUG, "tvm /src/tvm/a.cc:12: Warning: a tvm warning"),
                   (logging.DEBUG, "tvm /src/tvm/b.cc:34: Info: an info line"),
                   (logging.WARNING, "tvm /src/tvm/c.cc:56: Error: a tvm error")]
    # fd 2 is ours again, and nesting restores it only at the outermost exit
    with routed():
        with routed():
            pass
        os.write(2, b"[12:34:56] /src/tvm/d.cc:1: Warning: nested\n")
    os.write(2, b"[12:34:56] /src/tvm/e.cc:1: Warning: after the block\n")
    err = capfd.readouterr().err
    assert "nested" not in err and "after the block" in err


def test_gather_compile_is_quiet_by_default_and_logs_at_debug(capfd, caplog):
    import compiler

    caplog.set_level(logging.WARNING)
    cm = compiler.compile(gather_model())
    assert FAST_MODE not in capfd.readouterr().err
    assert not [r for r in caplog.records if FAST_MODE in r.getMessage()]
    ids = np.array([1, 2, 9])
    assert_close(cm.session().run(None, {"ids": ids}), ort_run(gather_model(), {"ids": ids}))

    caplog.set_level(logging.DEBUG, logger="onnxc.tvm")
    compiler.compile(gather_model())
    assert FAST_MODE not in capfd.readouterr().err
    records = [r for r in caplog.records if r.name == "onnxc.tvm" and FAST_MODE in r.getMessage()]
    assert records and all(r.levelno == logging.DEBUG for r in records)
    assert "transform.h" in records[0].getMessage()


def test_cli_verbosity_levels():
    from compiler.cli import build_parser

    assert [build_parser().parse_args([*v, "ops"]).verbose
            for v in ([], ["-v"], ["-vv"], ["--verbose", "--verbose"])] == [0, 1, 2, 2]


@pytest.mark.slow  # two CLI compiles, each a fresh interpreter and a compile child: ~10 s each
def test_cli_shows_tvm_lines_at_vv_only(tmp_path):
    model = tmp_path / "gather.onnx"
    model.write_bytes(gather_model().SerializeToString())

    def onnxc(*args):
        return subprocess.run([sys.executable, "-m", "compiler.cli", *map(str, args)],
                              capture_output=True, text=True, cwd=REPO)

    quiet = onnxc("compile", model, "-o", tmp_path / "a.so")
    assert quiet.returncode == 0, quiet.stderr
    assert FAST_MODE not in quiet.stderr
    loud = onnxc("-vv", "compile", model, "-o", tmp_path / "b.so")
    assert loud.returncode == 0, loud.stderr
    assert "onnxc.tvm: tvm " in loud.stderr and FAST_MODE in loud.stderr


def test_no_stderr_at_all_is_left_alone():
    saved = os.dup(2)
    os.close(2)
    try:
        with routed():
            pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
