"""A session over a one-sample graph that runs a batch as a loop over its samples.

The compiler builds a model whose symbolic batch dim leads every tensor holding it, with
every kernel separable by sample (``compiler/lowering/batch_loop.py`` proves it), as a
one-sample graph with every static rule (a symbolic build of a CNN had none).  The
artifact's manifest names the dim and the inputs and outputs that lead with it
(``manifest["batch_loop"]``); :class:`BatchLoopSession` shows the model's signature (the
dim by name, as onnxruntime shows it), checks a feed's batch against the dim's range, and
runs the one-sample session once per sample: each looped input's sample is a view (read
in place when the inner session can), each looped output is stacked from the samples' in
one preallocated array, and an output without the dim (computed from unbatched inputs
alone) is the first sample's.  A batch of 1 is one plain run.

Nothing here imports the compiler.
"""

from __future__ import annotations

import copy

import numpy as np

from .dims import DimError


class BatchLoopSession:
    """onnxruntime-shaped session running ``inner`` (a one-sample :class:`Session`) once
    per sample of the dim ``manifest["batch_loop"]["dim"]``.  Attributes it does not
    define (``manifest``, ``graph``, ``num_threads``, profiling...) are the inner
    session's."""

    def __init__(self, inner, manifest: dict):
        loop = manifest["batch_loop"]
        self._inner = inner
        self.dim = loop["dim"]
        self.dims = list(manifest.get("dims", ()))
        rng = next(d for d in self.dims if d["name"] == self.dim)
        self.range = (int(rng["min"]), int(rng["max"]))
        self._in = set(loop["inputs"])
        self._out = set(loop["outputs"])
        self._inner_inputs = {a.name: a for a in inner.get_inputs()}

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _arg(self, arg, looped: bool):
        if not looped:
            return arg
        arg = copy.copy(arg)
        arg.shape = [self.dim] + list(arg.shape[1:])
        return arg

    def get_inputs(self) -> list:
        """The inputs, the looped dim by name (``['batch', 3, 224, 224]``)."""
        return [self._arg(a, a.name in self._in) for a in self._inner.get_inputs()]

    def get_outputs(self) -> list:
        return [self._arg(a, a.name in self._out) for a in self._inner.get_outputs()]

    def get_modelmeta(self) -> dict:
        return self._inner.get_modelmeta()

    def run(self, output_names, input_feed: dict) -> list[np.ndarray]:
        """Run the model on a batch; see :meth:`Session.run`.  Looped inputs must agree on
        their leading extent, which must lie in the dim's range."""
        batch = self._batch(input_feed)
        if batch == 1:
            return self._inner.run(output_names, input_feed)
        names = [o.name for o in self._inner.get_outputs()] if output_names is None \
            else list(output_names)
        results: list = [None] * len(names)
        for b in range(batch):
            feed = {k: (v[b:b + 1] if k in self._in else v) for k, v in input_feed.items()}
            outs = self._inner.run(names, feed)
            for k, (n, o) in enumerate(zip(names, outs)):
                if n not in self._out:
                    if b == 0:
                        results[k] = o
                    continue
                if b == 0:
                    results[k] = np.empty((batch,) + o.shape[1:], o.dtype)
                results[k][b] = o[0]
        return results

    def _batch(self, feed) -> int:
        """The feed's batch: the common leading extent of the looped inputs, checked."""
        if not isinstance(feed, dict):
            raise ValueError(f"input_feed must be a dict of input name to numpy array, "
                             f"got {type(feed).__name__}")
        sizes = {}
        for name in self._in:
            a = feed.get(name)
            if not isinstance(a, np.ndarray) or a.ndim == 0:
                continue  # missing or not an array: the inner session words the error
            want = self._inner_inputs[name].shape
            if a.ndim != len(want) or any(isinstance(w, int) and w != g
                                          for w, g in zip(want[1:], a.shape[1:])):
                raise ValueError(f"input {name!r}: expected shape "
                                 f"{[self.dim] + list(want[1:])}, got {list(a.shape)}")
            sizes[name] = a.shape[0]
        if len(set(sizes.values())) > 1:
            raise DimError(f"inputs disagree on dim {self.dim!r}: " + ", ".join(
                f"{n} has {s}" for n, s in sorted(sizes.items())))
        batch = next(iter(sizes.values()), 1)
        lo, hi = self.range
        if not lo <= batch <= hi:
            raise DimError(f"dim {self.dim!r} = {batch} is outside its range {lo}..{hi} "
                           f"(compile with --dim {self.dim}=MIN..MAX to serve it)")
        return batch

    def io_binding(self):
        raise NotImplementedError(
            f"I/O binding is not available for an artifact that runs dim {self.dim!r} as a "
            "loop over samples; use run(), or compile with batch_loop=False "
            "(onnxc compile --no-batch-loop) for a build with the dim symbolic")

    def run_with_iobinding(self, iobinding) -> None:
        self.io_binding()
