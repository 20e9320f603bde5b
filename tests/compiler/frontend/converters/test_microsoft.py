"""onnxc's com.microsoft converters (compiler/frontend/converters/microsoft.py) against
onnxruntime, which runs every one of these contrib ops: one-node models over the attribute
variants real exports use, the kernels they reach, and refusals naming node and attribute."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.errors import UnsupportedError

MS = "com.microsoft"
RNG = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(op, inputs: dict, consts=(), n_out=1, outputs=None, ms_opset=True, domain=MS,
           **attrs):
    """A one-node com.microsoft model (or of ``domain``); ``inputs`` name -> array (a name
    starting with '-' is an omitted optional input), ``consts`` the names given as
    initializers."""
    names = ["" if n.startswith("-") else n for n in inputs]
    outs = outputs if outputs is not None else [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, name=f"{op.lower()}_node", **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs.items() if not n.startswith("-") and n not in consts]
    inits = [numpy_helper.from_array(inputs[n], n) for n in consts]
    g = helper.make_graph([node], "g", vis, [helper.make_value_info(o, onnx.TypeProto())
                                             for o in outs if o], inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(MS, 1)] if ms_opset else [])
    return helper.make_model(g, opset_imports=opsets)


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(op, inputs: dict, consts=(), n_out=1, outputs=None, rtol=1e-4, atol=1e-5, **attrs):
    """Compile with onnxc, compare every output with onnxruntime; returns the compiled model."""
    model = _model(op, inputs, consts, n_out, outputs, **attrs)
    return check_model(model, inputs, consts, outputs, n_out, rtol, atol)


def check_model(model, inputs: dict, consts=(), outputs=None, n_out=1, rtol=1e-4, atol=1e-5):
    """``model`` (of one node, over ``inputs``) compiled by onnxc against onnxruntime."""
    feeds = {n: a for n, a in inputs.items() if not n.startswith("-") and n not in consts}
    want = _ort(model, feeds)
    del model.graph.output[:]
    names = [o for o in (outputs if outputs is not None else [f"y{i}" for i in range(n_out)]) if o]
    model.graph.output.extend(helper.make_tensor_value_info(
        o, helper.np_dtype_to_tensor_dtype(w.dtype), w.shape) for o, w in zip(names, want))
    cm = compiler.compile(model)
    got = cm.session().run(None, feeds)
    assert len(got) == len(want)
    for g_, w in zip(got, want):
        assert g_.shape == w.shape and g_.dtype == w.dtype, (g_.shape, w.shape, g_.dtype, w.dtype)
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g_, w)
        else:
            np.testing.assert_allclose(g_, w, rtol=rtol, atol=atol)
    return cm


def refused(op, inputs: dict, *, match: str, consts=(), n_out=1, outputs=None, **attrs):
    """The converter refuses, naming the node and what it refuses (at compile time, or at
    the first run where small integer inputs make onnxc specialise on their values)."""
    model = _model(op, inputs, consts, n_out, outputs, **attrs)
    for vi in model.graph.output:   # any type: the converter refuses before outputs matter
        vi.CopyFrom(helper.make_tensor_value_info(vi.name, onnx.TensorProto.FLOAT, [1]))
    feeds = {n: a for n, a in inputs.items() if not n.startswith("-") and n not in consts}
    with pytest.raises(UnsupportedError, match=match):
        compiler.compile(model).session().run(None, feeds)


def kernels(cm) -> list:
    return [(k["kernel"], k["rule"]) for k in cm.report["kernel_table"]]


# --------------------------------------------------------------------------- #
# Layer norms
# --------------------------------------------------------------------------- #

H = 32


def _sln_inputs(skip_shape=(2, 5, H), bias=True, beta=True):
    d = {"x": randn(2, 5, H), "skip": randn(*skip_shape), "gamma": randn(H),
         "beta" if beta else "-beta": randn(H)}
    if bias:
        d["bias"] = randn(H)
    return d


def test_skip_layer_norm_all_outputs_reach_layer_norm_kernel():
    cm = check("SkipLayerNormalization", _sln_inputs(), consts=("gamma", "beta", "bias"),
               n_out=4, epsilon=1e-5)
    assert ("layer_norm", "cpu.row_reduction") in kernels(cm)


@pytest.mark.parametrize("skip_shape", [(1, 5, H), (5, H)])
def test_skip_layer_norm_broadcast_skip_no_beta_no_bias(skip_shape):
    check("SkipLayerNormalization", _sln_inputs(skip_shape, bias=False, beta=False),
          consts=("gamma",))


def test_skip_layer_norm_sum_output_only():
    """GPT-2's form: outputs (output, '', '', input_skip_bias_sum), default epsilon."""
    check("SkipLayerNormalization", _sln_inputs(bias=False), consts=("gamma", "beta"),
          outputs=["y0", "", "", "y3"])


def _symbolic(model, names):
    """``model`` with dims 0 and 1 of inputs ``names`` and of every output symbolic."""
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name in names or vi in model.graph.output:
            dims = vi.type.tensor_type.shape.dim
            for k, sym in enumerate(("batch", "seq")[:max(len(dims) - 1, 0)]):
                dims[k].ClearField("dim_value")
                dims[k].dim_param = sym
    return model


@pytest.mark.parametrize("op,extra", [
    ("SkipLayerNormalization", {"beta": randn(H), "bias": randn(H)}),
    ("SkipSimplifiedLayerNormalization", {"bias": randn(H)}),
    ("FusedMatMul", {})])
def test_symbolic_batch_and_sequence_compile_once(op, extra):
    """onnxruntime's optimizer output of a model exported with dynamic (batch, seq) axes:
    the layer-norm family and FusedMatMul read only the rank of their input.  They
    refused a symbolic input ('of a shape not known at compile time'), so the whole
    optimized BERT compiled per shape."""
    if op == "FusedMatMul":
        inputs, consts, attrs = {"x": randn(2, 5, H), "w": randn(16, H)}, ("w",), \
            {"transB": 1, "alpha": 0.5}
    else:
        inputs = {"x": randn(2, 5, H), "skip": randn(2, 5, H), "gamma": randn(H), **extra}
        consts, attrs = ("gamma", *extra), {"epsilon": 1e-5}
    model = _model(op, inputs, consts, outputs=["y0"], **attrs)
    del model.graph.output[:]
    n = 16 if op == "FusedMatMul" else H
    model.graph.output.append(helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2, 5, n]))
    model = _symbolic(model, {"x", "skip"})
    cm = compiler.compile(model, dims={"batch": (1, 4, 1), "seq": (1, 64, 16)})
    assert "kernel_table" in cm.report  # one artifact, not a per-shape build
    sess = cm.session()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, t in ((1, 1), (2, 7), (4, 64)):
        feeds = {"x": randn(b, t, H)}
        if op != "FusedMatMul":
            feeds["skip"] = randn(b, t, H)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0],
                                   rtol=1e-4, atol=1e-5)


def test_skip_simplified_layer_norm():
    d = {"x": randn(2, 5, H), "skip": randn(2, 5, H), "gamma": randn(H), "bias": randn(H)}
    check("SkipSimplifiedLayerNormalization", d, consts=("gamma", "bias"),
          outputs=["y0", "", "y2", "y3"], epsilon=1e-6)


def test_skip_simplified_layer_norm_mean_output_refused():
    d = {"x": randn(2, 5, H), "skip": randn(2, 5, H), "gamma": randn(H)}
    refused("SkipSimplifiedLayerNormalization", d, consts=("gamma",), n_out=2,
            match="skipsimplifiedlayernormalization_node.*output 'mean'")


