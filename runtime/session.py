"""The graph runtime: run a compiled model's kernels in order over one planned arena.

A :class:`Session` is built from the artifact's ``graph`` and ``memory_plan`` plus a
module holding the kernels.  Everything a call needs is prepared once, here: the arena,
one view per tensor at its planned offset, the params (placed once), and for every kernel
call a ready tuple of arguments.  ``run`` then only copies the inputs in, loops over
``(function, args)`` pairs, and copies the outputs out.

Graph format (``meta["graph"]``, written by ``compiler/graph.py``)::

    tensors: [{name, shape, dtype, storage: "arena"|"param", index}]   # index: buffer or param
    inputs / outputs: [{name, tensor}]
    calls: [{kernel, args: [tensor ids], num_outputs, ops, nodes}]
    params: [{offset, nbytes}]                                         # into the payload
    buffers: [{nbytes, first_use, last_use}]                           # arena buffers
"""

from __future__ import annotations

import threading

import numpy as np

from .instruments import Profiler, SessionOptions, check_outputs
from .memory_plan import MemoryPlan

__all__ = ["Session", "NodeArg"]

# numpy dtype name -> ONNX type string as onnxruntime prints it
_ONNX_TYPE = {"float32": "float", "float64": "double"}


def onnx_type(dtype: str) -> str:
    return f"tensor({_ONNX_TYPE.get(dtype, dtype)})"


class NodeArg:
    """An input or output of a session, shaped like onnxruntime's ``NodeArg``."""

    def __init__(self, name: str, shape, dtype: str):
        self.name = name
        self.shape = list(shape)
        self.dtype = dtype
        self.type = onnx_type(dtype)

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def _aligned_bytes(nbytes: int, alignment: int = 64) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data pointer is ``alignment``-aligned."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes]


