"""fuse_layer_norm: (x - mean) / sqrt(var + eps) * gamma + beta => layer_norm(x, gamma, beta)."""

from __future__ import annotations

import numpy as np

from passes import FuseLayerNorm
from tests.conftest import assert_close, ort_run

from .helpers import compile_run, model, node, report, run_pass, symbolic_rows_run

RULE = "decomposed LayerNorm => layer_norm"
SHAPE = [2, 5, 16]
RNG = np.random.default_rng(1)


def decomposed_ln(gamma=True, beta=True, square="Pow", gamma_shape=(16,), extra_output=False,
                  eps=1e-5):
    """LayerNorm as exported below opset 17: ReduceMean, Sub, Pow 2 (or Mul d d),
    ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta."""
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(eps, np.float32),
             "gamma": RNG.uniform(0.5, 1.5, gamma_shape).astype(np.float32),
             "beta": RNG.normal(0, 0.1, 16).astype(np.float32)}
    nodes = [node("ReduceMean", ["x"], "mean", axes=[-1]), node("Sub", ["x", "mean"], "sub"),
             node("Pow", ["sub", "two"], "sq") if square == "Pow" else
             node("Mul", ["sub", "sub"], "sq"),
             node("ReduceMean", ["sq"], "var", axes=[-1]), node("Add", ["var", "eps"], "add_eps"),
             node("Sqrt", ["add_eps"], "std"), node("Div", ["sub", "std"], "norm")]
    out = "norm"
    if gamma:
        nodes.append(node("Mul", [out, "gamma"], "scale"))
        out = "scale"
    if beta:
        nodes.append(node("Add", ["beta", out], "shift"))  # constant first: either order
        out = "shift"
    outputs = {out: SHAPE, **({"sub": SHAPE} if extra_output else {})}
    return model(nodes, {"x": SHAPE}, outputs, inits)


def _feeds():
    return {"x": (3 + 2 * RNG.standard_normal(SHAPE)).astype(np.float32)}


def test_structure_nine_ops_become_one():
    before, after, r = run_pass(FuseLayerNorm(), decomposed_ln())
    assert before["relax.mean"] == 2 and before["relax.sqrt"] == 1
    assert after == {"relax.nn.layer_norm": 1}
    assert r.rewrites == {RULE: 1}
    assert r.nodes == ["mean", "sub", "sq", "var", "add_eps", "std", "norm", "scale", "shift"]


def test_variants_without_gamma_beta_and_with_mul_square():
    for kw in ({"gamma": False}, {"beta": False}, {"gamma": False, "beta": False},
               {"square": "Mul"}):
        _, after, r = run_pass(FuseLayerNorm(), decomposed_ln(**kw))
        assert after == {"relax.nn.layer_norm": 1} and r.rewrites == {RULE: 1}, kw


def test_numerics_against_onnxruntime_and_disabled():
    m, feeds = decomposed_ln(), _feeds()
    outs, cm = compile_run(m, feeds)
    assert report(cm, "fuse_layer_norm")["rewrites"] == {RULE: 1}
    assert_close(outs, ort_run(m, feeds))
    # one kernel, and it names all nine nodes (the fused binding is tagged with each)
    (call,) = cm.meta["graph"]["calls"]
    assert sorted(call["nodes"]) == sorted(n.name for n in m.graph.node)
    outs_off, cm_off = compile_run(m, feeds, disabled_passes=["fuse_layer_norm"])
    assert_close(outs_off, ort_run(m, feeds))
    assert cm.report["kernels"] < cm_off.report["kernels"]


def test_not_fused_when_an_intermediate_is_used_elsewhere():
    m = decomposed_ln(extra_output=True)
    _, after, r = run_pass(FuseLayerNorm(), m)
    assert r.rewrites == {} and "relax.nn.layer_norm" not in after
    feeds = _feeds()
    assert_close(compile_run(m, feeds)[0], ort_run(m, feeds))


