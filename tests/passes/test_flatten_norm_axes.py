"""flatten_norm_axes: a layer norm over several trailing axes runs over their flattened row."""

from __future__ import annotations

import numpy as np
import pytest

from passes import FlattenNormAxes
from passes.flatten_norm_axes import RULE
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass


def _ln(shape, axis, seed=0):
    rng = np.random.default_rng(seed)
    feat = [d for d in shape[axis:]]
    return model([node("LayerNormalization", ["x", "g", "b"], "y", axis=axis, epsilon=1e-5)],
                 {"x": shape}, {"y": shape},
                 {"g": rng.standard_normal(feat).astype(np.float32),
                  "b": rng.standard_normal(feat).astype(np.float32)})


def test_structure_one_row_norm_between_views():
    _, after, r = run_pass(FlattenNormAxes(), _ln([2, 8, 5, 7], 1))
    # x, gamma and beta to rows, the result back (views, or folded for constants)
    assert after == {"relax.nn.layer_norm": 1, "relax.reshape": 4}
    assert r.rewrites == {RULE: 1} and r.nodes == ["y"]


@pytest.mark.parametrize("shape, axis", [([2, 8, 5, 7], 1), ([3, 197, 64], -2),
                                         ([2, 4, 3, 50], 2)])
def test_numerics_and_the_row_rule(shape, axis):
    m = _ln(shape, axis)
    x = (np.random.default_rng(1).standard_normal(shape) * 3 + 2).astype(np.float32)
    outs, cm = compile_run(m, {"x": x})
    assert_close(outs, ort_run(m, {"x": x}), rtol=1e-4, atol=2e-5)
    assert report(cm, "flatten_norm_axes")["rewrites"] == {RULE: 1}
    # the norm on the row rule (the reshape back is a view, or the output's copy here)
    assert "cpu.row_reduction" in [r["rule"] for r in cm.report["kernel_table"]
                                   if "y" in r["nodes"]]


def test_symbolic_batch():
    """[n, 16, 12] normalised over (16, 12) with a symbolic batch: one artifact for every
    n, the norm on the row rule."""
    import compiler

    rng = np.random.default_rng(2)
    m = model([node("LayerNormalization", ["x", "g", "beta"], "y", axis=1, epsilon=1e-5)],
              {"x": ["n", 16, 12]}, {"y": ["n", 16, 12]},
              {"g": rng.standard_normal((16, 12)).astype(np.float32),
               "beta": rng.standard_normal((16, 12)).astype(np.float32)})
    cm = compiler.compile(m, dims={"n": (1, 5, 1)})
    assert report(cm, "flatten_norm_axes")["rewrites"] == {RULE: 1}
    assert "cpu.row_reduction" in [r["rule"] for r in cm.report["kernel_table"]]
    sess = cm.session()
    for n in (1, 3, 5):
        x = rng.standard_normal((n, 16, 12)).astype(np.float32)
        assert_close(sess.run(None, {"x": x}), ort_run(m, {"x": x}), rtol=1e-4, atol=2e-5)


def test_last_axis_norms_are_left_alone():
    _, _, r = run_pass(FlattenNormAxes(), _ln([4, 32], -1))
    assert not r.rewrites
