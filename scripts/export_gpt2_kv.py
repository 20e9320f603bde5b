#!/usr/bin/env python3
"""Export a randomly initialised HuggingFace GPT-2 or LLaMA *with its key/value cache* to ONNX.

The layout is Optimum's ``decoder_with_past`` export (what onnxruntime-genai and
HF/Optimum users feed):

    inputs   input_ids [batch, seq] int64, attention_mask [batch, past + seq] int64,
             position_ids [batch, seq] int64,
             past_key_values.{i}.key / .value [batch, kv_heads, past, head_dim] float32
    outputs  logits [batch, seq, vocab] float32,
             present.{i}.key / .value [batch, kv_heads, past + seq, head_dim] float32

with dynamic axes ``batch``, ``seq``, ``past`` (and ``past_seq`` = past + seq on the mask
and the presents).  A prefill is a step with ``past`` = 0 (empty past tensors), a decode
step one with ``seq`` = 1.  PyTorch's TorchScript exporter (``dynamo=False``), opset 17,
eager attention; weights from a seeded config, no hub download.

``--arch gpt2`` (the default): ``--size tiny`` (2 layers, n_embd 32, vocab 256, 128
positions: ~190 KB, what the tests use: tests/data/gpt2_kv_tiny.onnx) or ``--size gpt2``
(the 124M gpt2 config, 12 layers, n_embd 768, vocab 50257: ~500 MB, for benchmarks; never
committed).

``--arch llama``: transformers' ``LlamaForCausalLM`` (RMSNorm, RoPE, SwiGLU MLP, grouped-query
attention: the past/present carry ``num_key_value_heads`` heads).  ``--size tiny`` (2 layers,
hidden 32, 4 query heads and 2 key/value heads of 8, intermediate 48, vocab 128:
tests/data/llama_kv_tiny.onnx), ``--size small`` (2 layers, hidden 256, 4 heads, 2
key/value heads, intermediate 512, vocab 1024) or ``--size base`` (8 layers, hidden 1024,
16 heads, 4 key/value heads of 64, intermediate 2816, vocab 32000: ~780 MB, for benchmarks;
neither committed).  The exporter leaves the
mask arithmetic (Shape/Gather/Range/Expand/Where over ``past`` and ``seq``) and RoPE's
cos/sin computed from ``position_ids`` in the graph.  torch and transformers are not onnxc dependencies; run
from a separate venv (see scripts/export_hf.py)::

    /tmp/torchenv/bin/python scripts/export_gpt2_kv.py --size gpt2 --out /tmp/gpt2_kv.onnx --check
    /tmp/torchenv/bin/python scripts/export_gpt2_kv.py --arch llama --size tiny \\
        --out tests/data/llama_kv_tiny.onnx --check
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

OPSET = 17
SIZES = {
    "gpt2": {
        "tiny": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=256, n_positions=128),
        "gpt2": dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
    },
    "llama": {
        "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=48, vocab_size=128,
                     max_position_embeddings=128),
        "small": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=512, vocab_size=1024,
                      max_position_embeddings=2048),
        # TinyLlama-1.1B's head layout (head_dim 64, 32 : 4 query : key/value heads at
        # hidden 2048 scaled to 16 : 4 at 1024), 8 layers, LLaMA-2's vocab: ~780 MB
        "base": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                     num_key_value_heads=4, intermediate_size=2816, vocab_size=32000,
                     max_position_embeddings=2048),
    },
}


def dims_of(config) -> tuple[int, int, int, int]:
    """(layers, key/value heads, head_dim, vocab) of a GPT-2 or LLaMA config."""
    if hasattr(config, "n_embd"):
        return config.n_layer, config.n_head, config.n_embd // config.n_head, config.vocab_size
    return (config.num_hidden_layers, config.num_key_value_heads,
            config.hidden_size // config.num_attention_heads, config.vocab_size)


def io_names(n_layer: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids"] + past, ["logits"] + present


def _model(arch: str, size: str):
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**SIZES[arch][size], use_cache=True, bos_token_id=0,
                             eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
                             attn_implementation="eager")
        return LlamaForCausalLM(config).eval(), config
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**SIZES[arch][size], use_cache=True, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    return GPT2LMHeadModel(config).eval(), config


def _wrapped(model, n_layer: int):
    import torch
    from transformers import DynamicCache

    class WithPast(torch.nn.Module):
        """Flat past tensors in, flat presents out (the ONNX signature above)."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(n_layer)])
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, cache=cache, use_cache=True,
                             return_dict=True)
            flat = []
            for keys, values, _ in out.cache:
                flat += [keys, values]
            return (out.logits, *flat)

    return WithPast().eval()


