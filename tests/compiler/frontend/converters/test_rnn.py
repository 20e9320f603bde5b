"""onnxc's sequence converters (compiler/frontend/converters/rnn.py: RotaryEmbedding,
CausalConvWithState, LinearAttention, RNN/GRU/LSTM) against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.errors import CompileError, UnsupportedError

F, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
U8, I8, I32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _check(op, inputs: dict, n_out=1, opset=22, rtol=1e-4, atol=1e-5, **attrs):
    """Build a one-node model from ``inputs`` (name -> array; '' for an omitted one), take
    its output shapes from the reference and compare onnxc with it."""
    names = list(inputs)
    elem = {np.float32: F, np.float16: F16, np.int64: I64, np.uint8: U8, np.int8: I8,
            np.int32: I32, np.bool_: TensorProto.BOOL, np.float64: TensorProto.DOUBLE,
            np.uint32: TensorProto.UINT32, np.int16: TensorProto.INT16,
            np.uint16: TensorProto.UINT16}
    vis = [_vi(n, elem[a.dtype.type], list(a.shape)) for n, a in inputs.items() if n]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    g = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: a for n, a in inputs.items() if n}
    want = ReferenceEvaluator(model).run(None, feeds)
    del model.graph.output[:]
    model.graph.output.extend(_vi(o, elem[np.asarray(w).dtype.type], list(np.shape(w)))
                              for o, w in zip(outs, want))
    got = compiler.compile(model).session().run(None, feeds)
    for g_, w in zip(got, want):
        w = np.asarray(w)
        assert g_.shape == w.shape and g_.dtype == w.dtype
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g_, w)
        else:
            np.testing.assert_allclose(g_, w, rtol=rtol, atol=atol)
    return got


RNG = np.random.default_rng(0)


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# --- RotaryEmbedding ------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
def test_rotary_embedding_4d_position_ids(interleaved, rot_dim):
    half = (rot_dim or 8) // 2
    _check("RotaryEmbedding", {"x": _f(2, 3, 5, 8), "cos": _f(16, half), "sin": _f(16, half),
                               "pos": RNG.integers(0, 16, (2, 5)).astype(np.int64)},
           opset=23, interleaved=interleaved, rotary_embedding_dim=rot_dim)


def test_rotary_embedding_no_position_ids():
    _check("RotaryEmbedding", {"x": _f(1, 2, 3, 8), "cos": _f(1, 3, 4), "sin": _f(1, 3, 4)},
           opset=23)


def test_rotary_embedding_refuses_3d_without_heads():
    x = _vi("x", F, [1, 3, 8])
    node = helper.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"])
    g = helper.make_graph([node], "g", [x, _vi("c", F, [1, 3, 4]), _vi("s", F, [1, 3, 4])],
                          [_vi("y", F, [1, 3, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises((UnsupportedError, CompileError), match="num_heads"):
        compiler.compile(m)


# --- CausalConvWithState --------------------------------------------------------------


@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("past", [False, True])
def test_causal_conv_with_state(act, past):
    ins = {"x": _f(2, 4, 6), "w": _f(4, 1, 3), "b": _f(4)}
    if past:
        ins["past"] = _f(2, 4, 2)
    _check("CausalConvWithState", ins, n_out=2, opset=27, activation=act)


def test_causal_conv_with_state_fp16_silu():
    _check("CausalConvWithState", {"x": _f(1, 2, 5, dtype=np.float16),
                                   "w": _f(2, 1, 3, dtype=np.float16)},
           n_out=2, opset=27, rtol=1e-3, atol=1e-3, activation="silu")


# --- LinearAttention ------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_rules_gqa(rule):
    b, t, hq, hkv, dk, dv = 2, 3, 4, 2, 4, 3
    ins = {"q": _f(b, t, hq * dk), "k": _f(b, t, hkv * dk) * 0.5, "v": _f(b, t, hkv * dv),
           "past": _f(b, hkv, dk, dv)}
    ins["decay"] = -np.abs(_f(b, t, hkv)) if rule.startswith("gated") else None
    ins["beta"] = 1 / (1 + np.exp(-_f(b, t, 1))) if "delta" in rule else None
    _linear_attention_with_gaps({n: a for n, a in ins.items() if a is not None},
                                hq, hkv, rule)


def _linear_attention_with_gaps(ins, hq, hkv, rule):
    # optional inputs in positional order: q, k, v, past_state, decay, beta
    order = ["q", "k", "v", "past", "decay", "beta"]
    given = ins
    names = [n if n in given else "" for n in order]
    while names and names[-1] == "":
        names.pop()
    elem = {np.float32: F}
    vis = [_vi(n, elem[given[n].dtype.type], list(given[n].shape)) for n in names if n]
    node = helper.make_node("LinearAttention", names, ["y", "state"], q_num_heads=hq,
                            kv_num_heads=hkv, update_rule=rule)
    g = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info("y"),
                                             helper.make_empty_tensor_value_info("state")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 27)])
    want = ReferenceEvaluator(model).run(None, given)
    del model.graph.output[:]
    model.graph.output.extend(_vi(o, F, list(w.shape)) for o, w in zip(["y", "state"], want))
    got = compiler.compile(model).session().run(None, given)
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-5)


# --- RNN / GRU / LSTM -----------------------------------------------------------------


def _rnn_inputs(kind, seq, batch, inp, hidden, n_dir, bias=True, init=True, lens=None,
                peep=False):
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    ins = {"X": _f(seq, batch, inp), "W": _f(n_dir, g * hidden, inp) * 0.5,
           "R": _f(n_dir, g * hidden, hidden) * 0.5}
    ins["B"] = _f(n_dir, 2 * g * hidden) if bias else None
    ins["sequence_lens"] = lens
    ins["initial_h"] = _f(n_dir, batch, hidden) if init else None
    if kind == "LSTM":
        ins["initial_c"] = _f(n_dir, batch, hidden) if init else None
        ins["P"] = _f(n_dir, 3 * hidden) if peep else None
    names = [n if a is not None else "" for n, a in ins.items()]
    while names[-1] == "":
        names.pop()
    return {("" if a is None else n): a for n, a in ins.items()}, names


def _check_rnn(kind, direction="forward", layout=0, n_out=2, **kw):
    n_dir = 2 if direction == "bidirectional" else 1
    ins, names = _rnn_inputs(kind, 4, 3, 2, 5, n_dir, **kw)
    given = {n: a for n, a in ins.items() if n}
    if layout:
        given["X"] = np.ascontiguousarray(given["X"].transpose(1, 0, 2))
        for n in ("initial_h", "initial_c"):
            if n in given:
                given[n] = np.ascontiguousarray(given[n].transpose(1, 0, 2))
    elem = {np.float32: F, np.int32: I32}
    vis = [_vi(n, elem[given[n].dtype.type], list(given[n].shape)) for n in names if n]
    outs = ["Y", "Y_h", "Y_c"][:n_out]
    node = helper.make_node(kind, names, outs, hidden_size=5, direction=direction,
                            layout=layout)
    g = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info(o)
                                             for o in outs])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])
    want = ReferenceEvaluator(model).run(None, given)
    del model.graph.output[:]
    model.graph.output.extend(_vi(o, F, list(w.shape)) for o, w in zip(outs, want))
    got = compiler.compile(model).session().run(None, given)
    for g_, w in zip(got, want):
        assert g_.shape == w.shape
        np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_directions(kind, direction):
    _check_rnn(kind, direction, n_out=3 if kind == "LSTM" else 2)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_recurrent_layout1_no_bias_no_initial_state(kind):
    _check_rnn(kind, layout=1, bias=False, init=False)


def test_lstm_peepholes():
    _check_rnn("LSTM", peep=True, n_out=3)


def test_recurrent_sequence_lens_masks_steps():
    """Steps at or past a batch entry's length keep its state and output 0 (the reference
    ignores sequence_lens, so this is checked against full-length runs)."""
    lens = np.array([4, 2, 1], np.int32)
    ins, names = _rnn_inputs("GRU", 4, 3, 2, 5, 1, lens=lens)
    given = {n: a for n, a in ins.items() if n}
    vis = [_vi(n, I32 if n == "sequence_lens" else F, list(given[n].shape))
           for n in names if n]
    node = helper.make_node("GRU", names, ["Y", "Y_h"], hidden_size=5)
    g = helper.make_graph([node], "g", vis, [_vi("Y", F, [4, 1, 3, 5]), _vi("Y_h", F, [1, 3, 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])
    y, y_h = compiler.compile(model).session().run(None, given)
    full = ReferenceEvaluator(model).run(None, given)[0]   # all steps of every entry
    for bi, n in enumerate(lens):
        np.testing.assert_allclose(y[:n, 0, bi], full[:n, 0, bi], rtol=1e-4, atol=1e-5)
        assert not y[n:, 0, bi].any()
        np.testing.assert_allclose(y_h[0, bi], full[n - 1, 0, bi], rtol=1e-4, atol=1e-5)


def test_recurrent_refuses_unknown_activation():
    ins, names = _rnn_inputs("RNN", 2, 1, 2, 5, 1)
    given = {n: a for n, a in ins.items() if n}
    vis = [_vi(n, F, list(given[n].shape)) for n in names if n]
    node = helper.make_node("RNN", names, ["Y"], hidden_size=5, activations=["Gelu"])
    g = helper.make_graph([node], "g", vis, [_vi("Y", F, [2, 1, 1, 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises((UnsupportedError, CompileError), match="activation 'Gelu'"):
        compiler.compile(model)


@pytest.mark.parametrize("kind,lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
def test_recurrent_weights_packed_once_not_per_step(kind, lbr):
    """Constant W / R (as exported): the unrolled steps share one packed recurrent weight
    (each step had its own: 199 MB of params for a 2-layer LSTM of 100 steps), and the
    outputs match the reference."""
    seq, hidden = 24, 32
    ins, names = _rnn_inputs(kind, seq, 1, 8, hidden, 1)
    weights = {n: a for n, a in ins.items() if n in ("W", "R", "B")}
    given = {n: a for n, a in ins.items() if n and n not in weights}
    vis = [_vi(n, F, list(given[n].shape)) for n in names if n in given]
    attrs = {"linear_before_reset": lbr} if kind == "GRU" else {}
    node = helper.make_node(kind, names, ["Y"], hidden_size=hidden, **attrs)
    g = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info("Y")],
                          [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])
    want = ReferenceEvaluator(model).run(None, given)
    del model.graph.output[:]
    model.graph.output.extend([_vi("Y", F, list(want[0].shape))])
    cm = compiler.compile(model)
    raw = sum(a.nbytes for a in weights.values())
    assert cm.report["memory"]["params_bytes"] < 4 * raw  # not seq copies of R
    np.testing.assert_allclose(cm.session().run(None, given)[0], want[0], rtol=1e-4,
                               atol=1e-5)


# --- one recurrence kernel per direction (schedules/cpu/recurrence.py) --------------------


def _const_rnn_model(kind, seq, batch, inp, hidden, direction="forward", layout=0,
                     lbr=1, **extra):
    """A one-node model with constant W / R / B (as exporters write them) and X (plus
    initial states) as inputs; ``seq`` / ``batch`` may be dim names."""
    n_dir = 2 if direction == "bidirectional" else 1
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("W", _f(n_dir, g * hidden, inp) * 0.3), ("R", _f(n_dir, g * hidden, hidden) * 0.3),
        ("B", _f(n_dir, 2 * g * hidden) * 0.3))]
    xs = [batch, seq, inp] if layout else [seq, batch, inp]
    hs = [batch, n_dir, hidden] if layout else [n_dir, batch, hidden]
    vis = [_vi("X", F, xs), _vi("initial_h", F, hs)]
    names = ["X", "W", "R", "B", "", "initial_h"]
    outs = ["Y", "Y_h"]
    if kind == "LSTM":
        vis.append(_vi("initial_c", F, hs))
        names.append("initial_c")
        outs.append("Y_c")
    attrs = dict(hidden_size=hidden, direction=direction, layout=layout, **extra)
    if kind == "GRU":
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(kind, names, outs, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info(o)
                                                 for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def _feeds(model, seq, batch):
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value or {"seq": seq, "batch": batch}[d.dim_param]
                for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = _f(*dims)
    return feeds


def _rules(cm):
    return [k["rule"] for k in cm.report["kernel_table"]]


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction,layout", [("forward", 0), ("reverse", 1),
                                              ("bidirectional", 0)])
def test_recurrence_is_one_kernel_per_direction(kind, direction, layout):
    """A layer with constant weights is its input projection (one matmul) and one
    recurrence kernel per direction, whatever its length (unrolled it was a few kernels
    per step), matching the reference; 40 hidden units: no whole vector chunk."""
    model = _const_rnn_model(kind, 9, 2, 6, 40, direction, layout)
    feeds = _feeds(model, 9, 2)
    want = ReferenceEvaluator(model).run(None, feeds)
    cm = compiler.compile(model)
    rules = _rules(cm)
    n_dir = 2 if direction == "bidirectional" else 1
    assert rules.count("cpu.recurrence") == n_dir, rules
    # projection, states, layout transposes, outputs stacked: unrolled, 9 steps x 2-4
    # kernels a direction
    assert len(rules) <= 12, rules
    for g_, w in zip(cm.session().run(None, feeds), want):
        np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_recurrence_over_a_symbolic_length_is_one_artifact(kind, tmp_path):
    """A symbolic sequence length and batch (``dynamic_axes`` on X) compile once to one
    artifact that serves every length in the range (unrolling needs it static: each new
    length was a compile at run time), matching onnxruntime at the range's edges and odd
    lengths."""
    import runtime
    from tests.conftest import ort_run

    model = _const_rnn_model(kind, "seq", "batch", 12, 64, "bidirectional")
    cm = compiler.compile(model, dims={"seq": (1, 300, 50), "batch": (1, 4, 1)})
    assert "kernel_table" in cm.report and "cpu.recurrence" in _rules(cm), cm.report
    cm.export(str(tmp_path / "m.so"))
    sess = runtime.load(str(tmp_path / "m.so"))
    for seq, batch in ((1, 1), (50, 1), (37, 3), (300, 4)):
        feeds = _feeds(model, seq, batch)
        for g_, w in zip(sess.run(None, feeds), ort_run(model, feeds)):
            np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind,extra", [("GRU", dict(lbr=0)), ("LSTM", dict(clip=0.5)),
                                        ("RNN", dict(activations=["Relu"]))])
def test_recurrence_kernel_not_taken_where_it_does_not_cover(kind, extra):
    """GRU without linear_before_reset (its reset gate scales h before R), clip, other
    activations: unrolled as before, still matching onnxruntime (onnx.reference ignores
    clip and the activations attribute)."""
    from tests.conftest import ort_run

    model = _const_rnn_model(kind, 5, 2, 3, 8, **extra)
    feeds = _feeds(model, 5, 2)
    cm = compiler.compile(model)
    assert "cpu.recurrence" not in _rules(cm)
    for g_, w in zip(cm.session().run(None, feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-5)