def test_skip_simplified_layer_norm_named_but_unread_mean():
    """transformers' OnnxExporter(ort_fusions="cpu") (onnxscript's fusions) names every
    output of its SkipSimplifiedLayerNormalization nodes; nothing reads mean or
    inv_std_var.  Only a mean that is read is refused (Mistral, Llama were)."""
    d = {"x": randn(2, 5, H), "skip": randn(2, 5, H), "gamma": randn(H)}
    model = _model("SkipSimplifiedLayerNormalization", d, consts=("gamma",),
                   outputs=["y0", "mean", "inv", "y3"], epsilon=1e-6)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 5, H])
                              for o in ("y0", "y3"))
    feeds = {"x": d["x"], "skip": d["skip"]}
    got = compiler.compile(model).session().run(None, feeds)
    for g, w in zip(got, _ort(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis,n_out,dtype", [(-1, 1, np.float32), (1, 2, np.float32),
                                              (-2, 2, np.float16)])
def test_simplified_layer_norm_default_domain(axis, n_out, dtype):
    """onnxruntime's SimplifiedLayerNormalization, which its optimizers write in the default
    domain (no ONNX schema: read leniently), as RMSNorm over axes axis..-1; float16 is
    computed in float32 (stash_type 1)."""
    d = {"x": randn(2, 5, H, scale=3.0).astype(dtype), "gamma": randn(5, H).astype(dtype)}
    if axis == -1:
        d["gamma"] = randn(H).astype(dtype)
    model = _model("SimplifiedLayerNormalization", d, consts=("gamma",), n_out=n_out,
                   ms_opset=False, domain="", axis=axis, epsilon=1e-5)
    tol = 2e-3 if dtype == np.float16 else 1e-4
    cm = check_model(model, d, ("gamma",), n_out=n_out, rtol=tol, atol=tol)
    assert "rms_norm" in " ".join(k for k, _ in kernels(cm))
    assert any("SimplifiedLayerNormalization" in w and "onnxruntime registers" in w
               for w in cm.report["warnings"])


def _embed_inputs(mask=True, segment=True, position_ids=None):
    b, s, vocab = 2, 6, 20
    d = {"ids": RNG.integers(0, vocab, (b, s)).astype(np.int32)}
    d["seg" if segment else "-seg"] = RNG.integers(0, 2, (b, s)).astype(np.int32)
    d.update(word=randn(vocab, H), pos=randn(16, H))
    d["segtab" if segment else "-segtab"] = randn(2, H)
    d.update(gamma=randn(H), beta=randn(H))
    if mask or position_ids is not None:
        d["mask" if mask else "-mask"] = np.array([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 1]],
                                                  np.int32)
    if position_ids is not None:
        d["posids"] = position_ids
    return d


def test_embed_layer_norm_mask_index_and_sum():
    d = _embed_inputs()
    cm = check("EmbedLayerNormalization", d, consts=("word", "pos", "segtab", "gamma", "beta"),
               n_out=3, epsilon=1e-12)
    assert ("layer_norm", "cpu.row_reduction") in kernels(cm)


def test_embed_layer_norm_mask_index_counts_ones():
    """mask_index counts the mask's entries equal to 1, as onnxruntime does (the ORT-optimized
    DistilBERT fed a mask of other values: its row sums gave a different attention)."""
    d = _embed_inputs()
    d["mask"] = np.array([[1, 2, 1, 0, 3, 1], [-1, 1, 7, 1, 0, 1]], np.int32)
    check("EmbedLayerNormalization", d, consts=("word", "pos", "segtab", "gamma", "beta"),
          n_out=2, epsilon=1e-12)


def test_embed_layer_norm_no_segment_no_mask():
    check("EmbedLayerNormalization", _embed_inputs(mask=False, segment=False),
          consts=("word", "pos", "gamma", "beta"), n_out=2)


def test_embed_layer_norm_position_ids():
    pos = RNG.integers(0, 16, (2, 6)).astype(np.int32)
    check("EmbedLayerNormalization", _embed_inputs(position_ids=pos),
          consts=("word", "pos", "segtab", "gamma", "beta"), n_out=2)


def test_embed_layer_norm_mask_index_type_refused():
    refused("EmbedLayerNormalization", _embed_inputs(), n_out=2, mask_index_type=2,
            consts=("word", "pos", "segtab", "gamma", "beta"),
            match="embedlayernormalization_node.*mask_index_type=2")


# --------------------------------------------------------------------------- #
# Activations, elementwise, FusedMatMul
# --------------------------------------------------------------------------- #


def test_gelu():
    cm = check("Gelu", {"x": randn(3, 40, scale=3)})
    assert any("gelu" in k for k, _ in kernels(cm))


def test_bias_gelu():
    check("BiasGelu", {"x": randn(2, 4, 40, scale=3), "b": randn(40)}, consts=("b",))


@pytest.mark.parametrize("bias", [True, False])
def test_fast_gelu(bias):
    d = {"x": randn(2, 4, 40, scale=3)}
    if bias:
        d["b"] = randn(40)
    check("FastGelu", d, consts=("b",) if bias else ())


@pytest.mark.parametrize("alpha", [None, 1.0])
def test_quick_gelu(alpha):
    check("QuickGelu", {"x": randn(3, 40, scale=3)}, **({} if alpha is None else {"alpha": alpha}))


def test_bias_add():
    """onnxruntime runs BiasAdd on CUDA only: checked against numpy."""
    x, b, skip = randn(2, 9, 16), randn(16), randn(2, 9, 16)
    model = _model("BiasAdd", {"x": x, "b": b, "skip": skip}, consts=("b",))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(
        "y0", onnx.TensorProto.FLOAT, [2, 9, 16]))
    got = compiler.compile(model).session().run(None, {"x": x, "skip": skip})[0]
    np.testing.assert_allclose(got, x + b + skip, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ta,tb,alpha", [(0, 0, 1.0), (1, 0, 0.5), (0, 1, 0.125), (1, 1, 2.0)])
def test_fused_matmul(ta, tb, alpha):
    a = randn(2, 3, 8, 6) if ta else randn(2, 3, 6, 8)
    b = randn(2, 3, 5, 8) if tb else randn(2, 3, 8, 5)
    check("FusedMatMul", {"a": a, "b": b}, transA=ta, transB=tb, alpha=alpha)


def test_fused_matmul_broadcast_constant_weight():
    check("FusedMatMul", {"a": randn(2, 7, 16), "w": randn(12, 16)}, consts=("w",), transB=1,
          alpha=0.25)


def test_fused_matmul_trans_batch_refused():
    refused("FusedMatMul", {"a": randn(2, 3, 4), "b": randn(2, 4, 5)}, transBatchA=1,
            match="fusedmatmul_node.*transBatchA=1")


# --------------------------------------------------------------------------- #
# FusedConv / FusedGemm: what onnxruntime's optimizer saves (ORT_ENABLE_EXTENDED)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("activation,params", [
    ("Relu", None), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]), ("HardSigmoid", [0.3, 0.4]),
    ("Sigmoid", None), ("Tanh", None), (None, None)])
def test_fused_conv_activations(activation, params):
    attrs = {"pads": [1, 1, 1, 1]}
    if activation is not None:
        attrs["activation"] = activation
    if params is not None:
        attrs["activation_params"] = params
    cm = check("FusedConv", {"x": randn(1, 8, 9, 7), "w": randn(16, 8, 3, 3, scale=0.2),
                             "b": randn(16)}, consts=("w", "b"), **attrs)
    assert [r for _, r in kernels(cm)].count("cpu.conv2d_nchwc") + \
        [r for _, r in kernels(cm)].count("cpu.conv2d_packed") == 1, kernels(cm)


@pytest.mark.parametrize("group,strides,auto_pad", [(1, [2, 2], "SAME_UPPER"),
                                                    (8, [1, 1], "NOTSET")])
