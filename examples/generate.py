#!/usr/bin/env python3
"""Greedy decoding with a key/value cache from one onnxc artifact, and tokens/s.

The model is a decoder exported with past/present key-values in Optimum's layout
(``scripts/export_gpt2_kv.py``: inputs ``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.{i}.key/value``; outputs ``logits``, ``present.{i}.key/value``).  The
prefill is a step with an empty past (past length 0); each decode step feeds one token.
onnxc runs every step through one ``IOBinding``: the presents stay in runtime-owned
buffers and are bound as the next step's past, so no step copies the cache in or out of
the runtime (the model's own Concat still writes past + new into present, as in
onnxruntime).  onnxruntime, with ``--compare``, runs the same loop with its own
``IOBinding`` (presents kept as OrtValues and bound back), in a separate process.

    python examples/generate.py --onnx /tmp/gpt2_kv.onnx --so /tmp/gpt2_kv.so \\
        --prompt-len 8 --tokens 64 --threads 2 --compare

``--so`` is compiled from ``--onnx`` when missing (dims: batch 1, seq 1..--max-prompt,
past 0..--max-past).  Prints one line per engine: prefill ms, decode tokens/s, and the
generated ids' checksum; with ``--compare`` whether both engines generated the same ids.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def signature(input_names: list[str]) -> tuple[list[str], int]:
    """(the past inputs, in order; the number of layers) of an Optimum-style signature."""
    past = [n for n in input_names if n.startswith("past_key_values.")]
    missing = {"input_ids", "attention_mask", "position_ids"} - set(input_names)
    if missing or not past:
        raise SystemExit(f"not a decoder-with-past model: inputs {input_names} (need "
                         "input_ids, attention_mask, position_ids, past_key_values.*)")
    return past, len(past) // 2


def step_feeds(ids: np.ndarray, past_len: int) -> dict:
    seq = ids.shape[1]
    return {"input_ids": ids, "attention_mask": np.ones((1, past_len + seq), np.int64),
            "position_ids": np.arange(past_len, past_len + seq, dtype=np.int64)[None]}


def compile_so(onnx_path: str, so_path: str, max_prompt: int, max_past: int) -> None:
    import compiler

    dims = {"batch": (1, 1), "seq": (1, max_prompt, 1), "past": (0, max_past, max_past // 2),
            "past_seq": (1, max_past + max_prompt, max_past // 2)}
    start = time.perf_counter()
    cm = compiler.compile(onnx_path, dims=dims)
    cm.export(so_path)
    print(f"compiled {onnx_path} -> {so_path} in {time.perf_counter() - start:.0f} s",
          file=sys.stderr)


class OnnxcDecoder:
    """Prefill + greedy steps through one runtime IOBinding."""

    def __init__(self, so_path: str, threads: int, profile: bool = False):
        import runtime
        from runtime.instruments import SessionOptions

        self.sess = runtime.load(so_path, SessionOptions(intra_op_num_threads=threads,
                                                         enable_profiling=profile))
        self.past, self.layers = signature([i.name for i in self.sess.get_inputs()])
        arg = next(i for i in self.sess.get_inputs() if i.name == self.past[0])
        self.heads, self.head_dim = arg.shape[1], arg.shape[3]
        self.vocab = next(o for o in self.sess.get_outputs() if o.name == "logits").shape[2]
        self.present = [o.name for o in self.sess.get_outputs() if o.name != "logits"]
        self.binding = self.sess.io_binding()
        for n in ["logits"] + self.present:
            self.binding.bind_output(n)

    def start(self, prompt: np.ndarray, past: list | None = None) -> np.ndarray:
        """Bind the prompt (and a past, else an empty one); returns nothing run yet."""
        if past is None:
            past = [np.zeros((1, self.heads, 0, self.head_dim), np.float32)] * len(self.past)
        self.past_len = past[0].shape[2]
        for k, v in step_feeds(prompt, self.past_len).items():
            self.binding.bind_input(k, v)
        for name, v in zip(self.past, past):
            self.binding.bind_input(name, v)
        self.seq = prompt.shape[1]

    def step(self) -> int:
        """Run the bound step, bind its presents as the next past; the greedy token."""
        b = self.binding
        self.sess.run_with_iobinding(b)
        outs = b.get_outputs()
        tok = int(outs[0][0, -1].argmax())
        self.past_len += self.seq
        self.seq = 1
        for k, v in step_feeds(np.array([[tok]], np.int64), self.past_len).items():
            b.bind_input(k, v)
        for name, v in zip(self.past, outs[1:]):
            b.bind_input(name, v)
        return tok

    def settle(self) -> None:
        """Run the bound step once, then bind the first ``past_len`` rows of its presents as
        the past: the decode loop's steady state, where the past is the previous step's
        present, read where it lies (a sequence-major cache: only the new row is written
        per step, in place).  ``repeat`` then reruns that step at a fixed past length.
        Nothing to do for a build whose caches are copied (no ``kv_caches``): its bound past
        is read in place already, and a prefix view would not be contiguous."""
        if not self.sess.graph.get("kv_caches"):
            return
        self.sess.run_with_iobinding(self.binding)
        for name, v in zip(self.past, self.binding.get_outputs()[1:]):
            self.binding.bind_input(name, v[:, :, :self.past_len])

    def repeat(self) -> None:
        """Run the bound step again as it is (a fixed past length: per-step latency)."""
        self.sess.run_with_iobinding(self.binding)


class OrtDecoder:
    """The same loop on onnxruntime, with its IOBinding (presents stay OrtValues)."""

    def __init__(self, onnx_path: str, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.ort = ort
        self.sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        self.past, self.layers = signature([i.name for i in self.sess.get_inputs()])
        arg = next(i for i in self.sess.get_inputs() if i.name == self.past[0])
        self.heads, self.head_dim = arg.shape[1], arg.shape[3]
        self.vocab = self.sess.get_outputs()[0].shape[2]
        self.outputs = [o.name for o in self.sess.get_outputs()]
        self.binding = self.sess.io_binding()
        self._bind_outputs()

    def _bind_outputs(self):
        # outputs onnxruntime allocates per run (shapes change with the past length);
        # binding them again drops the previous OrtValues, which the inputs still hold
        self.binding.clear_binding_outputs()
        for n in self.outputs:
            self.binding.bind_output(n, "cpu")

    def start(self, prompt: np.ndarray, past: list | None = None) -> None:
        if past is None:
            past = [np.zeros((1, self.heads, 0, self.head_dim), np.float32)] * len(self.past)
        self.past_len = past[0].shape[2]
        self._bind_step(prompt)
        for name, v in zip(self.past, past):
            self.binding.bind_ortvalue_input(name, self.ort.OrtValue.ortvalue_from_numpy(v))
        self.seq = prompt.shape[1]

    def _bind_step(self, ids):
        for k, v in step_feeds(ids, self.past_len).items():
            self.binding.bind_cpu_input(k, v)

    def step(self) -> int:
        b = self.binding
        self.sess.run_with_iobinding(b)
        outs = b.get_outputs()
        tok = int(outs[0].numpy()[0, -1].argmax())
        self.past_len += self.seq
        self.seq = 1
        self._bind_step(np.array([[tok]], np.int64))
        for name, v in zip(self.past, outs[1:]):
            b.bind_ortvalue_input(name, v)
        self._bind_outputs()
        return tok

    def repeat(self) -> None:
        self._bind_outputs()
        self.sess.run_with_iobinding(self.binding)


def make_decoder(engine: str, args):
    if engine == "onnxc":
        return OnnxcDecoder(args.so, args.threads)
    return OrtDecoder(args.onnx, args.threads)


def generate(engine: str, args) -> dict:
    """Prefill ``--prompt-len`` seeded ids, then ``--tokens`` greedy steps, timed."""
    dec = make_decoder(engine, args)
    prompt = np.random.default_rng(args.seed).integers(0, dec.vocab, (1, args.prompt_len),
                                                       dtype=np.int64)
    dec.start(prompt)
    start = time.perf_counter()
    tokens = [dec.step()]
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.tokens - 1):
        tokens.append(dec.step())
    decode = time.perf_counter() - start
    return {"engine": engine, "prefill_ms": prefill * 1e3,
            "tokens_per_s": (args.tokens - 1) / decode if args.tokens > 1 else 0.0,
            "tokens": tokens}


def _child(engine: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--engine", engine, "--json",
           "--onnx", args.onnx, "--so", args.so, "--tokens", str(args.tokens),
           "--prompt-len", str(args.prompt_len), "--threads", str(args.threads),
           "--seed", str(args.seed)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{engine} worker failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _line(r: dict) -> str:
    return (f"{r['engine']:12s} prefill {r['prefill_ms']:8.2f} ms   decode "
            f"{r['tokens_per_s']:8.2f} tokens/s   ids {r['tokens'][:8]}...")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", help="the decoder-with-past .onnx (for compiling and --compare)")
    ap.add_argument("--so", required=True, help="the onnxc artifact (compiled when missing)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens to generate")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt", type=int, default=128, help="compile: seq range max")
    ap.add_argument("--max-past", type=int, default=1023, help="compile: past range max")
    ap.add_argument("--compare", action="store_true",
                    help="also run onnxruntime; each engine in its own process")
    ap.add_argument("--engine", choices=("onnxc", "onnxruntime"), default="onnxc")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if not os.path.exists(args.so):
        if not args.onnx:
            ap.error(f"{args.so} does not exist: give --onnx to compile it")
        compile_so(args.onnx, args.so, args.max_prompt, args.max_past)
    if args.compare:
        if not args.onnx:
            ap.error("--compare needs --onnx")
        results = [_child("onnxc", args), _child("onnxruntime", args)]
        for r in results:
            print(_line(r))
        same = results[0]["tokens"] == results[1]["tokens"]
        print(f"same ids: {same}; onnxc / onnxruntime tokens/s: "
              f"{results[0]['tokens_per_s'] / results[1]['tokens_per_s']:.2f}")
        return 0 if same else 1
    r = generate(args.engine, args)
    print(json.dumps(r) if args.json else _line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