class Session:
    """Runs one compiled model.  Use :func:`runtime.load` or ``CompiledModel.session()``.

    Parameters
    ----------
    meta : dict
        ``manifest``, ``graph`` and ``memory_plan`` as stored in the artifact.
    params : bytes-like
        The params payload.
    kernels : tvm.runtime.Module
        A module exporting every kernel symbol the graph calls.
    options : SessionOptions, optional
        Profiling and NaN/Inf checks (off by default, and then free).
    """

    def __init__(self, meta: dict, params, kernels, options: SessionOptions | None = None):
        import tvm  # the kernels' runtime; imported here so that tools reading metadata need not

        self.manifest = meta["manifest"]
        self.graph = graph = meta["graph"]
        self.plan = MemoryPlan.from_dict(meta["memory_plan"])
        self._kernels = kernels  # keeps the library loaded while functions are referenced
        self._lock = threading.Lock()
        self.options = options or SessionOptions()
        self._profiler = (Profiler(self.options.profile_file_prefix)
                          if self.options.enable_profiling else None)
        self._runs = 0

        self._arena = _aligned_bytes(max(self.plan.arena_bytes, 1))
        self._params = _aligned_bytes(max(len(params), 1))
        self._params[:len(params)] = np.frombuffer(params, dtype=np.uint8)

        self._np = [self._view(t) for t in graph["tensors"]]
        tvm_views = [tvm.runtime.from_dlpack(v) if v.size else None for v in self._np]
        self._calls = []
        for call in graph["calls"]:
            try:
                fn = kernels[call["kernel"]]
            except Exception:
                raise RuntimeError(f"kernel {call['kernel']!r} is missing from the artifact's "
                                   "library; the file is corrupted, recompile it") from None
            args = tuple(tvm_views[i] if tvm_views[i] is not None else
                         tvm.runtime.empty(self._np[i].shape, self._np[i].dtype.name)
                         for i in call["args"])
            self._calls.append((fn, args))

        self._inputs = [(i["name"], self._np[i["tensor"]]) for i in graph["inputs"]]
        self._input_index = {name: view for name, view in self._inputs}
        self._outputs = {o["name"]: self._np[o["tensor"]] for o in graph["outputs"]}
        self._output_names = [o["name"] for o in graph["outputs"]]

    def _view(self, t: dict) -> np.ndarray:
        dtype = np.dtype(t["dtype"])
        nbytes = int(np.prod(t["shape"], dtype=np.int64)) * dtype.itemsize
        if t["storage"] == "arena":
            start = self.plan.offsets[t["index"]]
            base = self._arena
        else:
            start = self.graph["params"][t["index"]]["offset"]
            base = self._params
        return base[start:start + nbytes].view(dtype).reshape(t["shape"])

    # -- onnxruntime-shaped API ------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg(n, v.shape, v.dtype.name) for n, v in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [NodeArg(n, self._outputs[n].shape, self._outputs[n].dtype.name)
                for n in self._output_names]

    def get_modelmeta(self) -> dict:
        return dict(self.manifest)

    def run(self, output_names, input_feed: dict) -> list[np.ndarray]:
        """Run the model.

        Parameters
        ----------
        output_names : list of str or None
            Outputs to return, in this order; None for all, in the model's order.
        input_feed : dict of str to numpy.ndarray
            One array per model input, of exactly the input's shape and dtype.

        Returns
        -------
        list of numpy.ndarray
            Fresh arrays: they never alias the session's memory.
        """
        names = self._output_names if output_names is None else list(output_names)
        for n in names:
            if n not in self._outputs:
                raise ValueError(f"unknown output {n!r}; the model's outputs are "
                                 f"{self._output_names}")
        arrays = self._check_feed(input_feed)
        with self._lock:
            for name, view in self._inputs:
                np.copyto(view, arrays[name], casting="no")
            if self._profiler is None and not self.options.check_nan:
                for fn, args in self._calls:
                    fn(*args)
            else:
                self._run_instrumented()
            return [self._outputs[n].copy() for n in names]

    def _run_instrumented(self) -> None:
        import time

        calls, tensors, prof = self.graph["calls"], self.graph["tensors"], self._profiler
        for (fn, args), call in zip(self._calls, calls):
            start = time.perf_counter_ns()
            fn(*args)
            end = time.perf_counter_ns()
            if prof is not None:
                prof.record(call, start, end, tensors, self._runs)
            if self.options.check_nan:
                check_outputs(call, self._np, tensors)
        self._runs += 1

    def end_profiling(self) -> str:
        """Write the Chrome trace of the runs so far; returns its path (as onnxruntime)."""
        if self._profiler is None:
            raise RuntimeError("profiling is off: create the session with "
                               "SessionOptions(enable_profiling=True)")
        return self._profiler.write()

    def profile_summary(self, top: int = 10) -> str:
        """Top kernels by time, share and GFLOP/s over the profiled runs."""
        if self._profiler is None:
            raise RuntimeError("profiling is off")
        return self._profiler.summary(top)

    def _check_feed(self, feed: dict) -> dict:
        if not isinstance(feed, dict):
            raise ValueError(f"input_feed must be a dict of input name to numpy array, "
                             f"got {type(feed).__name__}")
        expected = [n for n, _ in self._inputs]
        unknown = [k for k in feed if k not in self._input_index]
        if unknown:
            raise ValueError(f"unknown input {unknown[0]!r}; the model's inputs are {expected}")
        missing = [n for n in expected if n not in feed]
        if missing:
            raise ValueError(f"missing input {missing[0]!r}; the model's inputs are {expected}")
        arrays = {}
        for name, view in self._inputs:
            a = feed[name]
            if not isinstance(a, np.ndarray):
                raise ValueError(f"input {name!r}: expected a numpy array, got "
                                 f"{type(a).__name__}")
            if a.dtype != view.dtype:
                raise ValueError(f"input {name!r}: expected dtype {onnx_type(view.dtype.name)}"
                                 f", got {onnx_type(a.dtype.name)}")
            if a.shape != view.shape:
                raise ValueError(f"input {name!r}: expected shape {list(view.shape)}, got "
                                 f"{list(a.shape)}")
            arrays[name] = a
        return arrays