def test_fused_conv_sum_input_groups_strides(group, strides, auto_pad):
    """The 4th input Z (onnxruntime's Conv + Add fusion) is added before the activation."""
    out_hw = (5, 4) if strides == [2, 2] else (9, 7)
    check("FusedConv", {"x": randn(1, 8, 9, 7), "w": randn(8, 8 // group, 3, 3, scale=0.3),
                        "b": randn(8), "z": randn(1, 8, *out_hw)}, consts=("w", "b"),
          activation="Relu", group=group, strides=strides, auto_pad=auto_pad,
          **({"pads": [1, 1, 1, 1]} if auto_pad == "NOTSET" else {}))


def test_fused_conv_no_bias():
    check("FusedConv", {"x": randn(1, 4, 6, 6), "w": randn(6, 4, 1, 1)}, consts=("w",),
          activation="Relu")


def test_fused_conv_unknown_activation_refused():
    refused("FusedConv", {"x": randn(1, 4, 6, 6), "w": randn(6, 4, 1, 1)}, consts=("w",),
            activation="Softsign", match="fusedconv_node.*fused activation 'Softsign'")


@pytest.mark.parametrize("activation,extra", [
    ("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.3}), ("Tanh", {}),
    ("HardSigmoid", {"activation_alpha": 0.25, "activation_beta": 0.6})])
def test_fused_gemm(activation, extra):
    check("FusedGemm", {"a": randn(5, 12), "w": randn(7, 12), "c": randn(7)}, consts=("w", "c"),
          transB=1, alpha=0.5, beta=2.0, activation=activation, **extra)


def test_fused_gemm_unused_parameter_refused():
    refused("FusedGemm", {"a": randn(5, 12), "w": randn(12, 7)}, consts=("w",),
            activation="Relu", activation_gamma=1.5,
            match="fusedgemm_node.*activation_gamma for activation 'Relu'")


def _ort_saved_cnn(tmp_path, level):
    """(the zoo CNN's path, the model onnxruntime saves of it at optimization ``level``)."""
    from tests.conftest import zoo_model

    src = tmp_path / "cnn.onnx"
    onnx.save(zoo_model("cnn"), str(src))
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(tmp_path / "cnn_saved.onnx")
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return src, onnx.load(so.optimized_model_filepath)


def test_onnxruntime_extended_optimized_cnn_compiles(tmp_path):
    """A model onnxruntime saved at ORT_ENABLE_EXTENDED (Conv + ReLU, Conv + Add + ReLU as
    FusedConv) compiles and matches onnxruntime on the original."""
    src, opt = _ort_saved_cnn(tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    assert any(n.op_type == "FusedConv" for n in opt.graph.node)
    cm = compiler.compile(opt)
    sess = cm.session()
    i = sess.get_inputs()[0]
    x = randn(*i.shape)
    want = _ort(onnx.load(str(src)), {i.name: x})
    for g_, w in zip(sess.run(None, {i.name: x}), want):
        np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-4)


def test_onnxruntime_all_level_layout_ops_refused_with_advice(tmp_path):
    """ORT_ENABLE_ALL saves com.microsoft.nchwc ops with weights reordered for the saving
    CPU's block size: refused, saying so and what to give onnxc instead."""
    _, opt = _ort_saved_cnn(tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    if not any(n.domain == "com.microsoft.nchwc" for n in opt.graph.node):
        pytest.skip("onnxruntime applies no NCHWc layout on this CPU")
    with pytest.raises(UnsupportedError, match="(?s)ReorderOutput.*ORT_ENABLE_ALL.*"
                                               "ORT_ENABLE_EXTENDED"):
        compiler.compile(opt)


# --------------------------------------------------------------------------- #
# Attention
# --------------------------------------------------------------------------- #

B, S, N, D = 2, 6, 4, 32


@pytest.mark.parametrize("mask", [
    None,
    np.array([6, 3], np.int32),                                              # lengths
    np.array([6, 4, 0, 2], np.int32),                                        # ends, starts
    np.array([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 1]], np.int32),            # raw (B, T)
    (RNG.random((B, S, S)) > 0.3).astype(np.int32),                          # (B, S, T)
], ids=["none", "lengths", "ends_starts", "raw2d", "raw3d"])
def test_attention_mask_forms(mask):
    d = {"x": randn(B, S, D), "w": randn(D, 3 * D, scale=0.3), "b": randn(3 * D)}
    if mask is not None:
        d["mask"] = mask
    check("Attention", d, consts=("w", "b"), num_heads=N)


def test_attention_unidirectional_scale_filter_and_attention_bias():
    d = {"x": randn(B, S, D), "w": randn(D, 3 * D, scale=0.3), "b": randn(3 * D),
         "mask": np.array([5, 6], np.int32), "-past": None, "ab": randn(1, N, S, S)}
    check("Attention", d, consts=("w", "b"), num_heads=N, unidirectional=1, scale=0.2,
          mask_filter_value=-1e4)


def test_attention_past_present_unidirectional():
    p = 3
    d = {"x": randn(B, S, D), "w": randn(D, 3 * D, scale=0.3), "b": randn(3 * D),
         "mask": np.ones((B, p + S), np.int32), "past": randn(2, B, N, p, D // N)}
    check("Attention", d, consts=("w", "b"), n_out=2, num_heads=N, unidirectional=1)


def test_attention_qkv_hidden_sizes_and_weights_as_input():
    sizes = [D, D, 2 * D]
    d = {"x": randn(B, S, D), "w": randn(D, sum(sizes), scale=0.3), "b": randn(sum(sizes))}
    check("Attention", d, num_heads=N, qkv_hidden_sizes=sizes)


def test_attention_reaches_fused_attention_when_enabled():
    d = {"x": randn(B, S, D), "w": randn(D, 3 * D, scale=0.3), "b": randn(3 * D),
         "mask": np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)}
    model = _model("Attention", {k: v for k, v in d.items()}, consts=("w", "b"), num_heads=N)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(
        "y0", onnx.TensorProto.FLOAT, [B, S, D]))
    cm = compiler.compile(model, required_passes=["fuse_attention"])
    fused = [p for p in cm.report["passes"] if p["name"] == "fuse_attention"][0]
    assert fused["rewrites"] == {"softmax(QK^T*s [+ mask])V => attention": 1}
    assert fused["nodes"] == ["attention_node"]
    feeds = {"x": d["x"], "mask": d["mask"]}
    np.testing.assert_allclose(cm.session().run(None, feeds)[0], _ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attr,value", [("do_rotary", 1), ("past_present_share_buffer", 1)])
def test_attention_refusals(attr, value):
    d = {"x": randn(B, S, D), "w": randn(D, 3 * D), "b": randn(3 * D)}
    refused("Attention", d, consts=("w", "b"), num_heads=N, **{attr: value},
            match=f"attention_node.*{attr}={value}")


@pytest.mark.parametrize("mask", [np.zeros(3 * B + 2, np.int32),
                                  np.ones((B, 1, 8, 8), np.int32)], ids=["3b+2", "4d"])
def test_attention_mask_forms_refused(mask):
    d = {"x": randn(B, S, D), "w": randn(D, 3 * D), "b": randn(3 * D), "mask": mask}
    refused("Attention", d, consts=("w", "b"), num_heads=N,
            match="attention_node.*mask_index of shape")


# --------------------------------------------------------------------------- #
# MultiHeadAttention, RotaryEmbedding, GroupQueryAttention
# --------------------------------------------------------------------------- #

L = 7


def test_mha_separate_qkv_bias_key_padding_mask():
    d = {"q": randn(B, S, D), "k": randn(B, L, D), "v": randn(B, L, 2 * D), "bias": randn(4 * D),
         "kpm": np.array([[1] * 5 + [0] * 2, [1] * 7], np.int32)}
    check("MultiHeadAttention", d, consts=("bias",), num_heads=N)


def test_mha_lengths_mask_attention_bias_scale():
    d = {"q": randn(B, S, D), "k": randn(B, L, D), "v": randn(B, L, D), "-bias": None,
         "kpm": np.array([4, 7], np.int32), "ab": randn(B, 1, S, L)}
    check("MultiHeadAttention", d, num_heads=N, scale=0.3)


def _packed_vs_separate(packed: dict, separate: dict, **attrs):
    """onnxruntime's CPU kernel refuses packed QKV / KV: onnxc on the packed form against
    onnxruntime on the same values unpacked."""
    model = _model("MultiHeadAttention", packed, **attrs)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(
        "y0", onnx.TensorProto.FLOAT, [B, S, D]))
    got = compiler.compile(model).session().run(None, packed)[0]
    want = _ort(_model("MultiHeadAttention", separate, **attrs), separate)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_mha_packed_qkv_unidirectional():
    qkv = randn(B, S, N, 3, D // N)
    q, k, v = [qkv[:, :, :, i].reshape(B, S, D) for i in range(3)]
    _packed_vs_separate({"qkv": qkv}, {"q": q, "k": k, "v": v}, num_heads=N, unidirectional=1)


def test_mha_packed_kv():
    q, kv = randn(B, S, D), randn(B, L, N, 2, D // N)
    k, v = [kv[:, :, :, i].reshape(B, L, D) for i in range(2)]
    _packed_vs_separate({"q": q, "kv": kv}, {"q": q, "k": k, "v": v}, num_heads=N)


def test_mha_past_present():
    p = 3
    d = {"q": randn(B, S, D), "k": randn(B, S, D), "v": randn(B, S, D), "-bias": None,
         "-kpm": None, "-ab": None, "pk": randn(B, N, p, D // N), "pv": randn(B, N, p, D // N)}
    check("MultiHeadAttention", d, n_out=3, num_heads=N, unidirectional=1)


def test_mha_qk_output_refused():
    d = {"q": randn(B, S, D), "k": randn(B, L, D), "v": randn(B, L, D)}
    refused("MultiHeadAttention", d, outputs=["y0", "", "", "qk"], num_heads=N,
            match="multiheadattention_node.*output qk")


def _caches(max_len, half):
    angles = np.arange(max_len)[:, None] / (10000 ** (np.arange(half)[None] / half))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_3d_position_ids(interleaved):
    cos, sin = _caches(32, 4)
    d = {"x": randn(B, S, N * 8), "pos": RNG.integers(0, 32, (B, S)).astype(np.int64),
         "cos": cos, "sin": sin}
    check("RotaryEmbedding", d, consts=("cos", "sin"), interleaved=interleaved)


def test_rotary_4d_offset_partial():
    cos, sin = _caches(32, 4)
    d = {"x": randn(B, N, S, 16), "pos": np.array([5], np.int64), "cos": cos, "sin": sin}
    check("RotaryEmbedding", d, consts=("cos", "sin"), rotary_embedding_dim=8, num_heads=N)


def test_rotary_packed_batching_refused():
    cos, sin = _caches(32, 4)
    d = {"x": randn(B, S, N * 8), "pos": RNG.integers(0, 32, (B, S)).astype(np.int64),
         "cos": cos, "sin": sin}
    refused("RotaryEmbedding", d, consts=("cos", "sin"), is_packed_batching=1,
            match="rotaryembedding_node.*is_packed_batching=1")


NKV, HD = 2, 16  # onnxruntime's CPU GQA wants head sizes of multiples of 16


def _gqa(s, p, packed=False, rotary=False):
    d = {}
    if packed:
        d.update(q=randn(B, s, (N + 2 * NKV) * HD), **{"-k": None, "-v": None})
    else:
        d.update(q=randn(B, s, N * HD), k=randn(B, s, NKV * HD), v=randn(B, s, NKV * HD))
    if p:
        d.update(pk=randn(B, NKV, p, HD), pv=randn(B, NKV, p, HD))
    else:
        d.update(**{"-pk": None, "-pv": None})
    d["seqlens"] = np.full(B, p + s - 1, np.int32)
    d["total"] = np.array(p + s, np.int32)
    if rotary:
        d["cos"], d["sin"] = _caches(32, HD // 2)
    return d


def test_gqa_prompt():
    check("GroupQueryAttention", _gqa(S, 0), n_out=3, num_heads=N, kv_num_heads=NKV)


def test_gqa_decode_with_past_packed_rotary():
    check("GroupQueryAttention", _gqa(1, 5, packed=True, rotary=True), n_out=3, num_heads=N,
          kv_num_heads=NKV, do_rotary=1, consts=("cos", "sin"))


def test_gqa_prompt_right_padding_rotary_interleaved():
    d = _gqa(S, 0, rotary=True)
    d["seqlens"] = np.array([S - 1, 3], np.int32)   # the second sequence has 4 tokens
    cm_inputs = dict(d)
    model = _model("GroupQueryAttention", cm_inputs, consts=("cos", "sin"), num_heads=N,
                   kv_num_heads=NKV, do_rotary=1, rotary_interleaved=1)
    feeds = {k: v for k, v in d.items() if not k.startswith("-") and k not in ("cos", "sin")}
    want = _ort(model, feeds)[0]
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(
        "y0", onnx.TensorProto.FLOAT, list(want.shape)))
    got = compiler.compile(model).session().run(None, feeds)[0]
    # onnxruntime leaves the padded query rows unspecified: compare the valid ones
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1, :4], want[1, :4], rtol=1e-4, atol=1e-5)


def _gqa_shared_buffer_model(max_len: int, s: int = 1):
    """onnxruntime-genai's decoder layer core: x -> q/k/v projections -> GroupQueryAttention
    with rotary, past and present both (B, NKV, max_len, HD) (the shared buffer), seqlens_k
    and total_sequence_length fed per step -> output projection."""
    rng = np.random.default_rng(7)
    w = {n: (rng.standard_normal(shape) * 0.2).astype(np.float32) for n, shape in
         (("wq", (D, N * HD)), ("wk", (D, NKV * HD)), ("wv", (D, NKV * HD)),
          ("wo", (N * HD, D)))}
    w["cos"], w["sin"] = _caches(max_len, HD // 2)
    f, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    cache = [B, NKV, max_len, HD]
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["x", f"w{c}"], [c]) for c in "qkv"] + [
        helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_key", "past_value",
                                                 "seqlens_k", "total_sequence_length",
                                                 "cos", "sin"],
                         ["attn", "present_key", "present_value"], domain="com.microsoft",
                         num_heads=N, kv_num_heads=NKV, do_rotary=1),
        helper.make_node("MatMul", ["attn", "wo"], ["y"])]
    g = helper.make_graph(
        nodes, "gqa_genai",
        [vi("x", f, [B, s, D]), vi("past_key", f, cache), vi("past_value", f, cache),
         vi("seqlens_k", i32, [B]), vi("total_sequence_length", i32, [])],
        [vi("y", f, [B, s, D]), vi("present_key", f, cache), vi("present_value", f, cache)],
        [numpy_helper.from_array(v, n) for n, v in w.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)])


