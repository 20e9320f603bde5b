"""I/O binding (runtime/iobinding.py, ``Session.run_with_iobinding``): a GPT-2 exported with
its key/value cache (tests/data/gpt2_kv_tiny.onnx, scripts/export_gpt2_kv.py: 2 layers,
n_embd 32, random weights) decodes from one artifact, prefill at past length 0, each
present fed back as the next past without a copy, matching onnxruntime's logits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from runtime.dims import DimError
from tests.conftest import REPO, assert_close, ort_run

MODEL = REPO / "tests" / "data" / "gpt2_kv_tiny.onnx"
LAYERS, HEADS, HEAD_DIM, VOCAB = 2, 4, 8, 256
MAX_PAST = 64
DIMS = {"batch": (1, 1), "seq": (1, 16), "past": (0, MAX_PAST),
        "past_seq": (1, MAX_PAST + 16)}
PAST = [f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
PRESENT = [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]


@pytest.fixture(scope="module")
def gpt2():
    cm = compiler.compile(str(MODEL), dims=DIMS)
    assert isinstance(cm, compiler.CompiledModel)  # one artifact, not one per past length
    return onnx.load(str(MODEL)), cm


def _step_feeds(ids, past_len: int) -> dict:
    seq = ids.shape[1]
    return {"input_ids": ids, "attention_mask": np.ones((1, past_len + seq), np.int64),
            "position_ids": np.arange(past_len, past_len + seq, dtype=np.int64)[None]}


def _empty_past() -> dict:
    return {n: np.zeros((1, HEADS, 0, HEAD_DIM), np.float32) for n in PAST}


def _spy_in_place(sess) -> list:
    """The inputs each run of ``sess`` reads in place (recorded from Session._bind)."""
    seen, bind = [], sess._bind

    def spy(*args, **kw):
        bound, in_place = bind(*args, **kw)
        seen.append(set(in_place))
        return bound, in_place

    sess._bind = spy
    return seen


def test_structure_present_fed_back_in_place(gpt2):
    """The caches are stored sequence-major and appended in place: no kernel copies a past
    (no transpose of it in, no concat), present is a view of one runtime-owned buffer whose
    address stays the same across steps, a step leaves the rows [0, P) of the previous
    present unchanged (the view handed out stays valid), and the present bound as the next
    past is read where it lies."""
    _, cm = gpt2
    kv = cm.report["kv_caches"]
    assert sorted(c["input"] for c in kv["placed"]) == sorted(PAST) and not kv["kept"]
    assert {c["output"] for c in kv["placed"]} == set(PRESENT)
    seq_major = [p for p in cm.report["passes"] if p["name"] == "seq_major_cache"][0]
    assert sum(v for r, v in seq_major["rewrites"].items()
               if not r.startswith("kept")) == len(PAST)
    ops = [r["ops"] for r in cm.report["kernel_table"]]
    assert not any("concat" in o for o in ops)  # no kernel writes past into present
    sess = cm.session()
    in_place = _spy_in_place(sess)
    b = sess.io_binding()
    ids = np.array([[1, 2, 3]], np.int64)
    for k, v in {**_step_feeds(ids, 0), **_empty_past()}.items():
        b.bind_input(k, v)
    for n in ["logits"] + PRESENT:
        b.bind_output(n)
    seen, prev = [], None
    for step in range(4):
        sess.run_with_iobinding(b)
        outs = b.get_outputs()
        key = outs[1]
        assert key.shape == (1, HEADS, 3 + step, HEAD_DIM)
        # the [B, H, P, D] view of sequence-major storage: strides independent of P
        assert key.strides == (HEADS * HEAD_DIM * 4, HEAD_DIM * 4, HEADS * HEAD_DIM * 4, 4)
        assert any(np.shares_memory(key, buf) for buf in b._owned[PRESENT[0]])
        if prev is not None:  # the previous present (a view) is unchanged, a prefix of this
            view, kept = prev
            np.testing.assert_array_equal(view, kept)
            np.testing.assert_array_equal(key[:, :, :view.shape[2]], kept)
        prev = (key, key.copy())
        seen.append(key.ctypes.data)
        nxt = np.array([[int(outs[0][0, -1].argmax())]], np.int64)
        for k, v in _step_feeds(nxt, 3 + step).items():
            b.bind_input(k, v)
        for name, present in zip(PAST, outs[1:]):
            b.bind_input(name, present)
    assert len(set(seen)) == 1  # one buffer, appended to in place
    assert all(set(PAST) <= s for s in in_place[1:])  # the bound presents read in place


def test_caller_past_copied_in_then_presents_in_place(gpt2):
    """A caller's own contiguous [B, H, P, D] past is copied in (transposed into the
    sequence-major buffer), the presents fed back are read in place, and a prefix view of
    a present (v[:, :, :P]) is in place too; every step against onnxruntime."""
    model, cm = gpt2
    sess = cm.session()
    in_place = _spy_in_place(sess)
    rng = np.random.default_rng(7)
    feeds = {**_step_feeds(np.array([[3]], np.int64), 6),
             **{n: rng.standard_normal((1, HEADS, 6, HEAD_DIM)).astype(np.float32)
                for n in PAST}}
    b = sess.io_binding()
    for k, v in feeds.items():
        b.bind_input(k, v)
    sess.run_with_iobinding(b)
    assert not set(PAST) & in_place[-1]
    got = b.get_outputs()
    assert_close(got, ort_run(model, feeds))
    step = {**_step_feeds(np.array([[4]], np.int64), 7), **dict(zip(PAST, got[1:]))}
    for k, v in step.items():
        b.bind_input(k, v)
    sess.run_with_iobinding(b)
    assert set(PAST) <= in_place[-1]
    assert_close(b.get_outputs(), ort_run(model, {k: np.ascontiguousarray(v)
                                                  for k, v in step.items()}))
    # the same step again on a prefix of the new presents (a fixed past length, as
    # scripts/bench_kv.py measures): in place, the same results
    want = b.copy_outputs_to_cpu()
    for name, v in zip(PAST, b.get_outputs()[1:]):
        b.bind_input(name, v[:, :, :7])
    sess.run_with_iobinding(b)
    assert set(PAST) <= in_place[-1]
    assert_close(b.get_outputs(), want)


def _decode_against(sess, ref, feeds: dict, steps: int = 33):
    """Run ``feeds`` (a prefill) then greedy steps through one IOBinding of ``sess``, each
    present bound back as the next past; every step's logits and presents, and the greedy
    token, checked against onnxruntime session ``ref`` fed its own presents.  Returns (past
    length reached, the tokens, the last step's feeds)."""
    b = sess.io_binding()
    for k, v in feeds.items():
        b.bind_input(k, v)
    for n in ["logits"] + PRESENT:
        b.bind_output(n)
    past_len, tokens = 0, []
    for _ in range(steps):
        sess.run_with_iobinding(b)
        got = b.get_outputs()
        want = ref.run(None, feeds)
        assert_close(got, want)
        tok = int(want[0][0, -1].argmax())
        assert int(got[0][0, -1].argmax()) == tok
        tokens.append(tok)
        past_len += feeds["input_ids"].shape[1]
        step_in = _step_feeds(np.array([[tok]], np.int64), past_len)
        feeds = {**step_in, **dict(zip(PAST, want[1:]))}
        for k, v in {**step_in, **dict(zip(PAST, got[1:]))}.items():
            b.bind_input(k, v)
    return past_len, tokens, feeds


def test_decode_32_steps_matches_onnxruntime(gpt2):
    """Prefill (past 0) then 32 greedy steps; logits and presents against onnxruntime's,
    with onnxruntime fed its own presents."""
    import onnxruntime as ort

    model, cm = gpt2
    sess = cm.session()
    ref = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, VOCAB, (1, 5), dtype=np.int64)
    past_len, _, feeds = _decode_against(sess, ref, {**_step_feeds(ids, 0), **_empty_past()})
    assert past_len == 5 + 32
    # run() on the same session (copies, fresh arrays) agrees with the bound run
    assert_close(sess.run(None, feeds), ort_run(model, feeds))


