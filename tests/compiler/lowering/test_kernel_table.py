"""The report's kernel_table and the compile warning for fallback-heavy models."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import helper

import compiler
from tests.schedules.util import onnx_model


def _conv_pool():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3], strides=[2],
                              pads=[1, 1], name="pool")]
    nodes.append(helper.make_node("Conv", ["p", "w"], ["y"], kernel_shape=[3], pads=[1, 1],
                                  name="conv"))
    w = rng.standard_normal((32, 16, 3)).astype("float32")
    return onnx_model(nodes, [("x", (1, 16, 64))], [("y", (1, 32, 32))], {"w": w})


def test_kernel_table_rows():
    cm = compiler.compile(_conv_pool())
    table = cm.report["kernel_table"]
    assert len(table) == cm.report["kernels"]
    conv = next(r for r in table if "conv" in r["nodes"])
    assert conv["rule"] == "cpu.conv2d_packed" and conv["ops"].startswith("Conv")
    assert conv["flops"] == 2 * 32 * 16 * 3 * 32       # 2 x MACs
    assert conv["bytes"] >= 4 * (16 * 32 + 32 * 16 * 3 + 32 * 32)
    assert abs(sum(r["flops_share"] for r in table) - 1) < 1e-3
    assert conv["flops_share"] > 0.9
    assert cm.report["warnings"] == []        # the pool's FLOPs are < 5% of the model's


def test_fallback_heavy_model_warns(tmp_path, monkeypatch, capsys):
    # every kernel on the generic fallback (the rule list cut to it): the conv holds the
    # model's FLOPs.  Real models reach this through kernels no rule takes; which those are
    # changes as rules are added, so the test makes one instead of naming one
    import schedules
    from compiler import cli
    from schedules.cpu import Fallback

    monkeypatch.setattr(schedules, "RULES", [Fallback()])
    m = _conv_pool()
    cm = compiler.compile(m)
    (w,) = cm.report["warnings"]
    assert "% of the FLOPs" in w and "conv" in w and "onnxc tune" in w
    path = tmp_path / "model.onnx"
    onnx.save(m, path)
    # --no-isolate: the rule list is patched in this process, not in a spawned child
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "model.so"), "--no-isolate"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "onnxc tune" in lines[0]
