"""The graph runtime: run a compiled model's kernels in order over one planned arena.

A :class:`Session` is built from the artifact's ``graph`` and ``memory_plan`` plus a
module holding the kernels.  Everything a call needs is prepared once, here: the arena,
one view per tensor at its planned offset, the params (placed once), and for every kernel
call a ready tuple of arguments.  ``run`` then only copies the inputs in, loops over
``(function, args)`` pairs, and copies the outputs out.

Graph format (``meta["graph"]``, written by ``compiler/graph.py``)::

    tensors: [{name, shape, dtype, storage: "arena"|"param", index, offset?}]
                                       # index: buffer or param; offset: bytes into the buffer
                                       # (a placed concat's members, or an expression of the
                                       # dims: a cache's new rows; absent: 0)
    inputs / outputs: [{name, tensor, perm?, align?}]  # perm: the tensor is stored permuted
                                       # (a sequence-major key/value cache [P, B, H, D]);
                                       # callers see tensor.transpose(perm); align (inputs):
                                       # bytes of alignment the kernels assume of it (absent: 64)
    calls: [{kernel, args: [tensor ids], num_outputs, ops, nodes, scalars?, row_variants?}]
                                       # scalars: [(position, dim expression)] ints passed;
                                       # row_variants: {rows, choices: [[kernel, tile,
                                       # cost]]}: the call's kernel and variants of other
                                       # row tiles, one run per binding by its rows
                                       # (compiler/lowering/row_variants.py,
                                       # dims.pick_variant)
    params: [{offset, nbytes}]                                         # into the payload
    buffers: [{nbytes, first_use, last_use}]                           # arena buffers
    placed_concats: [{nodes, output, inputs, bytes}]   # concats with no call (optional)
    kv_caches: [{input, output, nodes}]  # present = concat(past, new) with no call: present
                                       # and the new rows are views of past's buffer
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from collections import OrderedDict

from . import threads
from .artifact import library_kernel
from .cpu_features import nominal_peak_gflops
from .dims import DimError, ShapeExpr, bind_dims, pick_variant, variant_choices
from .instruments import Profiler, SessionOptions, check_outputs, inplace_inputs
from .memory_plan import MemoryPlan
from .output_pool import DEFAULT_DEPTH, OutputPool, aligned_bytes

__all__ = ["Session", "NodeArg", "MemoryLimitError"]


class MemoryLimitError(ValueError, MemoryError):
    """The model's planned memory exceeds what this host has available.

    Raised when a session is created, before the arena is allocated (rather than letting
    the kernel's OOM killer end the process on first touch).  It is a ``ValueError`` (a bad
    input size, as the CLI reports it) and a ``MemoryError``.
    """


def available_memory() -> int | None:
    """Bytes this process can still allocate (psutil; ``ONNXC_MEMORY_LIMIT`` overrides)."""
    import os

    env = os.environ.get("ONNXC_MEMORY_LIMIT")
    if env:
        return int(env)
    try:
        import psutil
    except ImportError:  # psutil is a dependency, but the runtime tolerates its absence
        return None
    return int(psutil.virtual_memory().available)


def check_memory(graph: dict, arena_bytes: int, params_bytes: int) -> None:
    """Refuse (MemoryLimitError) a plan that does not fit, naming the inputs and bytes."""
    need = arena_bytes + params_bytes
    avail = available_memory()
    if avail is None or need <= avail:
        return
    tensors = graph["tensors"]
    dims = graph.get("dims") or []
    at_max = {d["name"]: d["max"] for d in dims}  # the plan's sizes are the maxima's

    def desc(t):
        shape = ShapeExpr(t["shape"], at_max)(at_max)
        n = int(np.prod(shape, dtype=object)) * np.dtype(t["dtype"]).itemsize
        return f"{t['name']!r} {t['dtype']}{list(t['shape'])} ({n} bytes)", n

    inputs = [desc(tensors[i["tensor"]])[0] for i in graph["inputs"]]
    largest = max((desc(t) for t in tensors), key=lambda d: d[1], default=("none", 0))[0]
    raise MemoryLimitError(
        f"the model needs {need} bytes ({arena_bytes} of planned arena + {params_bytes} of "
        f"params), more than the {avail} bytes available on this host; inputs: "
        f"{', '.join(inputs) or 'none'}; largest tensor: {largest}"
        + (f" (symbolic dims at their maxima {at_max}: recompile with smaller --dim ranges)"
           if at_max else "") + ". Feed smaller shapes (batch, sequence length) or free memory")

# Prepared bindings (views + argument tuples) kept per arena, most recent first: a session
# serving many shapes prepares each once (~µs per tensor), not on every run.
MAX_BINDINGS = 16


# An input at least this large is read in place (when the kernels can take the caller's
# array); a smaller one is copied into the arena: copying 32 KiB costs about what wrapping
# the caller's array as a TVM tensor and patching the calls that read it costs.
IN_PLACE_MIN_BYTES = 32 * 1024

# The data alignment kernels assume of a buffer parameter unless the graph says otherwise:
# TVM marks every one with it (storage_alignment), and LLVM may then emit aligned vector
# moves, which fault on other addresses.  The compiler declares the parameters that read a
# model input element-aligned and records it as the input's ``align``
# (compiler/lowering/input_alignment.py); an input less aligned than its ``align`` (any
# input of an artifact without one) is copied into the arena.
KERNEL_ALIGN = 64


def arg_positions(call: dict) -> list[int]:
    """Each tensor argument's place in ``call``'s kernel arguments: the scalars
    (``call["scalars"]``, by position) sit between them."""
    at = {pos for pos, _ in call.get("scalars", ())}
    return [i for i in range(len(call["args"]) + len(at)) if i not in at]


def input_align(io: dict) -> int:
    """The alignment in bytes the kernels assume of graph input ``io``'s data."""
    return int(io.get("align", KERNEL_ALIGN))