def test_gqa_shared_buffer_decodes_32_steps_like_onnxruntime():
    """A max-length past/present buffer: one static artifact serves every step (only
    seqlens_k's values change); 32 steps through an IOBinding (presents bound back as the
    next pasts), the two sequences of the batch at different lengths (3 tokens apart),
    against onnxruntime fed its own presents.  Rows past a sequence's length are
    unspecified in onnxruntime's present: compared up to seqlens_k."""
    max_len, steps, ahead = 48, 32, 3
    model = _gqa_shared_buffer_model(max_len)
    cm = compiler.compile(model)
    assert isinstance(cm, compiler.CompiledModel) and not cm.report.get("dims")
    sess = cm.session()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    past = np.zeros((B, NKV, max_len, HD), np.float32)
    past[1, :, :ahead] = randn(NKV, ahead, HD)      # sequence 1 holds 3 tokens already
    ours = {"past_key": past, "past_value": past[:, ::-1].copy()}
    theirs = dict(ours)
    b = sess.io_binding()
    for n in ("y", "present_key", "present_value"):
        b.bind_output(n)
    for step in range(steps):
        lens = np.array([step, step + ahead], np.int32)   # seqlens_k: length - 1
        feeds = {"x": randn(B, 1, D), "seqlens_k": lens,
                 "total_sequence_length": np.array(lens.max() + 1, np.int32)}
        for k, v in {**feeds, **ours}.items():
            b.bind_input(k, v)
        sess.run_with_iobinding(b)
        y, pk, pv = b.get_outputs()
        want = ref.run(None, {**feeds, **theirs})
        np.testing.assert_allclose(y, want[0], rtol=1e-4, atol=1e-5)
        for got, exp in ((pk, want[1]), (pv, want[2])):
            for i, n in enumerate(lens):
                np.testing.assert_allclose(got[i, :, :n + 1], exp[i, :, :n + 1], rtol=1e-5,
                                           atol=1e-6)
        ours = {"past_key": pk, "past_value": pv}
        theirs = {"past_key": want[1], "past_value": want[2]}


