#!/usr/bin/env python3
"""Export tiny, randomly initialised HuggingFace encoders/decoders to ONNX (opset 17).

These are the "real exports" onnxc's tests import (tests/compiler/test_real_exports.py):
PyTorch's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``) at opset 17,
inputs ``input_ids`` + ``attention_mask`` (+ ``token_type_ids`` for BERT), int64, with
dynamic axes ``batch`` and ``sequence``.  Models are built from configs (no hub
download), seeded, with a small vocabulary so each file stays well under 1 MB.

torch and transformers are not dependencies of onnxc; run this from a separate venv::

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch transformers onnx numpy
    /tmp/torchenv/bin/python scripts/export_hf.py --out tests/data

``--check`` compares each export with the PyTorch model through onnxruntime when it is
installed in that venv.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

OPSET = 17
SMALL = dict(vocab_size=1000, max_position_embeddings=128)


def _bert(attn="eager"):
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, attn_implementation=attn, **SMALL)
    return BertModel(config), ["input_ids", "attention_mask", "token_type_ids"], \
        ["last_hidden_state", "pooler_output"]


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128,
                        use_cache=False, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    return GPT2Model(config), ["input_ids", "attention_mask"], ["last_hidden_state"]


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                              attn_implementation="eager", **SMALL)
    return DistilBertModel(config), ["input_ids", "attention_mask"], ["last_hidden_state"]


# eager attention: the classic exported structure (explicit MatMul/Softmax with an additive
# mask); bert_sdpa: transformers' default, exported as the same ops plus an IsNaN guard
MODELS = {"bert": _bert, "gpt2": _gpt2, "distilbert": _distilbert,
          "bert_sdpa": lambda: _bert("sdpa")}


class _Wrapper:
    """Positional inputs -> the model's keyword inputs; the named outputs as a tuple."""

    def __new__(cls, model, input_names, output_names):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(**dict(zip(input_names, args)), return_dict=True)
                return tuple(out[k] for k in output_names)

        return Wrapped()


def example_inputs(input_names, batch=2, seq=8, seed=0, vocab=1000):
    """Seeded int64 inputs; the mask pads the end of the second row."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in input_names:
        if name == "input_ids":
            feeds[name] = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
        elif name == "attention_mask":
            mask = np.ones((batch, seq), np.int64)
            mask[-1, seq - max(1, seq // 3):] = 0
            feeds[name] = mask
        elif name == "token_type_ids":
            tt = np.zeros((batch, seq), np.int64)
            tt[:, seq // 2:] = 1
            feeds[name] = tt
    return feeds


def export(name: str, out_dir: str, seed: int = 0, check: bool = False) -> str:
    import torch

    torch.manual_seed(seed)
    model, input_names, output_names = MODELS[name]()
    model.eval()
    wrapped = _Wrapper(model, input_names, output_names).eval()
    feeds = example_inputs(input_names, seed=seed)
    args = tuple(torch.from_numpy(feeds[n]) for n in input_names)
    axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    axes.update({n: {0: "batch", 1: "sequence"} for n in output_names if n != "pooler_output"})
    if "pooler_output" in output_names:
        axes["pooler_output"] = {0: "batch"}
    path = os.path.join(out_dir, f"hf_{name}_tiny.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, args, path, input_names=input_names,
                          output_names=output_names, dynamic_axes=axes,
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    import onnx

    m = onnx.load(path)
    m.producer_name = f"pytorch {torch.__version__} (scripts/export_hf.py {name})"
    m.doc_string = (f"tiny random HuggingFace {type(model).__name__} "
                    f"({sum(p.numel() for p in model.parameters())} params, seed {seed}), "
                    f"torch.onnx.export opset {OPSET} dynamo=False")
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, path)
    size = os.path.getsize(path)
    ops = sorted({n.op_type for n in m.graph.node})
    print(f"{path}: {size / 1024:.0f} KiB, {len(m.graph.node)} nodes, ops {', '.join(ops)}")
    if check:
        _check(path, wrapped, input_names, seed)
    return path


def _check(path, wrapped, input_names, seed):
    import torch

    try:
        import onnxruntime as ort
    except ImportError:
        print("  (onnxruntime not installed here: no check)")
        return
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for seq in (8, 13):
        feeds = example_inputs(input_names, batch=2, seq=seq, seed=seed + seq)
        got = sess.run(None, feeds)
        with torch.no_grad():
            want = wrapped(*[torch.from_numpy(feeds[n]) for n in input_names])
        err = max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want))
        print(f"  onnxruntime vs torch at seq {seq}: max abs diff {err:.2e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/data", help="output folder (default tests/data)")
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare with torch via onnxruntime")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for name in args.models:
        try:
            export(name, args.out, args.seed, args.check)
        except Exception as e:  # keep going: report every model that does not export
            failed.append(name)
            print(f"{name}: export failed: {type(e).__name__}: {e}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