# Argument lists kept per arena for a static model, one per combination of output slots
# (runtime/output_pool.py): a run whose slots were seen before patches nothing.
MAX_COMBOS = 16


class _Arena:
    """One arena's memory and what was prepared over it, per dims binding; for a static
    model also its output pools and the argument lists patched for their slots."""

    def __init__(self, data: np.ndarray):
        self.data = data
        self.prepared: OrderedDict = OrderedDict()
        self.pools: dict = {}  # arena buffer -> OutputPool (static models)
        self.combos: dict = {}  # ((buffer, slot), ...) -> calls with those slots bound


class _Prepared:
    """Views and kernel argument tuples for one binding of the dims."""

    __slots__ = ("views", "calls", "inputs", "outputs", "tvm_views", "binding")

    def __init__(self, views, calls, inputs, outputs, tvm_views, binding):
        self.views, self.calls, self.inputs, self.outputs = views, calls, inputs, outputs
        self.tvm_views, self.binding = tvm_views, binding


# numpy dtype name -> ONNX type string as onnxruntime prints it
_ONNX_TYPE = {"float32": "float", "float64": "double"}


def onnx_type(dtype: str) -> str:
    return f"tensor({_ONNX_TYPE.get(dtype, dtype)})"


def narrow_dtypes(manifest: dict) -> dict:
    """{input / output name: (numpy dtype, ONNX type name)} for the narrow element types
    (bfloat16, float8, float4, int4/int2), which the graph holds as their bit codes in
    uint8 / uint16; ml_dtypes (their numpy dtypes) is imported only for such a model."""
    entries = [e for e in list(manifest.get("inputs", ())) + list(manifest.get("outputs", ()))
               if e.get("ml_dtype")]
    if not entries:
        return {}
    try:
        import ml_dtypes
    except ImportError:
        raise RuntimeError(f"the model has {entries[0]['elem_type']} inputs or outputs, whose "
                           "numpy dtypes come from the ml_dtypes package: pip install "
                           "ml_dtypes") from None
    return {e["name"]: (np.dtype(getattr(ml_dtypes, e["ml_dtype"])), e["elem_type"])
            for e in entries}


class NodeArg:
    """An input or output of a session, shaped like onnxruntime's ``NodeArg``."""

    def __init__(self, name: str, shape, dtype: str, elem_type: str | None = None):
        self.name = name
        self.shape = list(shape)
        self.dtype = dtype
        self.type = f"tensor({elem_type})" if elem_type else onnx_type(dtype)

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def kv_buffers(graph: dict) -> dict:
    """{present output name: (past input name, arena buffer)} of the key/value caches
    appended in place (``graph["kv_caches"]``): one buffer holds past, the new rows and
    present, which is past's rows followed by the new ones."""
    tensors = graph["tensors"]
    ins = {i["name"]: i["tensor"] for i in graph["inputs"]}
    return {c["output"]: (c["input"], tensors[ins[c["input"]]]["index"])
            for c in graph.get("kv_caches", ())}


def permuted(shape, perm) -> list:
    """``shape`` as the caller sees a tensor stored permuted (``transpose(perm)``)."""
    return list(shape) if perm is None else [shape[p] for p in perm]


def direct_buffers(graph: dict) -> tuple[dict, dict, dict]:
    """The arena buffers a run may bind to other memory instead of copying.

    Returns ({input name: buffer} for inputs no kernel writes over (no in-place output) and
    that share their buffer with no output: the kernels may read the caller's array;
    {output name: buffer} for outputs whose buffer holds no other output: the kernels write
    the returned array, and the buffer's other tensors (written in place before it, or a
    model input it overwrites, copied in) move with it; {buffer: (bytes, [(tensor id,
    [(call, arg position)])])}).  A symbolic graph's sizes are taken at the dims' maxima
    (``graph["dims"]``): the bytes are what any binding needs at most.  Buffers holding a
    tensor empty even at the maxima stay in the arena (DLPack needs memory to point at)."""
    tensors = graph["tensors"]
    at_max = {d["name"]: d["max"] for d in graph.get("dims") or []}
    members: dict = {}
    for t, tt in enumerate(tensors):
        if tt["storage"] == "arena":
            members.setdefault(tt["index"], []).append(t)
    written, uses = set(), {}
    for k, call in enumerate(graph["calls"]):
        nin = len(call["args"]) - call["num_outputs"]
        for pos, t in enumerate(call["args"]):
            uses.setdefault(t, []).append((k, pos))
            if pos >= nin and tensors[t]["storage"] == "arena":
                written.add(tensors[t]["index"])

    def buf(t):
        return tensors[t]["index"] if tensors[t]["storage"] == "arena" else None

    def nbytes(t):
        shape = ShapeExpr(tensors[t]["shape"], at_max)(at_max)
        return math.prod(shape) * np.dtype(tensors[t]["dtype"]).itemsize

    # a buffer holding tensors at offsets (a placed concat's) is not rebound: the rebinding
    # views every member from the start of the bound memory
    at_offset = {tt["index"] for tt in tensors if tt.get("offset") and tt["storage"] == "arena"}
    in_bufs = [buf(i["tensor"]) for i in graph["inputs"]]
    out_bufs = [buf(o["tensor"]) for o in graph["outputs"]]
    usable = {b for b, ts in members.items() if all(nbytes(t) for t in ts)} - at_offset
    direct_in = {i["name"]: b for i, b in zip(graph["inputs"], in_bufs)
                 if b in usable and b not in written and in_bufs.count(b) == 1
                 and b not in out_bufs}
    direct_out = {o["name"]: b for o, b in zip(graph["outputs"], out_bufs)
                  if b in usable and in_bufs.count(b) <= 1 and out_bufs.count(b) == 1}
    kv = {b for _, b in kv_buffers(graph).values()}  # bound by _bind's own rule
    buffer_uses = {b: (max(nbytes(t) for t in members[b]),
                       [(t, uses.get(t, [])) for t in members[b]])
                   for b in set(direct_in.values()) | set(direct_out.values()) | kv}
    return direct_in, direct_out, buffer_uses