@pytest.mark.parametrize("attr,value", [("local_window_size", 4), ("softcap", 30.0)])
def test_gqa_refusals(attr, value):
    refused("GroupQueryAttention", _gqa(S, 0), num_heads=N, kv_num_heads=NKV, **{attr: value},
            match=f"groupqueryattention_node.*{attr}={value}")


# --------------------------------------------------------------------------- #
# Registry, opset leniency
# --------------------------------------------------------------------------- #


def test_no_opset_import_is_read_as_version_1_with_a_warning():
    d = {"x": randn(3, 40)}
    model = _model("Gelu", d, ms_opset=False)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(
        "y0", onnx.TensorProto.FLOAT, [3, 40]))
    cm = compiler.compile(model)
    assert any("com.microsoft" in w and "no opset import" in w and "Gelu" in w
               for w in cm.report["warnings"])
    np.testing.assert_allclose(cm.session().run(None, d)[0], _ort(model, d)[0], rtol=1e-4,
                               atol=1e-6)


def test_registry_lists_com_microsoft_ops():
    from compiler.frontend.registry import REGISTRY

    ops = {e.op_type for e in REGISTRY.table() if e.domain == MS}
    assert {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "Gelu", "FastGelu",
            "BiasGelu", "BiasAdd", "QuickGelu", "FusedMatMul", "EmbedLayerNormalization",
            "Attention", "MultiHeadAttention", "RotaryEmbedding",
            "GroupQueryAttention"} <= ops


# --------------------------------------------------------------------------- #
# DynamicQuantizeMatMul, MatMulIntegerToFloat: onto the packed integer matmul kernel
# --------------------------------------------------------------------------- #


def _int8(shape, lo=-64, hi=64, dtype=np.int8):
    # s8 weights within [-64, 64): onnxruntime's AVX2 u8 x s8 kernel saturates past that
    return RNG.integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("per_column,bias", [(False, True), (True, False)])
def test_dynamic_quantize_matmul_reaches_int8_kernel(per_column, bias):
    n = 40
    inputs = {"A": randn(7, 65) + 0.2, "B": _int8((65, n)),
              "b_scale": (np.full(n, 0.02) if per_column else np.array(0.02)).astype(np.float32),
              "b_zero_point": (_int8(n, -2, 3) if per_column else np.array(1, np.int8))}
    inputs["bias" if bias else "-bias"] = randn(n)
    cm = check("DynamicQuantizeMatMul", inputs, consts=[k for k in inputs if k != "A"],
               rtol=1e-4, atol=1e-3)
    assert cm.report["schedules"].get("cpu.matmul_int8") == 1


def test_matmul_integer_to_float_reaches_int8_kernel():
    n = 48
    inputs = {"A": RNG.integers(0, 256, (5, 32)).astype(np.uint8),
              "B": RNG.integers(0, 256, (32, n)).astype(np.uint8),
              "a_scale": np.array(0.05, np.float32), "b_scale": np.array(0.01, np.float32),
              "a_zero_point": np.array(128, np.uint8), "b_zero_point": np.array(120, np.uint8),
              "bias": randn(n)}
    cm = check("MatMulIntegerToFloat", inputs,
               consts=["B", "b_scale", "b_zero_point", "bias"], rtol=1e-5, atol=1e-3)
    assert cm.report["schedules"].get("cpu.matmul_int8") == 1


def test_matmul_integer_to_float_refuses_float_a():
    refused("MatMulIntegerToFloat", {"A": randn(2, 4), "B": _int8((4, 3)),
                                     "a_scale": np.array(1.0, np.float32),
                                     "b_scale": np.array(1.0, np.float32)},
            consts=["B"], match="matmulintegertofloat_node.*input A of type float32")


# --------------------------------------------------------------------------- #
# MatMulNBits (block-quantized weights, dequantized at compile time)
# --------------------------------------------------------------------------- #