def test_caller_memory_and_copies(gpt2):
    """An output bound to the caller's array is written there; copy_outputs_to_cpu gives
    arrays that later runs do not change."""
    _, cm = gpt2
    sess = cm.session()
    b = sess.io_binding()
    ids = np.array([[7, 8]], np.int64)
    for k, v in {**_step_feeds(ids, 0), **_empty_past()}.items():
        b.bind_input(k, v)
    logits_mem = np.empty(16 * VOCAB, np.float32)  # room for the longest seq
    b.bind_output("logits", logits_mem)
    b.bind_output(PRESENT[0])
    sess.run_with_iobinding(b)
    logits, key = b.get_outputs()
    assert logits.shape == (1, 2, VOCAB) and np.shares_memory(logits, logits_mem)
    kept = b.copy_outputs_to_cpu()
    assert not np.shares_memory(kept[0], logits_mem)
    want = sess.run(["logits", PRESENT[0]], {**_step_feeds(ids, 0), **_empty_past()})
    assert_close(kept, want)
    b.bind_input("input_ids", np.array([[9, 10]], np.int64))
    sess.run_with_iobinding(b)
    assert not np.array_equal(b.get_outputs()[0], kept[0])  # rewritten in place
    assert_close([kept[0]], [want[0]])


def test_static_model_binding():
    """A static model: input read in place, output in runtime-owned memory."""
    w = np.random.default_rng(1).standard_normal((48, 40)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 48])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 40])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = compiler.compile(m).session()
    b = sess.io_binding()
    x = np.random.default_rng(2).standard_normal((5, 48)).astype(np.float32)
    b.bind_input("x", x)  # no output bound: all of them, runtime-owned
    sess.run_with_iobinding(b)
    assert_close(b.get_outputs(), ort_run(m, {"x": x}))