def _names_in(exprs, names) -> set:
    """The dim names that shape entries / expressions ``exprs`` read."""
    import ast

    found = set()
    for e in exprs:
        if isinstance(e, str):
            found |= {n.id for n in ast.walk(ast.parse(e, mode="eval"))
                      if isinstance(n, ast.Name) and n.id in names}
    return found


_aligned_bytes = aligned_bytes  # the name tests and iobinding import


def _place_params(params) -> np.ndarray:
    """The payload as aligned, DLPack-exportable memory: in place when it already is."""
    if (isinstance(params, np.ndarray) and params.dtype == np.uint8 and params.ndim == 1
            and params.size and params.flags.c_contiguous and params.flags.writeable
            and params.ctypes.data % 64 == 0):
        return params
    out = _aligned_bytes(max(len(params), 1))
    out[:len(params)] = np.frombuffer(params, dtype=np.uint8)
    return out


class Session:
    """Runs one compiled model.  Use :func:`runtime.load` or ``CompiledModel.session()``.

    Parameters
    ----------
    meta : dict
        ``manifest``, ``graph`` and ``memory_plan`` as stored in the artifact.
    params : bytes-like
        The params payload.  A uint8 numpy array whose data is 64-byte aligned (what
        :func:`runtime.load` passes: the artifact's file mapping) is used in place, so the
        param tensors alias it; anything else is copied once into aligned memory.
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
        self._runs = 0
        self._inplace = None  # per call, inputs overwritten in place (NaN checks only)

        check_memory(graph, self.plan.arena_bytes, len(params))  # before allocating
        target = self.manifest.get("target", {})
        self.num_threads = threads.configure(self.options.intra_op_num_threads,
                                             target.get("cores", 0))
        self._profiler = (Profiler(self.options.profile_file_prefix, nominal_peak_gflops(
            target.get("lanes_fp32", 0), self.num_threads), graph.get("placed_concats", ()))
            if self.options.enable_profiling else None)
        self._arena = _aligned_bytes(max(self.plan.arena_bytes, 1))
        self._params = _place_params(params)

        self._fns = [library_kernel(kernels, call["kernel"]) for call in graph["calls"]]
        # Symbolic dims (runtime/dims.py): shapes are expressions of them, bound per run
        self.dims = graph.get("dims") or []
        names = {d["name"] for d in self.dims}
        # what a binding must satisfy beyond the ranges (compiler/lowering/graph.py checks)
        self._checks = [(ShapeExpr([c["lhs"], c["rhs"]], names), c["what"])
                        for c in graph.get("checks", ())]
        # row-tile variants (compiler/lowering/row_variants.py): (rows expression,
        # [(name, tile, cost)], [function]), the call's own kernel first; one runs per binding
        self._row_variants = []
        for call in graph["calls"]:
            found = variant_choices(call)
            self._row_variants.append(None if found is None else (
                ShapeExpr([found[0]], names), found[1],
                [library_kernel(kernels, k) for k, _, _ in found[1]]))
        self._shapes = [ShapeExpr(t["shape"], names) for t in graph["tensors"]]
        # bytes into the buffer: ints, or expressions of the dims (a cache's new rows)
        self._offsets = [ShapeExpr([t.get("offset", 0)], names) for t in graph["tensors"]]
        # integer kernel arguments computed from the dims: (position, expression)
        self._scalars = [[(pos, ShapeExpr([e], names)) for pos, e in call.get("scalars", ())]
                         for call in graph["calls"]]
        # which tensors' shapes and which calls' ints read each dim (_prepare rebuilds
        # only those when a dim changes), and the calls each tensor is an argument of
        self._tensors_of_dim: dict = {}
        for t, tt in enumerate(graph["tensors"]):
            for n in _names_in(list(tt["shape"]) + [tt.get("offset", 0)], names):
                self._tensors_of_dim.setdefault(n, []).append(t)
        self._calls_of_dim: dict = {}
        self._calls_of_tensor = [[] for _ in graph["tensors"]]
        for k, (call, scalars) in enumerate(zip(graph["calls"], self._scalars)):
            for t in set(call["args"]):
                self._calls_of_tensor[t].append(k)
            for n in _names_in([e for _, e in call.get("scalars", ())], names):
                self._calls_of_dim.setdefault(n, []).append(k)
        self._arg_index = [arg_positions(call) for call in graph["calls"]]
        # sequence-major key/value caches: {input / output name: perm} (callers see
        # the stored tensor transposed by perm), {present name: (past name, buffer)}
        self._perms = {io["name"]: io["perm"] for io in graph["inputs"] + graph["outputs"]
                       if io.get("perm")}
        self._kv = kv_buffers(graph)
        self._declared = [(i["name"], permuted(graph["tensors"][i["tensor"]]["shape"],
                                                i.get("perm"))) for i in graph["inputs"]]
        self._index_bounds: dict = {}
        for b in self.manifest.get("index_bounds", ()):
            self._index_bounds.setdefault(b["input"], []).append(b)
        self._input_names = [i["name"] for i in graph["inputs"]]
        self._outputs_tensor = {o["name"]: o["tensor"] for o in graph["outputs"]}
        self._input_tensors = [i["tensor"] for i in graph["inputs"]]
        self._output_names = [o["name"] for o in graph["outputs"]]
        self._narrow = narrow_dtypes(self.manifest)  # name -> (ml_dtypes dtype, ONNX name)

        # Concurrent run(): a pool of arenas (this one first), grown on demand up to one per
        # CPU, never past available memory.  scripts/bench_threads.py: 8 threads on a
        # 2-CPU host ran 1.1-1.3x faster than one locked arena, while an arena per thread
        # was slower on the larger models (the kernels' own thread pools oversubscribe).
        # Profiling / NaN checks read the first arena's views: those sessions keep one.
        # Each arena keeps its prepared views and argument tuples per dims binding (one
        # binding for a static model), the MAX_BINDINGS most recent.
        instrumented = self._profiler is not None or self.options.check_nan
        self.max_arenas = 1 if instrumented else max(1, os.cpu_count() or 1)
        self._first = _Arena(self._arena)
        first = self._prepare(self._first, {}) if not self.dims else None
        if first is not None:  # static: the views the instruments and tools read
            self._np, self._calls = first.views, first.calls
        self._free = [self._first]
        # inputs read in place, outputs written into the returned arrays (bind_io); a
        # symbolic graph's bound memory is sized per run (at most the dims' maxima)
        self._direct_in, self._direct_out, self._buffer_uses = (
            ({}, {}, {}) if instrumented or not self.options.bind_io
            else direct_buffers(graph))
        self._input_align = {io["name"]: input_align(io) for io in graph["inputs"]}
        self._arenas = 1
        self._pool = threading.Condition(threading.Lock())
        self._waiting = 0  # threads waiting in _acquire for an arena
        self._output_depth = DEFAULT_DEPTH if self.options.reuse_outputs else 0
        self._static_plan(instrumented)

    def _static_plan(self, instrumented: bool) -> None:
        """What ``run()`` of a static model needs, computed once (``_run_static``): the
        feed's expected (name, dtype, shape), each input's view, the bound output buffer
        that holds it (if any), and when it may be read in place its buffer's tensors and
        the kernel arguments they fill, and each bound output buffer's tensors and their
        arguments.  None for symbolic or instrumented sessions, for models with
        sequence-major key/value caches (stored transposed: ``_execute`` copies them in and
        out) and for models with narrow-typed inputs or outputs (bfloat16, float8, int4...:
        ``_execute`` views their codes as ml_dtypes), which take ``_execute``."""
        self._static = None
        if self.dims or instrumented or self._perms or self._narrow:
            return
        tensors = self.graph["tensors"]

        def spec(t):
            return t, tuple(tensors[t]["shape"]), np.dtype(tensors[t]["dtype"])

        def args_of(uses):
            return [(k, self._arg_index[k][pos]) for k, pos in uses]

        # (name, dtype, shape, has index bounds); None: narrow types, checked by _check_feed
        feed = None if self._narrow else [
            (io["name"], np.dtype(tensors[io["tensor"]]["dtype"]),
             tuple(tensors[io["tensor"]]["shape"]), io["name"] in self._index_bounds)
            for io in self.graph["inputs"]]
        outputs = {b: ([spec(m) for m, _ in self._buffer_uses[b][1]],
                       [(m, args_of(uses)) for m, uses in self._buffer_uses[b][1]])
                   for b in set(self._direct_out.values())}
        inputs = []
        for io in self.graph["inputs"]:
            t, b = io["tensor"], self._direct_in.get(io["name"])
            held = tensors[t]["index"] if tensors[t]["storage"] == "arena" else None
            in_place = None
            if b is not None and self._bound_bytes(b, {}) >= IN_PLACE_MIN_BYTES:
                in_place = ([spec(m) + (args_of(uses),) for m, uses in self._buffer_uses[b][1]],
                            self._input_align[io["name"]])
            inputs.append((io["name"], t, held if held in outputs else None, in_place))
        self._static = (feed, inputs, outputs)

    # -- the arena pool ------------------------------------------------------------------
    def _prepare(self, arena: "_Arena", binding: dict) -> "_Prepared":
        """Views at their planned offsets with the shapes of ``binding`` ({dim: value}),
        and one argument tuple per call (with the ints kernels take, from the dims).

        A new binding starts from the arena's most recent one and rebuilds only the
        views and calls that read a dim whose value changed: a decoder's step with a
        past one longer touches the cache-shaped tensors, not the whole graph."""
        import tvm

        key = tuple(sorted(binding.items()))
        prepared = arena.prepared.get(key)
        if prepared is not None:
            arena.prepared.move_to_end(key)
            return prepared
        tensors = self.graph["tensors"]
        prev = next(reversed(arena.prepared.values())) if arena.prepared else None
        if prev is None:
            touched_t, touched_c = range(len(tensors)), range(len(self._fns))
            nps, tvm_views, calls = [None] * len(tensors), [None] * len(tensors), []
        else:
            changed = [n for n, v in binding.items() if prev.binding.get(n) != v]
            touched_t = sorted({t for n in changed for t in self._tensors_of_dim.get(n, ())})
            touched_c = sorted({k for t in touched_t for k in self._calls_of_tensor[t]}
                               | {k for n in changed for k in self._calls_of_dim.get(n, ())})
            nps, tvm_views, calls = list(prev.views), list(prev.tvm_views), list(prev.calls)
        for t in touched_t:
            v = self._view(tensors[t], self._shapes[t](binding), arena.data,
                           self._offsets[t](binding)[0])
            nps[t] = v
            tvm_views[t] = tvm.runtime.from_dlpack(v) if v.size else None
        for k in touched_c:
            call = self.graph["calls"][k]
            args = [tvm_views[i] if tvm_views[i] is not None else
                    tvm.runtime.empty(nps[i].shape, nps[i].dtype.name) for i in call["args"]]
            for pos, e in self._scalars[k]:  # in increasing position
                args.insert(pos, int(e(binding)[0]))
            fn = self._fns[k]
            variant = self._row_variants[k]
            if variant is not None:
                rows, choices, fns = variant
                fn = fns[pick_variant(rows(binding)[0], choices)]
            if prev is None:
                calls.append((fn, tuple(args)))
            else:
                calls[k] = (fn, tuple(args))
        prepared = _Prepared(nps, calls,
                             [(i["name"], nps[i["tensor"]]) for i in self.graph["inputs"]],
                             {o["name"]: nps[o["tensor"]] for o in self.graph["outputs"]},
                             tvm_views, dict(binding))
        arena.prepared[key] = prepared
        if len(arena.prepared) > MAX_BINDINGS:
            arena.prepared.popitem(last=False)
        return prepared

    def _new_context(self) -> "_Arena":
        """Another arena (its views and argument tuples are prepared per binding)."""
        return _Arena(_aligned_bytes(max(self.plan.arena_bytes, 1)))

    def _acquire(self):
        try:  # list.pop is atomic: the uncontended case takes no lock
            return self._free.pop()
        except IndexError:
            pass
        with self._pool:
            # counted before looking at _free: a _release that appends after this look
            # sees the count and notifies (no lost wake-up)
            self._waiting += 1
            try:
                while True:
                    try:  # a lock-free _acquire may have emptied _free since any look
                        return self._free.pop()
                    except IndexError:
                        pass
                    if self._arenas < self.max_arenas and self._can_grow():
                        self._arenas += 1
                        break
                    self._pool.wait()
            finally:
                self._waiting -= 1
        try:
            return self._new_context()
        except BaseException:
            with self._pool:
                self._arenas -= 1
                self._pool.notify()
            raise

    def _release(self, ctx) -> None:
        self._free.append(ctx)
        if self._waiting:
            with self._pool:
                self._pool.notify()

    def _can_grow(self) -> bool:
        avail = available_memory()
        return avail is None or 2 * self.plan.arena_bytes < avail

    def _view(self, t: dict, shape, arena, offset: int = 0) -> np.ndarray:
        dtype = np.dtype(t["dtype"])
        nbytes = math.prod(shape) * dtype.itemsize  # np.prod costs ~10 us a call here
        if t["storage"] == "arena":
            start = self.plan.offsets[t["index"]] + offset
            base = arena
        else:
            start = self.graph["params"][t["index"]]["offset"]
            base = self._params
        return base[start:start + nbytes].view(dtype).reshape(shape)

    # -- onnxruntime-shaped API ------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        """The inputs; a symbolic dim is given by its name (``[1, 'seq']``), as onnxruntime."""
        return [self._node_arg(i) for i in self.graph["inputs"]]

    def get_outputs(self) -> list[NodeArg]:
        return [self._node_arg(o) for o in self.graph["outputs"]]

    def _node_arg(self, io: dict) -> NodeArg:
        t = self.graph["tensors"][io["tensor"]]
        name, shape = io["name"], permuted(t["shape"], io.get("perm"))
        if name in self._narrow:
            dtype, elem_type = self._narrow[name]
            return NodeArg(name, shape, dtype.name, elem_type)
        return NodeArg(name, shape, t["dtype"])

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
        if output_names is None:
            names = self._output_names
        else:
            names = list(output_names)
            for n in names:
                if n not in self._output_names:
                    raise ValueError(f"unknown output {n!r}; the model's outputs are "
                                     f"{self._output_names}")
        if self._static is not None:
            return self._run_static(names, self._static_feed(input_feed))
        return self._execute(names, self._check_feed(input_feed), None)

    def _static_feed(self, feed) -> dict:
        """``feed`` itself when every input is a plain ndarray of exactly the declared dtype
        and shape (a few tuple compares); anything else goes through ``_check_feed``,
        which accepts what it can (ndarray subclasses, narrow types) and words the error."""
        spec = self._static[0]
        if spec is None or type(feed) is not dict or len(feed) != len(spec):
            return self._check_feed(feed)
        for name, dtype, shape, bounded in spec:
            a = feed.get(name)
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:
                return self._check_feed(feed)
            if bounded:
                self._check_indices(name, a)
        return feed

    def _run_static(self, names, arrays: dict) -> list:
        """``_execute`` for a static model without instruments or bound memory, from the
        plan made at load (``_static_plan``): bound outputs come from the arena's output
        pools, whose argument lists are kept per combination of slots; an input of
        ``IN_PLACE_MIN_BYTES`` or more is read in place when the kernels can take it."""
        _, inputs, outputs = self._static
        arena = self._acquire()
        try:
            prepared = arena.prepared.get(())
            if prepared is None:
                prepared = self._prepare(arena, {})
            calls = prepared.calls
            slots: dict = {}  # output buffer -> the slot its tensors are written in
            for n in names:
                b = self._direct_out.get(n)
                if b is not None and b not in slots:
                    pool = arena.pools.get(b)
                    if pool is None:
                        pool = arena.pools[b] = OutputPool(
                            self._bound_bytes(b, {}), outputs[b][0], self._output_depth)
                    slots[b] = pool.take()
            if slots:
                calls = self._slot_calls(arena, calls, slots)
            patched = None
            for name, t, held, in_place in inputs:
                a = arrays[name]
                if in_place is not None:
                    tvs = self._wrap_input(a, *in_place)
                    if tvs is not None:
                        if patched is None:
                            patched = {}
                        for (_, _, _, uses), tv in zip(in_place[0], tvs):
                            for k, pos in uses:
                                patched.setdefault(k, list(calls[k][1]))[pos] = tv
                        continue
                view = prepared.views[t] if held not in slots else slots[held].views[t]
                np.copyto(view, a, casting="no")
            if patched:
                calls = list(calls)
                for k, args in patched.items():
                    calls[k] = (calls[k][0], tuple(args))
            for fn, args in calls:
                fn(*args)
            result, given = [], set()
            for n in names:
                b = self._direct_out.get(n)
                if b in slots and b not in given:
                    result.append(slots[b].give(self._outputs_tensor[n]))
                    given.add(b)
                else:  # not bound, or asked for twice: a copy
                    t = self._outputs_tensor[n]
                    result.append((slots[b].views[t] if b in slots else
                                   prepared.views[t]).copy())
            return result
        finally:
            self._release(arena)

    def _slot_calls(self, arena: "_Arena", calls: list, slots: dict) -> list:
        """``calls`` with the output buffers' tensors on ``slots``; kept per combination
        of pooled slots (at most MAX_COMBOS per arena)."""
        key = tuple((b, s.key) for b, s in slots.items())
        cached = arena.combos.get(key)
        if cached is not None:
            return cached
        patched: dict = {}
        for b, slot in slots.items():
            for t, uses in self._static[2][b][1]:
                tv = slot.tensors[t]
                if tv is None:  # empty: the prepared call's memory-less argument stays
                    continue
                for k, pos in uses:
                    patched.setdefault(k, list(calls[k][1]))[pos] = tv
        new = list(calls)
        for k, args in patched.items():
            new[k] = (calls[k][0], tuple(args))
        if None not in (s.key for s in slots.values()) and len(arena.combos) < MAX_COMBOS:
            arena.combos[key] = new
        return new

    @staticmethod
    def _wrap_input(a: np.ndarray, members, align: int) -> list | None:
        """TVM tensors over the caller's array ``a`` for each tensor of its buffer
        (``members``: (tensor, shape, dtype, uses)), or None when the kernels cannot read it
        where it is (not C-contiguous, read-only: DLPack exports no read-only memory, or
        less than ``align``-aligned)."""
        import tvm_ffi

        if not (a.flags.c_contiguous and a.flags.writeable) or a.ctypes.data % align:
            return None
        if len(members) == 1 and members[0][1] == a.shape:
            return [tvm_ffi.from_dlpack(a, require_alignment=align, require_contiguous=True)]
        raw = a.reshape(-1).view(np.uint8)
        return [tvm_ffi.from_dlpack(raw[:math.prod(shape) * dtype.itemsize].view(dtype)
                                    .reshape(shape), require_alignment=align,
                                    require_contiguous=True)
                for _, shape, dtype, _ in members]

    def io_binding(self):
        """A new :class:`runtime.iobinding.IOBinding` for :meth:`run_with_iobinding`
        (onnxruntime's ``IOBinding``: inputs read in place, outputs into bound or
        runtime-owned memory, a present key/value fed back as the next past without a copy)."""
        from .iobinding import IOBinding

        return IOBinding(self)

    def _bound_dims(self, arrays: dict) -> dict:
        """The dims bound from the fed ``arrays`` (``runtime/dims.py``), with the graph's
        checks (a symbolic reshape's element counts) evaluated: DimError naming the node
        when the feeds break them."""
        if not self.dims:
            return {}
        binding = bind_dims(self.dims, self._declared, arrays)
        for counts, what in self._checks:
            have, want = counts(binding)
            if have != want:
                raise DimError(f"{what}: {have} elements cannot become {want} at {binding}; "
                               "the inputs' shapes do not fit together")
        return binding

    def run_with_iobinding(self, iobinding) -> None:
        """Run with the inputs and outputs bound in ``iobinding`` (see
        :class:`runtime.iobinding.IOBinding`); its ``get_outputs()`` gives the results."""
        if getattr(iobinding, "_session", None) is not self:
            raise ValueError("this IOBinding was not made by this session's io_binding()")
        arrays = self._check_feed(iobinding._inputs)
        binding = self._bound_dims(arrays)
        names, memory = iobinding._prepare_run(arrays, binding)
        iobinding._set_results(self._execute(names, arrays, memory, binding))

    def output_bytes(self, name: str, binding: dict) -> int:
        """Bytes of memory that output ``name`` is written into at ``binding`` ({dim: value};
        ``{}`` for a static model): its arena buffer's, when the kernels may write it
        directly (tensors computed in place before it share that buffer), else its own."""
        b = self._direct_out.get(name)
        if b is None and name in self._kv and self._kv[name][1] in self._buffer_uses:
            b = self._kv[name][1]
        if b is not None:
            return self._bound_bytes(b, binding)
        t = self._outputs_tensor[name]
        return math.prod(self._shapes[t](binding)) * np.dtype(
            self.graph["tensors"][t]["dtype"]).itemsize

    def _execute(self, names, arrays: dict, memory: dict | None, binding=None) -> list:
        """One run over checked ``arrays``; ``memory``: {output name: uint8 array} the
        outputs are written into (directly when the kernels can, else copied), None for
        fresh arrays.  Returns the outputs ``names``."""
        if binding is None:
            binding = self._bound_dims(arrays)
        arena = self._acquire()  # an arena of the pool; waits when all are busy
        try:
            prepared = self._prepare(arena, binding)
            if arena is self._first:  # what tools read after a run (onnxc debug, NaN checks)
                self._np, self._calls = prepared.views, prepared.calls
            calls, outputs = prepared.calls, prepared.outputs
            # buffer -> caller's / fresh / bound array
            bound, in_place = self._bind(names, arrays, binding, memory)
            views: dict = {}  # tensor id -> its view on bound memory
            if bound:
                calls, views = self._rebind(calls, bound, binding)
            for (name, view), t in zip(prepared.inputs, self._input_tensors):
                if name not in in_place:
                    dst = views.get(t, view)
                    if name in self._perms:  # a sequence-major cache: stored transposed
                        dst = dst.transpose(self._perms[name])
                    np.copyto(dst, arrays[name], casting="no")
            if self._profiler is None and not self.options.check_nan:
                for fn, args in calls:
                    fn(*args)
            else:  # max_arenas is 1: this is the first arena, which the instruments read
                self._run_instrumented(binding)
            result, given = [], set()
            for n in names:
                t = self._outputs_tensor[n]
                perm = self._perms.get(n)
                if memory is not None and n in memory:
                    out = self._into(memory[n], views.get(t, outputs[n]))
                    out = out if perm is None else out.transpose(perm)
                elif perm is not None:  # a sequence-major cache, in the model's layout
                    out = views.get(t, outputs[n]).transpose(perm).copy()  # always a copy
                else:
                    out = outputs[n].copy() if t not in views else (
                        views[t].copy() if t in given else views[t])  # asked twice: a copy
                given.add(t)
                result.append(out if n not in self._narrow else out.view(self._narrow[n][0]))
            return result
        finally:
            self._release(arena)

    @staticmethod
    def _into(raw: np.ndarray, value: np.ndarray) -> np.ndarray:
        """``value`` as a view on ``raw`` (uint8): itself when the kernels wrote it there,
        else copied in."""
        if value.size and value.ctypes.data == raw.ctypes.data:
            return value
        out = raw[:value.nbytes].view(value.dtype).reshape(value.shape)
        np.copyto(out, value)
        return out

    def _bound_bytes(self, b: int, binding: dict) -> int:
        """Bytes arena buffer ``b``'s tensors take at ``binding``."""
        tensors = self.graph["tensors"]
        return max(math.prod(self._shapes[t](binding)) * np.dtype(tensors[t]["dtype"]).itemsize
                   for t, _ in self._buffer_uses[b][1])

    def _bind(self, names, arrays: dict, binding: dict, memory: dict | None = None
              ) -> tuple[dict, set]:
        """The arena buffers this run binds to other memory: each requested output's to
        ``memory[name]`` when given and large and aligned enough, else to a fresh aligned
        array; an input's to the caller's array when the kernels can take it as it is
        (aligned, contiguous, writable: DLPack exports no read-only memory); and the names
        of the inputs so read in place."""
        bound, in_place = {}, set()
        for n in names:
            b = self._direct_out.get(n)
            if b is not None and b not in bound:
                need = self._bound_bytes(b, binding)
                raw = memory.get(n) if memory else None
                if raw is not None and raw.nbytes >= need and raw.ctypes.data % 64 == 0:
                    bound[b] = raw[:need]
                else:
                    bound[b] = _aligned_bytes(need)
        for name, b in self._direct_in.items():
            a = arrays[name]
            if (a.flags.c_contiguous and a.flags.writeable
                    and a.ctypes.data % self._input_align[name] == 0):
                bound[b] = a.reshape(-1).view(np.uint8)
                in_place.add(name)
        for out, (name, b) in self._kv.items():
            # a cache appended in place: its buffer is the memory present is bound to; the
            # past is read there when it lies at its start, stored sequence-major (the
            # present view of the previous step), else copied in
            raw = memory.get(out) if memory and b in self._buffer_uses else None
            if raw is None:
                continue
            need = self._bound_bytes(b, binding)
            if raw.nbytes < need or raw.ctypes.data % 64:
                continue
            bound[b] = raw[:need]
            if self._stored_at(arrays[name], raw, self._perms[name]):
                in_place.add(name)
        return bound, in_place

    @staticmethod
    def _stored_at(a: np.ndarray, raw: np.ndarray, perm) -> bool:
        """``a`` is the array stored from the start of ``raw`` in the permuted layout
        (``raw``'s elements, ``[P, B, H, D]``, seen transposed by ``perm``)."""
        if not a.size:
            return True
        if a.ctypes.data != raw.ctypes.data or not a.flags.writeable:
            return False
        stored = [a.shape[k] for k in np.argsort(perm)]
        want = raw[:a.nbytes].view(a.dtype).reshape(stored).transpose(perm)
        return want.shape == a.shape and want.strides == a.strides

    def _rebind(self, calls: list, bound: dict, binding: dict) -> tuple[list, dict]:
        """``calls`` with the bound buffers' tensors swapped in (the arena's views stay as
        they are for the next run), and {tensor id: its view on the bound memory}.  A
        tensor empty at this binding keeps the prepared call's empty argument."""
        import tvm_ffi

        tensors = self.graph["tensors"]
        patched: dict = {}
        views: dict = {}
        for b, raw in bound.items():
            for t, uses in self._buffer_uses[b][1]:
                shape = self._shapes[t](binding)
                dtype = np.dtype(tensors[t]["dtype"])
                start = self._offsets[t](binding)[0]
                v = raw[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(
                    shape)
                views[t] = v
                if not v.size:
                    continue
                # an input's memory is as aligned as _bind checked (input_align)
                tv = tvm_ffi.from_dlpack(v, require_alignment=dtype.itemsize,
                                         require_contiguous=True)
                for k, pos in uses:
                    patched.setdefault(k, list(calls[k][1]))[self._arg_index[k][pos]] = tv
        new = list(calls)
        for k, args in patched.items():
            new[k] = (calls[k][0], tuple(args))
        return new, views

    def _run_instrumented(self, binding: dict | None = None) -> None:
        import time

        calls, tensors, prof = self.graph["calls"], self.graph["tensors"], self._profiler
        check = self.options.check_nan
        if check and self._inplace is None:
            self._inplace = inplace_inputs(self.graph)
            self._model_inputs = {i["tensor"] for i in self.graph["inputs"]}
        for k, ((fn, args), call) in enumerate(zip(self._calls, calls)):
            # inputs an in-place output overwrites: kept for the check (a copy, on such calls)
            saved = {i: self._np[i].copy() for i in self._inplace[k]} if check else None
            start = time.perf_counter_ns()
            fn(*args)
            end = time.perf_counter_ns()
            if prof is not None:
                rec = call
                if fn is not self._fns[k]:  # a row variant: its own name
                    _, choices, fns = self._row_variants[k]
                    rec = {**call, "kernel": next(c[0] for c, f in zip(choices, fns)
                                                  if f is fn)}
                prof.record(rec, start, end, tensors, self._runs, binding)
            if check:
                check_outputs(call, self._np, tensors, self._kernels, saved, self._model_inputs)
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
        expected = self._input_names
        unknown = [k for k in feed if k not in expected]
        if unknown:
            raise ValueError(f"unknown input {unknown[0]!r}; the model's inputs are {expected}")
        missing = [n for n in expected if n not in feed]
        if missing:
            raise ValueError(f"missing input {missing[0]!r}; the model's inputs are {expected}")
        arrays = {}
        tensors = self.graph["tensors"]
        for io, (_, declared) in zip(self.graph["inputs"], self._declared):
            name, want_dtype = io["name"], np.dtype(tensors[io["tensor"]]["dtype"])
            a = feed[name]
            if not isinstance(a, np.ndarray):
                raise ValueError(f"input {name!r}: expected a numpy array, got "
                                 f"{type(a).__name__}")
            want, elem_type = self._narrow.get(name, (want_dtype, None))
            if a.dtype != want:
                raise ValueError(f"input {name!r}: expected dtype "
                                 f"{f'tensor({elem_type})' if elem_type else onnx_type(want.name)}"
                                 f", got {onnx_type(a.dtype.name)}")
            if elem_type:  # the graph holds the codes (ml_dtypes stores them so)
                a = a.view(want_dtype)
            if not self.dims and list(a.shape) != list(declared):  # symbolic: bind_dims
                raise ValueError(f"input {name!r}: expected shape {list(declared)}, got "
                                 f"{list(a.shape)}")
            self._check_indices(name, a)
            arrays[name] = a
        return arrays

    def _check_indices(self, name: str, a: np.ndarray) -> None:
        """Refuse index values outside what the gather kernels reading input ``name`` index:
        out of range, the kernel would read outside its table."""
        for b in self._index_bounds.get(name, ()):
            if "sizes" in b:  # GatherND / ScatterND: a column per addressed axis
                if a.ndim == 0 or a.shape[-1] != len(b["sizes"]) or not a.size:
                    continue  # a shape mismatch is the kernel's shape check's to refuse
                cols = a.reshape(-1, len(b["sizes"]))
                for j, (low, high) in enumerate(zip(b["low"], b["high"])):
                    least, most = cols[:, j].min(), cols[:, j].max()
                    if least < low or most > high:
                        bad = most if most > high else least
                        raise ValueError(
                            f"input {name!r}: values are coordinates into node "
                            f"{b['node']!r} ({b['op']}); column {j} addresses an axis of "
                            f"size {b['sizes'][j]} and must lie in [{low}, {high}]; got {bad}")
                continue
            if a.size and (a.min() < b["low"] or a.max() > b["high"]):
                bad = a.max() if a.max() > b["high"] else a.min()
                raise ValueError(f"input {name!r}: values are indices into node "
                                 f"{b['node']!r} ({b['op']}, axis of size {b['size']}) and "
                                 f"must lie in [{b['low']}, {b['high']}]; got {bad}")