def _quantize_nbits(w, bits, block, zp_kind):
    """W [K, N] -> (B [N, k_blocks, blob] uint8, scales [N * k_blocks], zero points) as
    onnxruntime's quantizer lays them out: codes low bits first along K, the last block
    padded with zeros; zp_kind None (symmetric), "uint8" (packed codes) or "float"."""
    k, n = w.shape
    k_blocks = -(-k // block)
    wt = np.zeros((n, k_blocks * block), np.float32)
    wt[:, :k] = w.T
    blocks = wt.reshape(n, k_blocks, block)
    top = (1 << bits) - 1
    if zp_kind is None:
        scale = np.abs(blocks).max(-1) / (1 << (bits - 1)) + 1e-8
        zero = np.full_like(scale, 1 << (bits - 1))
    else:
        lo, hi = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
        scale = (hi - lo) / top + 1e-8
        zero = np.clip(np.round(-lo / scale), 0, top)
    codes = np.clip(np.round(blocks / scale[..., None] + zero[..., None]), 0, top).astype(np.uint8)
    per = 8 // bits

    def pack(c):  # [..., m] codes -> [..., ceil(m / per)] bytes, low bits first
        m = c.shape[-1]
        c = np.concatenate([c, np.zeros((*c.shape[:-1], -m % per), np.uint8)], -1)
        c = c.reshape(*c.shape[:-1], -1, per).astype(np.uint16)
        return (c << (np.arange(per) * bits)).sum(-1).astype(np.uint8)

    b = pack(codes)  # [N, k_blocks, blob]
    if zp_kind == "uint8":
        zp = pack(zero.astype(np.uint8)).reshape(-1)
    elif zp_kind == "float":
        zp = zero.astype(np.float32).reshape(-1)
    else:
        zp = None
    return b, scale.astype(np.float32).reshape(-1), zp


@pytest.mark.parametrize("bits,block,k,n,zp_kind,bias", [
    (4, 32, 64, 48, None, False),
    (4, 32, 80, 40, "uint8", True),    # K not a multiple of the block: last block padded
    (4, 16, 48, 33, "float", False),   # odd N, float zero points
    (8, 32, 64, 40, "uint8", True),
    (2, 16, 32, 24, "uint8", False),
])
def test_matmul_nbits_against_onnxruntime(bits, block, k, n, zp_kind, bias):
    w = randn(k, n)
    b, scales, zp = _quantize_nbits(w, bits, block, zp_kind)
    inputs = {"a": randn(2, 3, k), "b": b, "scales": scales}
    inputs["zp" if zp is not None else "-zp"] = zp if zp is not None else np.zeros(1)
    consts = ["b", "scales"] + (["zp"] if zp is not None else [])
    if bias:
        inputs["-g_idx"] = np.zeros(1)
        inputs["bias"] = randn(n)
        consts.append("bias")
    cm = check("MatMulNBits", inputs, consts=consts, rtol=1e-4, atol=1e-4,
               K=k, N=n, bits=bits, block_size=block)
    assert any(rule == "cpu.matmul_packed" for _, rule in kernels(cm)), kernels(cm)


def test_matmul_nbits_dequantizes_like_the_formula():
    from compiler.frontend.converters.microsoft import dequantize_nbits

    w = randn(40, 24)
    b, scales, zp = _quantize_nbits(w, 4, 16, "uint8")
    got = dequantize_nbits(b, scales, zp, 40, 24, 4, 16)
    assert got.shape == (24, 40)
    np.testing.assert_allclose(got, w.T, atol=np.abs(scales).max() * 0.51)


def test_matmul_nbits_refusals():
    w = randn(32, 16)
    b, scales, _ = _quantize_nbits(w, 4, 32, None)
    base = {"a": randn(2, 32), "b": b, "scales": scales}
    refused("MatMulNBits", base, consts=["scales"], match="input B computed at run time",
            K=32, N=16, bits=4, block_size=32)
    refused("MatMulNBits", dict(base), consts=["b", "scales"], match="bits=3",
            K=32, N=16, bits=3, block_size=32)
    g = dict(base, **{"-zp": np.zeros(1), "g_idx": np.zeros(32, np.int32)})
    refused("MatMulNBits", g, consts=["b", "scales", "g_idx"], match="g_idx",
            K=32, N=16, bits=4, block_size=32)


# --------------------------------------------------------------------------- #
# QOperator-format quantized ops (quantize_static with QuantFormat.QOperator)
# --------------------------------------------------------------------------- #


def check_q(op, inputs: dict, consts=(), **attrs):
    """As ``check`` for 8-bit outputs: within one step of onnxruntime's fixed-point
    kernels (float rounding ties land apart), nearly all equal."""
    model = _model(op, inputs, consts, **attrs)
    feeds = {n: a for n, a in inputs.items() if not n.startswith("-") and n not in consts}
    (want,) = _ort(model, feeds)
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info(
        "y0", helper.np_dtype_to_tensor_dtype(want.dtype), want.shape)])
    cm = compiler.compile(model)
    (got,) = cm.session().run(None, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype.kind in "iu":
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    return cm


def _u8(*shape):
    return RNG.integers(0, 256, shape).astype(np.uint8)


def _qparams(prefix, scale, zero, dtype=np.uint8):
    return {f"{prefix}s": np.array(scale, np.float32), f"{prefix}z": np.array(zero, dtype)}


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("b_shape", [(1, 16, 7, 7), (1, 16, 1, 1)])
def test_qlinear_add_mul(op, b_shape):
    ins = {"a": _u8(1, 16, 7, 7), **_qparams("a", 0.02, 120), "b": _u8(*b_shape),
           **_qparams("b", 0.03, 130), **_qparams("c", 0.05 if op == "QLinearAdd" else 0.4,
                                                   125)}
    check_q(op, ins, consts=[k for k in ins if k not in ("a", "b")])


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(channels_last):
    shape = (1, 7, 7, 32) if channels_last else (1, 32, 7, 7)
    ins = {"x": _u8(*shape), **_qparams("x", 0.02, 110), **_qparams("y", 0.01, 100)}
    check_q("QLinearGlobalAveragePool", ins, consts=[k for k in ins if k != "x"],
            channels_last=channels_last)


@pytest.mark.parametrize("trans_b,per_column,quantized_out", [
    (0, False, True), (1, True, True), (1, True, False)])
def test_qgemm(trans_b, per_column, quantized_out):
    k, n = 64, 24
    b = RNG.integers(-64, 64, (n, k) if trans_b else (k, n)).astype(np.int8)
    bs = (RNG.random(n) * 0.01 + 0.002 if per_column else np.array(0.006)).astype(np.float32)
    ins = {"a": _u8(4, k), **_qparams("a", 0.02, 128), "b": b, "bs": bs,
           "bz": np.zeros(bs.shape, np.int8), "c": RNG.integers(-2000, 2000, n).astype(np.int32)}
    if quantized_out:
        ins.update(_qparams("y", 0.05, 120))
    cm = check_q("QGemm", ins, consts=[x for x in ins if x != "a"], transB=trans_b)
    rules = {r for _, r in kernels(cm)}
    assert "cpu.matmul_int8" in rules, rules     # the integer kernel, as a QDQ MatMul


def test_qlinear_ops_refuse_per_channel_activation_scales():
    ins = {"a": _u8(1, 4, 3, 3), "as": np.full(4, 0.02, np.float32), "az": np.array(120, np.uint8),
           "b": _u8(1, 4, 3, 3), **_qparams("b", 0.03, 130), **_qparams("c", 0.05, 125)}
    refused("QLinearAdd", ins, match="qlinearadd_node.*A_scale of shape \\[4\\]",
            consts=[k for k in ins if k not in ("a", "b")])


def test_qlinear_conv_with_constant_weights_takes_the_integer_kernel():
    """A QOperator conv (constant per-channel s8 weights, int32 bias) becomes the QDQ form,
    which qdq_conv_integer puts on cpu.conv2d_int8: no int32 NCHW conv, which had no CPU
    rule; within one output step of onnxruntime's QLinearConv."""
    c, f = 32, 32
    w = RNG.integers(-64, 64, (f, c, 3, 3)).astype(np.int8)
    ins = {"x": _u8(1, c, 10, 10), **_qparams("x", 0.02, 120), "w": w,
           "ws": (RNG.random(f) * 0.004 + 0.001).astype(np.float32),
           "wz": np.zeros(f, np.int8), **_qparams("y", 0.05, 100),
           "bias": RNG.integers(-1000, 1000, f).astype(np.int32)}
    model = _model("QLinearConv", ins, consts=[k for k in ins if k != "x"], ms_opset=False,
                   pads=[1, 1, 1, 1])
    model.graph.node[0].domain = ""
    feeds = {"x": ins["x"]}
    (want,) = _ort(model, feeds)
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info("y0", onnx.TensorProto.UINT8,
                                                             want.shape)])
    cm = compiler.compile(model)
    assert "cpu.conv2d_int8" in {r for _, r in kernels(cm)}
    (got,) = cm.session().run(None, feeds)
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and diff.mean() < 0.05


# --------------------------------------------------------------------------- #
# QuantizeLinear / DequantizeLinear (onnxruntime's quantizer: 16- and 4-bit types below
# opset 21, or UseQDQContribOps)
# --------------------------------------------------------------------------- #


def _contrib_qdq_conv(act: int, weight: int) -> onnx.ModelProto:
    """x -> Pad (value: a quantized scalar, Q -> DQ of a constant) -> Q / DQ (``act``)
    -> Conv with weights DQ'd per output channel from ``weight`` codes, all contrib Q / DQ."""
    lo, hi = {TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15),
              TensorProto.INT8: (-128, 127)}[weight]
    codes = RNG.integers(lo, hi + 1, (4, 3, 3, 3))
    zp_w = RNG.integers(lo, hi + 1, (4,))
    inits = [helper.make_tensor("w_q", weight, codes.shape, codes.flatten().tolist()),
             helper.make_tensor("w_zp", weight, [4], zp_w.tolist()),
             numpy_helper.from_array(np.array([0.05, 0.02, 0.1, 0.03], np.float32), "w_s"),
             numpy_helper.from_array(np.array(0.01, np.float32), "a_s"),
             helper.make_tensor("a_zp", act, [], [100 if act == TensorProto.UINT16 else -7]),
             numpy_helper.from_array(np.array(0.25, np.float32), "pad_f"),
             helper.make_tensor("pad_zp", TensorProto.UINT8, [], [3]),
             numpy_helper.from_array(np.array(0.05, np.float32), "pad_s"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    nodes = [helper.make_node("QuantizeLinear", ["pad_f", "pad_s", "pad_zp"], ["pad_q"],
                              domain=MS),
             helper.make_node("DequantizeLinear", ["pad_q", "pad_s", "pad_zp"], ["pad_v"],
                              domain=MS),
             helper.make_node("Pad", ["x", "pads", "pad_v"], ["xp"], name="pad"),
             helper.make_node("QuantizeLinear", ["xp", "a_s", "a_zp"], ["xq"], domain=MS),
             helper.make_node("DequantizeLinear", ["xq", "a_s", "a_zp"], ["xd"], domain=MS),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], domain=MS,
                              axis=0),
             helper.make_node("Conv", ["xd", "w"], ["y"], name="conv")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize("act,weight", [(TensorProto.UINT16, TensorProto.INT4),
                                        (TensorProto.INT16, TensorProto.UINT4),
                                        (TensorProto.UINT16, TensorProto.INT8)])
def test_contrib_quantize_dequantize(act, weight):
    """com.microsoft Q / DQ at 16-bit activations and 4-bit per-channel weights (an opset-17
    model, as onnxruntime's quantizer writes for QInt16 / QInt4), and the quantized scalar
    Pad value folded, against onnxruntime."""
    model = _contrib_qdq_conv(act, weight)
    x = randn(1, 3, 6, 6)
    want = _ort(model, {"x": x})[0]
    got = compiler.compile(model).session().run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_contrib_quantize_refuses_opset21_attributes():
    model = _contrib_qdq_conv(TensorProto.UINT16, TensorProto.INT8)
    model.graph.node[3].attribute.append(helper.make_attribute("block_size", 2))
    with pytest.raises(UnsupportedError, match="block_size.*com.microsoft QuantizeLinear"):
        compiler.compile(model)


# --------------------------------------------------------------------------- #
# QOperator-format ops (quantize_static with QuantFormat.QOperator): DQ -> float op -> Q
# --------------------------------------------------------------------------- #


def _q(v, dt=np.uint8):
    return np.array(v, dt)


def qcheck(op, inputs: dict, consts=(), **attrs):
    """onnxc against onnxruntime's fixed-point kernel: within one quantization step."""
    model = _model(op, inputs, consts, **attrs)
    feeds = {n: a for n, a in inputs.items() if n not in consts}
    want = _ort(model, feeds)[0]
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(
        "y0", helper.np_dtype_to_tensor_dtype(want.dtype), want.shape))
    got = compiler.compile(model).session().run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.abs(got.astype(np.int32) - want).max() <= 1
    assert (got == want).mean() > 0.9


