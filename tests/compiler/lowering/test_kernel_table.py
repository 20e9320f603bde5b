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


def test_fallback_heavy_model_warns(tmp_path):
    # a ReduceMax starts from -inf, which cpu.inner_reduction's rfactor cannot take: the
    # fallback schedules it (a strided MaxPool used to, until cpu.pool_strided)
    m = onnx_model([helper.make_node("ReduceMax", ["x"], ["p"], axes=[-1], keepdims=1,
                                     name="rmax")], [("x", (16, 64))], [("p", (16, 1))])
    cm = compiler.compile(m)
    (w,) = cm.report["warnings"]
    assert "100% of the FLOPs" in w and "rmax" in w and "onnxc tune" in w
    path = tmp_path / "rmax.onnx"
    onnx.save(m, path)
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(path), "-o",
                        str(tmp_path / "rmax.so")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "onnxc tune" in lines[0]