def test_bad_bindings_are_refused(gpt2):
    _, cm = gpt2
    sess = cm.session()
    b = sess.io_binding()
    with pytest.raises(ValueError, match="unknown input 'ids'"):
        b.bind_input("ids", np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match="unknown output 'present.9.key'"):
        b.bind_output("present.9.key")
    with pytest.raises(ValueError, match=r"output is tensor\(float\), the array is int64"):
        b.bind_output("logits", np.zeros(10, np.int64))
    with pytest.raises(RuntimeError, match="no results yet"):
        b.get_outputs()
    with pytest.raises(ValueError, match="missing input"):
        sess.run_with_iobinding(b)
    with pytest.raises(ValueError, match="not made by this session"):
        cm.session().run_with_iobinding(b)
    ids = np.array([[1, 2]], np.int64)
    for k, v in {**_step_feeds(ids, 0), **_empty_past()}.items():
        b.bind_input(k, v)
    b.bind_output("logits", np.zeros(VOCAB, np.float32))  # one token's worth: too small
    with pytest.raises(ValueError, match=r"'logits'.*has 1024 bytes, this run's output "
                                         r"needs 2048"):
        sess.run_with_iobinding(b)
    b.clear_binding_outputs()
    shared = np.zeros((1, HEADS, 8, HEAD_DIM), np.float32)
    b.bind_output(PRESENT[0], shared)
    for k, v in _step_feeds(ids, 2).items():
        b.bind_input(k, v)
    for name in PAST:
        b.bind_input(name, np.zeros((1, HEADS, 2, HEAD_DIM), np.float32))
    b.bind_input(PAST[0], shared.reshape(-1)[:HEADS * 2 * HEAD_DIM].reshape(1, HEADS, 2, -1))
    with pytest.raises(ValueError, match=f"overlaps input '{PAST[0]}'"):
        sess.run_with_iobinding(b)
    b.clear_binding_outputs()
    too_long = np.zeros((1, HEADS, MAX_PAST + 1, HEAD_DIM), np.float32)
    for name in PAST:
        b.bind_input(name, too_long)
    b.bind_input("attention_mask", np.ones((1, MAX_PAST + 3), np.int64))
    with pytest.raises(DimError, match="past"):
        sess.run_with_iobinding(b)