def test_not_fused_when_gamma_varies_along_a_kept_axis():
    # gamma of shape (5, 1) scales rows, not features: not a LayerNorm's gamma
    _, after, r = run_pass(FuseLayerNorm(), decomposed_ln(gamma_shape=(5, 1)))
    # the normalisation alone is still a LayerNorm (without gamma); the row scale stays
    assert r.rewrites == {RULE: 1} and after["relax.multiply"] == 1
    m = decomposed_ln(gamma_shape=(5, 1), beta=False)
    feeds = _feeds()
    assert_close(compile_run(m, feeds)[0], ort_run(m, feeds))


def _instance_norm(t: int):
    c = 6
    inits = {"scale": RNG.uniform(0.5, 1.5, c).astype(np.float32),
             "bias": RNG.normal(0, 0.1, c).astype(np.float32)}
    nodes = [node("InstanceNormalization", ["x", "scale", "bias"], "y", epsilon=1e-5)]
    return model(nodes, {"x": [1, c, t]}, {"y": [1, c, t]}, inits)


def test_instance_norm_becomes_a_layer_norm_with_a_per_channel_affine():
    """TVM imports InstanceNormalization as (x - mean) / sqrt(variance(x) + eps) * s + b,
    s and b per channel: a layer norm over the time axis (its variance two-pass as TVM's
    own), the per-channel affine left as an elementwise epilogue.  wav2vec2's feature
    encoder over 3199 frames: two kernels with scalar reductions (8.9 ms, onnxruntime 1.3
    on emeraldrapids), now one row kernel whose sums are whole vectors then a tail."""
    _, after, r = run_pass(FuseLayerNorm(), _instance_norm(211))
    assert r.rewrites == {RULE: 1} and after["relax.nn.layer_norm"] == 1
    assert "relax.variance" not in after and "relax.mean" not in after
    for t in (211, 3199, 48):  # odd rows (whole chunks + a tail), and whole chunks
        m = _instance_norm(t)
        feeds = {"x": (5 + 3 * RNG.standard_normal((1, 6, t))).astype(np.float32)}
        outs, cm = compile_run(m, feeds)
        assert cm.report["schedules"].get("cpu.row_reduction") == 1, cm.report["schedules"]
        assert_close(outs, ort_run(m, feeds))


def test_instance_norm_over_a_symbolic_length_becomes_a_layer_norm(tmp_path):
    """The same over a symbolic length (a wav2vec2 export with dynamic samples): the
    normalised axis has no static size, so gamma / beta are ones and zeros of it; one
    artifact on cpu.row_reduction instead of TVM's decomposition under dlight's reduction
    (8.0 -> 2.2 ms for [1, 512, 3199] on znver4), matching onnxruntime at every length."""
    import compiler
    import runtime

    m = _instance_norm(211)
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "frames"
    m.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "frames"
    cm = compiler.compile(m, dims={"frames": (1, 4000, 211)})
    rules = cm.report["schedules"]
    assert rules.get("cpu.row_reduction") == 1, rules
    assert not any(r.startswith("dlight") or r == "fallback" for r in rules), rules
    cm.export(str(tmp_path / "m.so"))
    sess = runtime.load(str(tmp_path / "m.so"))
    for t in (211, 3, 17, 4000):  # (at 1 the variance is 0: eps amplifies rounding)
        feeds = {"x": (5 + 3 * RNG.standard_normal((1, 6, t))).astype(np.float32)}
        assert_close(sess.run(None, feeds), ort_run(m, feeds))


def test_decomposed_layer_norm_over_symbolic_rows_is_fused():
    """A decomposed LayerNorm (exports below opset 17) of a model with a symbolic batch and
    sequence: the normalised axis is static, so it fuses with its gamma / beta as in a
    static model (the rows' symbolic extent kept the pattern from matching at all), and
    matches onnxruntime at several row counts from one build."""
    symbolic_rows_run(decomposed_ln(), "fuse_layer_norm", RULE,
                      ([2, 5, 16], [1, 1, 16], [4, 37, 16]))