def _qx(*shape, dt=np.uint8):
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max, shape).astype(dt)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_leaky_relu_sigmoid(dt):
    z = 128 if dt == np.uint8 else 0
    common = {"x": _qx(2, 8, 5, 5, dt=dt), "xs": _q(0.05, np.float32), "xz": _q(z - 8, dt),
              "ys": _q(0.03, np.float32), "yz": _q(z - 20, dt)}
    qcheck("QLinearLeakyRelu", common, consts=("xs", "xz", "ys", "yz"), alpha=0.1)
    common["ys"], common["yz"] = _q(1 / 256, np.float32), _q(0 if dt == np.uint8 else -128, dt)
    qcheck("QLinearSigmoid", common, consts=("xs", "xz", "ys", "yz"))


@pytest.mark.parametrize("opset,axis", [(13, -1), (11, 1)])
def test_qlinear_softmax(opset, axis):
    d = {"x": _qx(2, 6, 7), "xs": _q(0.1, np.float32), "xz": _q(120),
         "ys": _q(1 / 256, np.float32), "yz": _q(0)}
    qcheck("QLinearSoftmax", d, consts=("xs", "xz", "ys", "yz"), opset=opset, axis=axis)


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_average_pool(channels_last):
    shape = (1, 9, 9, 8) if channels_last else (1, 8, 9, 9)
    d = {"x": _qx(*shape), "xs": _q(0.02, np.float32), "xz": _q(100),
         "ys": _q(0.015, np.float32), "yz": _q(90)}
    qcheck("QLinearAveragePool", d, consts=("xs", "xz", "ys", "yz"), kernel_shape=[3, 3],
           strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0,
           channels_last=channels_last)


def test_qlinear_concat_and_where():
    d = {"ys": _q(0.04, np.float32), "yz": _q(110),
         "a": _qx(1, 3, 4, 4), "as": _q(0.02, np.float32), "az": _q(100),
         "b": _qx(1, 5, 4, 4), "bs": _q(0.05, np.float32), "bz": _q(130)}
    qcheck("QLinearConcat", d, consts=("ys", "yz", "as", "az", "bs", "bz"), axis=1)
    w = {"c": RNG.integers(0, 2, (3, 1, 4)).astype(bool),
         "x": _qx(3, 5, 4), "xs": _q(0.02, np.float32), "xz": _q(100),
         "y": _qx(1, 5, 4), "ys": _q(0.05, np.float32), "yz": _q(130),
         "zs": _q(0.04, np.float32), "zz": _q(110)}
    qcheck("QLinearWhere", w, consts=("xs", "xz", "ys", "yz", "zs", "zz"))


def test_qlinear_softmax_without_opset_refused():
    d = {"x": _qx(2, 6), "xs": _q(0.1, np.float32), "xz": _q(120),
         "ys": _q(1 / 256, np.float32), "yz": _q(0)}
    refused("QLinearSoftmax", d, consts=("xs", "xz", "ys", "yz"),
            match="qlinearsoftmax_node.*'opset'")


def test_q_attention_per_column_weights_and_refusal():
    """QAttention (quantize_dynamic of Attention) with a per-column weight scale and zero
    point, against onnxruntime; a weight scale of another length is refused."""
    d = {"x": _qx(2, 3, 8), "w": _qx(8, 24, dt=np.int8), "bias": randn(24),
         "xs": _q(0.02, np.float32), "ws": (RNG.random(24) * 0.01 + 0.01).astype(np.float32),
         "-mask": np.zeros(1, np.int32), "xz": _q(120), "wz": _qx(24, dt=np.int8)}
    consts = ("w", "bias", "ws", "wz")
    check("QAttention", d, consts=consts, rtol=1e-4, atol=1e-4, num_heads=2)
    d["ws"] = d["ws"][:5]
    refused("QAttention", d, consts=consts, num_heads=2,
            match="qattention_node.*weight_scale of shape \\[5\\]")


def test_qlinear_add_of_a_1d_bias():
    """QLinearAdd of a [B, S, H] activation and a 1-D constant (a transformer's bias after
    onnxruntime's graph optimizer fused a QDQ Add): the 1-D operand dequantizes per tensor."""
    d = {"a": _qx(2, 3, 16), "as": _q(0.02, np.float32), "az": _q(100),
         "b": _qx(16), "bs": _q(0.01, np.float32), "bz": _q(128),
         "ys": _q(0.03, np.float32), "yz": _q(110)}
    qcheck("QLinearAdd", d, consts=("as", "az", "b", "bs", "bz", "ys", "yz"))


