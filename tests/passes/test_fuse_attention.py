"""fuse_attention: softmax(Q @ K^T * scale + mask) @ V => attention(Q, K, V, mask, scale)."""

from __future__ import annotations

import numpy as np

from passes import FuseAttention
from tests.conftest import assert_close, ort_run, zoo_model

from .helpers import compile_run, model, node, report, run_pass

RULE = "softmax(QK^T*s [+ mask])V => attention"
B, N, S, D = 1, 2, 6, 8
RNG = np.random.default_rng(3)


def attention(mask=True, axis=-1, scale_op="Mul"):
    scale = {"Mul": 1 / np.sqrt(D), "Div": np.sqrt(D)}[scale_op]
    nodes = [node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2]), node("MatMul", ["q", "kt"], "qk"),
             node(scale_op, ["qk", "scale"], "scaled")]
    s = "scaled"
    if mask:
        nodes.append(node("Add", ["scaled", "mask"], "masked"))
        s = "masked"
    nodes += [node("Softmax", [s], "p", axis=axis), node("MatMul", ["p", "v"], "out")]
    inputs = {"q": [B, N, S, D], "k": [B, N, S, D], "v": [B, N, S, D]}
    inits = {"scale": np.array(scale, np.float32)}
    if mask:
        inits["mask"] = np.where(np.tril(np.ones((S, S))) > 0, 0, -1e4).astype(np.float32)
    return model(nodes, inputs, {"out": [B, N, S, D]}, inits)


def _feeds():
    return {n: RNG.standard_normal((B, N, S, D)).astype(np.float32) for n in "qkv"}


def test_structure_one_attention_op():
    before, after, r = run_pass(FuseAttention(), attention())
    assert before["relax.matmul"] == 2 and before["relax.nn.softmax"] == 1
    # with a mask Relax names the op attention_bias; q, k, v here are inputs in the heads
    # layout, so their transposes to [B, S, N, D] (and the output's back) stay
    assert after == {"relax.nn.attention_bias": 1, "relax.permute_dims": 4}
    assert r.rewrites == {RULE: 1} and r.nodes == ["qk", "scaled", "masked", "p", "out"]


def test_zoo_transformer_transposes_cancel():
    # Q and V come from Transpose(0,2,1,3), K from Transpose(0,2,3,1): all cancel
    before, after, r = run_pass(FuseAttention(), zoo_model("transformer"))
    assert r.rewrites == {RULE: 1}
    assert after["relax.nn.attention"] == 1 and "relax.nn.softmax" not in after
    # Q, K, V lose their transposes; the output gains one that cancels the model's own
    assert after["relax.permute_dims"] == before["relax.permute_dims"] - 3 + 1


def test_opt_in_numerics_against_onnxruntime():
    feeds = _feeds()
    for m in (attention(), attention(mask=False, scale_op="Div")):
        outs, cm = compile_run(m, feeds)
        assert report(cm, "fuse_attention")["skipped"]          # off by default
        assert_close(outs, ort_run(m, feeds))
        outs, cm = compile_run(m, feeds, required_passes=["fuse_attention"])
        assert report(cm, "fuse_attention")["rewrites"] == {RULE: 1}
        assert_close(outs, ort_run(m, feeds))


def test_opt_in_fewer_kernels_on_the_zoo_transformer():
    m = zoo_model("transformer")
    feeds = {"x": RNG.standard_normal((1, 16, 64)).astype(np.float32)}
    outs, cm = compile_run(m, feeds, required_passes=["fuse_attention"])
    assert_close(outs, ort_run(m, feeds))
    outs_off, cm_off = compile_run(m, feeds)
    assert cm.report["kernels"] < cm_off.report["kernels"]


def test_not_fused_when_softmax_is_not_over_keys():
    m = attention(axis=2)
    _, _, r = run_pass(FuseAttention(), m)
    assert r.rewrites == {}
    feeds = _feeds()
    outs, _ = compile_run(m, feeds, required_passes=["fuse_attention"])
    assert_close(outs, ort_run(m, feeds))