def test_run_at_alternating_past_lengths(gpt2):
    """Session.run with the past length going up and down (each new binding rebuilt from
    the previous one, cached ones reused) matches onnxruntime every time."""
    model, cm = gpt2
    sess = cm.session()
    rng = np.random.default_rng(3)
    for past_len, seq in ((3, 1), (10, 2), (3, 1), (0, 4), (10, 2), (7, 1)):
        feeds = _step_feeds(rng.integers(0, VOCAB, (1, seq), dtype=np.int64), past_len)
        feeds.update({n: rng.standard_normal((1, HEADS, past_len, HEAD_DIM)).astype(np.float32)
                      for n in PAST})
        assert_close(sess.run(None, feeds), ort_run(model, feeds))


# LLaMA-style decoder (tests/data/llama_kv_tiny.onnx, scripts/export_gpt2_kv.py --arch llama:
# transformers' LlamaForCausalLM, 2 layers, hidden 32, 4 query heads sharing 2 key/value
# heads (GQA), RoPE from position_ids, RMSNorm, SwiGLU; torch.onnx opset 17, random weights)
LLAMA = REPO / "tests" / "data" / "llama_kv_tiny.onnx"
LLAMA_KV_HEADS, LLAMA_VOCAB = 2, 128


# seq optimised for 1, as examples/generate.py compiles a decoder: the attention matmuls
# take cpu.matmul's one-row schedules (the 5-token prefill runs them row by row)
LLAMA_DIMS = {**DIMS, "seq": (1, 16, 1)}


@pytest.fixture(scope="module")
def llama():
    cm = compiler.compile(str(LLAMA), dims=LLAMA_DIMS)
    # one artifact for every (seq, past): the exporter's mask arithmetic (Shape, Gather,
    # Range, Expand, Where, ConstantOfShape) and RoPE's cos/sin imported symbolically
    assert isinstance(cm, compiler.CompiledModel)
    return onnx.load(str(LLAMA)), cm


def _llama_empty_past() -> dict:
    return {n: np.zeros((1, LLAMA_KV_HEADS, 0, HEAD_DIM), np.float32) for n in PAST}


def test_llama_structure_symbolic_cache(llama):
    """The past/present carry the key/value heads with the symbolic past; the exporter's
    shape arithmetic became no per-shape input (nothing specialised, dims as declared)."""
    model, cm = llama
    ops = {n.op_type for n in model.graph.node}
    assert {"Range", "Expand", "Where", "ConstantOfShape", "Shape", "Cos", "Sin"} <= ops
    sess = cm.session()
    shapes = {i.name: i.shape for i in sess.get_inputs()}
    assert shapes[PAST[0]] == ["batch", LLAMA_KV_HEADS, "past", HEAD_DIM]
    outs = {o.name: o.shape for o in sess.get_outputs()}
    assert outs[PRESENT[0]][2] == "past + seq" and outs["logits"][2] == LLAMA_VOCAB
    assert {d["name"] for d in cm.report["dims"] if d["declared"]} == set(LLAMA_DIMS)
    assert cm.report["schedules"].get("cpu.matmul") == 2  # Q K^T dot rows and P V
    assert not cm.report["warnings"]


def test_llama_decode_32_steps_matches_onnxruntime(llama):
    """Prefill of 5 tokens (past 0) then 32 greedy steps through one IOBinding, each
    present bound back as the next past; logits, presents and the greedy token against
    onnxruntime fed its own presents."""
    import onnxruntime as ort

    model, cm = llama
    sess = cm.session()
    ref = ort.InferenceSession(str(LLAMA), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(4).integers(0, LLAMA_VOCAB, (1, 5), dtype=np.int64)
    past_len, tokens, _ = _decode_against(sess, ref,
                                          {**_step_feeds(ids, 0), **_llama_empty_past()})
    assert past_len == 5 + 32 and len(set(tokens)) > 1  # not a constant-token degenerate run
    assert set(PRESENT) == set(sess._kv)  # the caches appended in place


def test_llama_past_with_wrong_kv_heads_is_refused(llama):
    """A past with the query heads' count (4) instead of the key/value heads' (2)."""
    _, cm = llama
    sess = cm.session()
    feeds = {**_step_feeds(np.array([[1]], np.int64), 3),
             **{n: np.zeros((1, HEADS, 3, HEAD_DIM), np.float32) for n in PAST}}
    with pytest.raises(ValueError, match=PAST[0].replace(".", r"\.")):
        sess.run(None, feeds)
