"""canonicalize_bindings: x = y; f(x) => f(y) (alias bindings end FuseOps groups)."""

from __future__ import annotations

import numpy as np
from tvm import relax

from compiler.frontend.importer import import_onnx
from compiler.frontend.loader import load_model
from passes import CanonicalizeBindings
from passes.relax_util import bindings
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass

RULE = "x = y; f(x) => f(y)"


def conv_bn_relu():
    """BatchNormalization has three outputs: the importer binds item 0 to an alias."""
    rng = np.random.default_rng(10)
    inits = {"w": rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32),
             **{f"bn.{k}": rng.uniform(0.5, 1.5, 4).astype(np.float32) for k in "sbmv"}}
    return model([node("Conv", ["x", "w"], "conv", pads=[1, 1, 1, 1]),
                  node("BatchNormalization", ["conv", "bn.s", "bn.b", "bn.m", "bn.v"], "bn"),
                  node("Relu", ["bn"], "relu")], {"x": [1, 3, 8, 8]}, {"relu": [1, 4, 8, 8]},
                 inits)


def _aliases(mod):
    return [b.var.name for b in bindings(mod) if isinstance(b.value, relax.Var)]


def test_structure_aliases_removed():
    m = conv_bn_relu()
    assert "n1_o0" in _aliases(import_onnx(load_model(m)))
    before, after, r = run_pass(CanonicalizeBindings(), m)
    assert before == after                       # same ops, fewer bindings
    assert r.rewrites[RULE] >= 1 and "bn" in r.nodes


def test_conv_bn_relu_one_kernel_and_numerics():
    m = conv_bn_relu()
    feeds = {"x": np.random.default_rng(11).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    outs, cm = compile_run(m, feeds)
    assert report(cm, "canonicalize_bindings")["changed"]
    assert [c["nodes"] for c in cm.meta["graph"]["calls"]] == [["conv", "bn", "relu"]]
    assert_close(outs, ort_run(m, feeds))
    outs, cm_off = compile_run(m, feeds, disabled_passes=["canonicalize_bindings"])
    assert_close(outs, ort_run(m, feeds))
    assert cm_off.report["kernels"] == 2         # the alias splits conv+BN from the Relu


def test_nothing_to_do_without_aliases():
    m = model([node("Relu", ["x"], "r"), node("Neg", ["r"], "y")], {"x": [4]}, {"y": [4]})
    _, _, r = run_pass(CanonicalizeBindings(), m)
    assert r.rewrites == {} and r.nodes == []