def _ort_bert_chain(unidirectional=0, past=False):
    """onnxruntime's optimized BERT / GPT-2 attention block over symbolic (batch, seq
    [, past]) axes: ids -> EmbedLayerNormalization (mask_index = lengths) -> Attention."""
    vocab, heads = 20, N
    consts = {"word": randn(vocab, D), "pos": randn(16, D), "gamma": randn(D),
              "beta": randn(D), "w": randn(D, 3 * D, scale=0.3), "b": randn(3 * D)}
    ins = [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", "seq"]),
           helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "seq"])]
    att_in = ["emb", "w", "b", "" if past else "mi"]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", D])]
    if past:
        ins.append(helper.make_tensor_value_info(
            "past", TensorProto.FLOAT, [2, "batch", heads, "past_seq", D // heads]))
        att_in.append("past")
        outs.append(helper.make_tensor_value_info(
            "present", TensorProto.FLOAT, [2, "batch", heads, "total", D // heads]))
    nodes = [helper.make_node("EmbedLayerNormalization",
                              ["ids", "", "word", "pos", "", "gamma", "beta", "mask"],
                              ["emb", "mi"], domain=MS, name="eln", epsilon=1e-12),
             helper.make_node("Attention", att_in, ["y"] + (["present"] if past else []),
                              domain=MS, name="att", num_heads=heads,
                              unidirectional=unidirectional)]
    g = helper.make_graph(nodes, "g", ins, outs,
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize("unidirectional,past", [(0, False), (1, False), (1, True)])
def test_embed_layer_norm_and_attention_over_symbolic_batch_and_sequence(unidirectional,
                                                                         past):
    """An ORT-optimized BERT (or GPT-2, with its past) exported with dynamic axes compiles
    once: both ops refused a symbolic input shape and the model compiled per shape.  The
    position table's 16 rows cap seq at 16 (a warning; run() refuses more)."""
    model = _ort_bert_chain(unidirectional, past)
    dims = {"batch": (1, 3, 1), "seq": (1, 32, 8)}
    if past:
        dims["past_seq"] = (0, 8, 4)
    cm = compiler.compile(model, dims=dims)
    assert "kernel_table" in cm.report  # one artifact, not a per-shape build
    assert any("seq" in w and "16" in w for w in cm.report["warnings"])
    sess = cm.session()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for b, s in ((1, 1), (2, 5), (3, 16)):
        feeds = {"ids": rng.integers(0, 20, (b, s)).astype(np.int32),
                 "mask": np.ones((b, s), np.int32)}
        feeds["mask"][0, s // 2 + 1:] = 0
        if past:
            feeds["past"] = randn(2, b, N, 3, D // N)
        for got, want in zip(sess.run(None, feeds), ref.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="seq"):
        sess.run(None, {"ids": np.zeros((1, 17), np.int32), "mask": np.ones((1, 17), np.int32),
                        **({"past": randn(2, 1, N, 3, D // N)} if past else {})})


def test_embed_layer_norm_ids_past_the_table_are_refused_by_the_session():
    """onnxruntime refuses ids past EmbedLayerNormalization's tables ("input index out of
    range"); the session does too, naming the node, also through a Cast to int32 (what the
    optimizer writes in front of it), and bench feeds ids within the table."""
    model = _ort_bert_chain()
    g = model.graph
    g.input[0].type.tensor_type.elem_type = TensorProto.INT64
    g.node.insert(0, helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32))
    g.node[1].input[0] = "ids32"
    sess = compiler.compile(model, dims={"batch": (1, 2, 1), "seq": (1, 8, 8)}).session()
    feeds = {"ids": np.full((1, 4), 19, np.int64), "mask": np.ones((1, 4), np.int32)}
    sess.run(None, feeds)
    feeds["ids"][0, 2] = 20
    with pytest.raises(ValueError, match="'eln'.*EmbedLayerNormalization.*\\[0, 19\\]"):
        sess.run(None, feeds)


def _symbolic_dims(model, names: dict):
    """Set ``model``'s input / output dims to dim_params: {tensor: {axis: name}}."""
    for vi in list(model.graph.input) + list(model.graph.output):
        for axis, name in names.get(vi.name, {}).items():
            d = vi.type.tensor_type.shape.dim[axis]
            d.ClearField("dim_value")
            d.dim_param = name
    return model


def test_gqa_symbolic_batch_sequence_and_past_compile_once():
    """A GroupQueryAttention decoder exported with dynamic (batch, seq, past) axes compiles
    to one artifact that serves prompts and steps: it refused a symbolic query shape and
    compiled per shape."""
    d = _gqa(S, 5, rotary=True)
    model = _model("GroupQueryAttention", d, consts=("cos", "sin"), n_out=3, num_heads=N,
                   kv_num_heads=NKV, do_rotary=1)
    del model.graph.output[:]
    f = onnx.TensorProto.FLOAT
    model.graph.output.extend([
        helper.make_tensor_value_info("y0", f, ["batch", "seq", N * HD]),
        helper.make_tensor_value_info("y1", f, ["batch", NKV, "total", HD]),
        helper.make_tensor_value_info("y2", f, ["batch", NKV, "total", HD])])
    _symbolic_dims(model, {"q": {0: "batch", 1: "seq"}, "k": {0: "batch", 1: "seq"},
                           "v": {0: "batch", 1: "seq"}, "pk": {0: "batch", 2: "past"},
                           "pv": {0: "batch", 2: "past"}, "seqlens": {0: "batch"}})
    cm = compiler.compile(model, dims={"batch": (1, 2, 1), "seq": (1, 16, 1),
                                       "past": (1, 24, 8)})
    assert "kernel_table" in cm.report  # one artifact, not a per-shape build
    sess = cm.session()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s, p in ((1, 1, 1), (1, 7, 3), (2, 1, 24), (1, 16, 9)):  # onnxruntime: b 1 when s > 1
        feeds = {"q": randn(b, s, N * HD), "k": randn(b, s, NKV * HD),
                 "v": randn(b, s, NKV * HD), "pk": randn(b, NKV, p, HD),
                 "pv": randn(b, NKV, p, HD), "seqlens": np.full(b, p + s - 1, np.int32),
                 "total": np.array(p + s, np.int32)}
        for got, want in zip(sess.run(None, feeds), ref.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gqa_shared_buffer_prompt_and_steps_from_one_symbolic_artifact():
    """onnxruntime-genai's shared past/present buffer with a symbolic sequence: the
    prompt (5 tokens) and the decode steps after it run from one artifact."""
    max_len = 32
    model = _gqa_shared_buffer_model(max_len)
    _symbolic_dims(model, {"x": {1: "seq"}, "y": {1: "seq"}})
    cm = compiler.compile(model, dims={"seq": (1, 8, 1)})
    assert "kernel_table" in cm.report
    sess = cm.session()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    past = np.zeros((B, NKV, max_len, HD), np.float32)
    ours = theirs = {"past_key": past, "past_value": past}
    done = 0
    for s in (5, 1, 1, 1):
        lens = np.full(B, done + s - 1, np.int32)
        feeds = {"x": randn(B, s, D), "seqlens_k": lens,
                 "total_sequence_length": np.array(done + s, np.int32)}
        y, pk, pv = sess.run(None, {**feeds, **ours})
        want = ref.run(None, {**feeds, **theirs})
        np.testing.assert_allclose(y, want[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(pk[:, :, :done + s], want[1][:, :, :done + s],
                                   rtol=1e-5, atol=1e-6)
        ours = {"past_key": pk, "past_value": pv}
        theirs = {"past_key": want[1], "past_value": want[2]}
        done += s


@pytest.mark.parametrize("form", ["cross_attention_mask", "decoder_past"])
def test_mha_symbolic_dims_compile_once(form):
    """MultiHeadAttention (onnxruntime's optimizer output for encoder-decoder and CLIP-style
    models) over symbolic batch / sequence / key lengths: one artifact, against
    onnxruntime at several shapes (it refused a symbolic query shape)."""
    f, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    vi = helper.make_tensor_value_info
    if form == "cross_attention_mask":
        ins = [vi("q", f, ["batch", "seq", D]), vi("k", f, ["batch", "kv", D]),
               vi("v", f, ["batch", "kv", D]), vi("kpm", i32, ["batch", "kv"])]
        names, outs, attrs = ["q", "k", "v", "", "kpm"], ["y0"], {}
        dims = {"batch": (1, 3, 1), "seq": (1, 16, 4), "kv": (1, 24, 8)}
        shapes = [(1, 1, 1), (2, 5, 9), (3, 16, 24)]
    else:
        ins = [vi("q", f, ["batch", "seq", D]), vi("k", f, ["batch", "seq", D]),
               vi("v", f, ["batch", "seq", D]), vi("pk", f, ["batch", N, "past", D // N]),
               vi("pv", f, ["batch", N, "past", D // N])]
        names, outs, attrs = ["q", "k", "v", "", "", "", "pk", "pv"], ["y0", "y1", "y2"], \
            {"unidirectional": 1}
        dims = {"batch": (1, 3, 1), "seq": (1, 16, 1), "past": (1, 24, 8)}
        shapes = [(1, 1, 1), (2, 5, 9), (3, 1, 24)]
    node = helper.make_node("MultiHeadAttention", names, outs, domain=MS, num_heads=N,
                            name="mha", **attrs)
    out_vis = [vi("y0", f, ["batch", "seq", D])] + [
        vi(o, f, ["batch", N, "total", D // N]) for o in outs[1:]]
    model = helper.make_model(helper.make_graph([node], "g", ins, out_vis),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid(MS, 1)])
    cm = compiler.compile(model, dims=dims)
    assert "kernel_table" in cm.report  # one artifact, not a per-shape build
    sess = cm.session()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s, l in shapes:
        if form == "cross_attention_mask":
            kpm = np.ones((b, l), np.int32)
            kpm[0, l // 2 + 1:] = 0
            feeds = {"q": randn(b, s, D), "k": randn(b, l, D), "v": randn(b, l, D), "kpm": kpm}
        else:
            feeds = {"q": randn(b, s, D), "k": randn(b, s, D), "v": randn(b, s, D),
                     "pk": randn(b, N, l, D // N), "pv": randn(b, N, l, D // N)}
        for got, want in zip(sess.run(None, feeds), ref.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
