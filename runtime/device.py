"""Running a model whose kernels live on a device (CUDA): the arena in device memory.

:class:`DeviceSession` is :class:`runtime.session.Session`'s counterpart for artifacts built
for ``cuda`` targets; the CPU path does not go through this file.  At load it allocates one
arena and one params region in device memory (``tvm.runtime.empty(..., tvm.cuda(0))``),
copies the params once, and makes a tensor per graph tensor at its planned offset.  The
views are DLPack tensors whose *data pointer* is the base pointer plus the offset and whose
``byte_offset`` is 0 (TVM's kernels require ``byte_offset == 0``, so
``Tensor._create_view``, which sets ``byte_offset``, cannot be used); they are built with
ctypes and imported with ``tvm.runtime.from_dlpack``.  ``run`` copies the inputs host to
device, launches the kernels in order, synchronises and copies the outputs back.

The same class runs on ``tvm.cpu(0)`` (tests check the whole mechanism without a GPU).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from .artifact import ArtifactError, library_kernel
from .memory_plan import MemoryPlan

__all__ = ["DeviceSession", "check_cuda", "dlpack_view"]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER)]


# Module-level, never freed: the tensors' deleter may run at interpreter shutdown.
_live: dict[int, object] = {}
_live_lock = threading.Lock()


@_DELETER
def _release(ptr):  # the views own no memory: forget their DLPack structs
    with _live_lock:
        _live.pop(ptr, None)


_CODES = {"i": 0, "u": 1, "f": 2}
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def dlpack_view(base, offset: int, shape, dtype: str):
    """A TVM tensor of ``shape``/``dtype`` at ``offset`` bytes into ``base`` (a TVM tensor),
    with the data pointer moved (``byte_offset`` 0).  ``base`` must outlive the view."""
    import tvm

    dt = np.dtype(dtype)
    shape = [int(s) for s in shape]
    mt = _DLManagedTensor()
    shape_arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    dev = base.device
    mt.dl_tensor.data = base.data_ptr() + int(offset)
    mt.dl_tensor.device = _DLDevice(dev.dlpack_device_type(), dev.index)
    mt.dl_tensor.ndim = len(shape)
    mt.dl_tensor.dtype = _DLDataType(_CODES[dt.kind], dt.itemsize * 8, 1)
    mt.dl_tensor.shape = shape_arr
    mt.dl_tensor.strides = None
    mt.dl_tensor.byte_offset = 0
    mt.manager_ctx = None
    mt.deleter = _release
    addr = ctypes.addressof(mt)
    with _live_lock:
        _live[addr] = (mt, shape_arr)
    return tvm.runtime.from_dlpack(_capsule_new(addr, b"dltensor", None))


def check_cuda(target: dict, where: str) -> None:
    """Refuse (ArtifactError) a CUDA artifact this process cannot run."""
    import tvm

    gpu = target.get("cpu") or target.get("tvm", {}).get("arch", "?")
    if not tvm.runtime.enabled("cuda"):
        raise ArtifactError(f"{where}: built for an NVIDIA GPU ({gpu}), but this TVM runtime "
                            f"(TVM {tvm.__version__}) has no CUDA support (the PyPI apache-tvm "
                            "wheel is CPU-only); run it with a CUDA-enabled TVM build, or "
                            "recompile with --target host")
    if not tvm.cuda(0).exist:
        raise ArtifactError(f"{where}: built for an NVIDIA GPU ({gpu}), but no CUDA device "
                            "is visible (nvidia-smi, CUDA_VISIBLE_DEVICES); recompile with "
                            "--target host")


class DeviceSession:
    """Runs one compiled model with its arena on ``device`` (default ``tvm.cuda(0)``).

    The onnxruntime-shaped API of :class:`runtime.Session` (``run``, ``get_inputs``,
    ``get_outputs``, ``get_modelmeta``).  Profiling and NaN checks are CPU-only for now.
    """

    def __init__(self, meta: dict, params, kernels, options=None, device=None):
        import tvm

        if options is not None and (options.enable_profiling or options.check_nan):
            raise ValueError("profiling and NaN/Inf checks are not available for device "
                             "sessions yet")
        self.manifest = meta["manifest"]
        self.graph = graph = meta["graph"]
        self.plan = MemoryPlan.from_dict(meta["memory_plan"])
        self.device = dev = tvm.cuda(0) if device is None else device
        self._kernels = kernels
        self._lock = threading.Lock()

        self._arena = tvm.runtime.empty((max(self.plan.arena_bytes, 1),), "uint8", dev)
        host_params = np.zeros(max(len(params), 1), dtype=np.uint8)
        host_params[:len(params)] = np.frombuffer(params, dtype=np.uint8)
        self._params = tvm.runtime.empty(host_params.shape, "uint8", dev)
        self._params.copyfrom(host_params)

        self._views = []
        for t in graph["tensors"]:
            if int(np.prod(t["shape"], dtype=np.int64)) == 0:
                self._views.append(tvm.runtime.empty(t["shape"], t["dtype"], dev))
                continue
            if t["storage"] == "arena":
                base, off = self._arena, self.plan.offsets[t["index"]] + t.get("offset", 0)
            else:
                base, off = self._params, graph["params"][t["index"]]["offset"]
            self._views.append(dlpack_view(base, off, t["shape"], t["dtype"]))
        self._calls = []
        for call in graph["calls"]:
            fn = library_kernel(kernels, call["kernel"])
            self._calls.append((fn, tuple(self._views[i] for i in call["args"])))
        tensors = graph["tensors"]
        self._inputs = [(i["name"], self._views[i["tensor"]], tensors[i["tensor"]])
                        for i in graph["inputs"]]
        self._outputs = {o["name"]: (self._views[o["tensor"]], tensors[o["tensor"]])
                         for o in graph["outputs"]}
        self._output_names = [o["name"] for o in graph["outputs"]]
        from .session import narrow_dtypes

        self._narrow = narrow_dtypes(self.manifest)  # name -> (ml_dtypes dtype, ONNX name)

    def _node_arg(self, name: str, t: dict):
        from .session import NodeArg

        if name in self._narrow:
            dtype, elem_type = self._narrow[name]
            return NodeArg(name, t["shape"], dtype.name, elem_type)
        return NodeArg(name, t["shape"], t["dtype"])

    def get_inputs(self):
        return [self._node_arg(n, t) for n, _, t in self._inputs]

    def get_outputs(self):
        return [self._node_arg(n, self._outputs[n][1]) for n in self._output_names]

    def get_modelmeta(self) -> dict:
        return dict(self.manifest)

    def run(self, output_names, input_feed: dict) -> list[np.ndarray]:
        """As :meth:`runtime.Session.run`: inputs host -> device, kernels, outputs back."""
        names = self._output_names if output_names is None else list(output_names)
        for n in names:
            if n not in self._outputs:
                raise ValueError(f"unknown output {n!r}; the model's outputs are "
                                 f"{self._output_names}")
        if not isinstance(input_feed, dict):
            raise ValueError("input_feed must be a dict of input name to numpy array")
        expected = [n for n, _, _ in self._inputs]
        for k in input_feed:
            if k not in expected:
                raise ValueError(f"unknown input {k!r}; the model's inputs are {expected}")
        with self._lock:
            for name, view, t in self._inputs:
                if name not in input_feed:
                    raise ValueError(f"missing input {name!r}; the model's inputs are "
                                     f"{expected}")
                a = input_feed[name]
                want, elem_type = self._narrow.get(name, (np.dtype(t["dtype"]), None))
                if not isinstance(a, np.ndarray) or a.dtype != want \
                        or list(a.shape) != list(t["shape"]):
                    raise ValueError(f"input {name!r}: expected a numpy array of dtype "
                                     f"{elem_type or t['dtype']} and shape {list(t['shape'])}")
                if elem_type:  # the graph holds the bit codes (runtime.session.narrow_dtypes)
                    a = a.view(t["dtype"])
                view.copyfrom(np.ascontiguousarray(a))
            for fn, args in self._calls:
                fn(*args)
            self.device.sync()
            return [self._outputs[n][0].numpy() if n not in self._narrow else
                    self._outputs[n][0].numpy().view(self._narrow[n][0]) for n in names]