def example_feeds(config, batch=1, seq=3, past=4, seed=0) -> dict:
    """Seeded feeds for one step: random past, an all-ones mask, positions after the past."""
    rng = np.random.default_rng(seed)
    n_layer, heads, hd, vocab = dims_of(config)
    feeds = {"input_ids": rng.integers(0, vocab, (batch, seq), dtype=np.int64),
             "attention_mask": np.ones((batch, past + seq), np.int64),
             "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))}
    for name in io_names(n_layer)[0][3:]:
        feeds[name] = rng.standard_normal((batch, heads, past, hd)).astype(np.float32)
    return feeds


def export(arch: str, size: str, path: str, seed: int = 0, check: bool = False) -> str:
    import onnx
    import torch

    if size not in SIZES[arch]:
        raise SystemExit(f"--size {size} is not a {arch} size: {', '.join(SIZES[arch])}")
    torch.manual_seed(seed)
    model, config = _model(arch, size)
    n_layer = dims_of(config)[0]
    wrapped = _wrapped(model, n_layer)
    inputs, outputs = io_names(n_layer)
    feeds = example_feeds(config, seed=seed)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "past_seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "past_seq"} for n in outputs[1:]})
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, tuple(torch.from_numpy(feeds[n]) for n in inputs), path,
                          input_names=inputs, output_names=outputs, dynamic_axes=axes,
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    m = onnx.load(path)
    m.producer_name = (f"pytorch {torch.__version__} "
                       f"(scripts/export_gpt2_kv.py --arch {arch} --size {size})")
    m.doc_string = (f"random HuggingFace {type(model).__name__} with past/present key-values "
                    f"({sum(p.numel() for p in model.parameters())} params, seed {seed}), "
                    f"torch.onnx.export opset {OPSET} dynamo=False")
    onnx.checker.check_model(m)
    onnx.save(m, path)
    ops = sorted({n.op_type for n in m.graph.node})
    print(f"{path}: {os.path.getsize(path) / 1024:.0f} KiB, {len(m.graph.node)} nodes, "
          f"ops {', '.join(ops)}")
    if check:
        _check(path, wrapped, config, inputs, seed)
    return path


def _check(path, wrapped, config, inputs, seed):
    import torch

    try:
        import onnxruntime as ort
    except ImportError:
        print("  (onnxruntime not installed here: no check)")
        return
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for seq, past in ((5, 0), (1, 7), (2, 1)):
        feeds = example_feeds(config, seq=seq, past=past, seed=seed + seq + past)
        got = sess.run(None, feeds)
        with torch.no_grad():
            want = wrapped(*[torch.from_numpy(feeds[n]) for n in inputs])
        err = max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want))
        print(f"  onnxruntime vs torch at seq {seq}, past {past}: max abs diff {err:.2e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=list(SIZES), default="gpt2")
    ap.add_argument("--size", choices=sorted({s for a in SIZES.values() for s in a}),
                    default="tiny")
    ap.add_argument("--out", required=True, help="the .onnx file to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare with torch via onnxruntime")
    args = ap.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    export(args.arch, args.size, args.out, args.seed, args.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
