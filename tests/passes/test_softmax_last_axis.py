"""softmax_last_axis: softmax / log_softmax over a non-last axis run over the last."""

from __future__ import annotations

import numpy as np
import pytest

from passes import SoftmaxLastAxis
from passes.softmax_last_axis import RULE
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass


def _softmax(op, shape, axis):
    return model([node(op, ["x"], "y", axis=axis)], {"x": shape}, {"y": shape})


def test_structure_between_transposes():
    _, after, r = run_pass(SoftmaxLastAxis(), _softmax("Softmax", [1, 8, 5, 7], 1))
    assert after == {"relax.permute_dims": 2, "relax.nn.softmax": 1}
    assert r.rewrites == {RULE: 1} and r.nodes == ["y"]


@pytest.mark.parametrize("op, shape, axis", [
    ("Softmax", [1, 64, 14, 14], 1),     # a segmentation head over the channels
    ("LogSoftmax", [2, 21, 9, 11], 1),
    ("Softmax", [512, 40], 0),           # a 2-D softmax over the rows
    ("Softmax", [2, 7, 33, 5], -2),
])
def test_numerics_and_the_row_rule(op, shape, axis):
    m = _softmax(op, shape, axis)
    x = (np.random.default_rng(0).standard_normal(shape) * 6).astype(np.float32)
    outs, cm = compile_run(m, {"x": x})
    assert_close(outs, ort_run(m, {"x": x}), rtol=1e-4, atol=1e-5)
    assert report(cm, "softmax_last_axis")["rewrites"] == {RULE: 1}
    rules = {r["rule"] for r in cm.report["kernel_table"]}
    assert "cpu.row_reduction" in rules and "dlight.reduction" not in rules, rules


def test_last_axis_is_left_alone():
    _, _, r = run_pass(SoftmaxLastAxis(), _softmax("Softmax", [4, 32], -1))
    assert not r.rewrites
