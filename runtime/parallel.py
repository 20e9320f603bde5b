"""Which launcher runs the kernels' parallel loops: onnxc's dynamic one, or TVM's pool.

Every CPU artifact links ``runtime/native/parallel_launch.c`` (see its header for the
algorithm): a persistent pool whose threads and the caller claim small chunks of each
parallel loop from one atomic counter, so that a thread the OS deschedules holds back one
chunk, not a fixed 1/T of every kernel as in TVM's pool.  :func:`install` points a loaded
library's ``__TVMBackendParallelLaunch`` (the function pointer TVM's generated code calls,
filled in by TVM's loader) at that launcher.  One pool serves the process: the first
artifact that carries the launcher provides it, and later artifacts are pointed at the same
one (its library stays loaded).

Left on TVM's pool, with the reason recorded in :data:`status`:
* artifacts built before the launcher existed (no ``onnxc_parallel_launch`` symbol);
* libraries whose kernels synchronise inside a parallel loop (``__TVMBackendParallelBarrier``
  present): a barrier needs all ``num_task`` tasks running at once, and dynamic chunks
  run more tasks than threads;
* ``ONNXC_PARALLEL=tvm`` in the environment (the kill switch).

``ONNXC_PARALLEL_CHUNKS`` (default 4) sets the chunks per thread for each parallel loop.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

ENV_SWITCH = "ONNXC_PARALLEL"  # "tvm" keeps TVM's pool
ENV_CHUNKS = "ONNXC_PARALLEL_CHUNKS"
DEFAULT_CHUNKS = 4

_pool = None  # (library handle, launcher address, configure function) once installed
_threads = 0  # the last thread count configured
status: dict = {}  # {artifact path: "onnxc" | "tvm (<why>)"}


def _chunks() -> int:
    try:
        value = int(os.environ.get(ENV_CHUNKS, DEFAULT_CHUNKS))
    except ValueError:
        value = DEFAULT_CHUNKS
    return min(max(value, 1), 64)


def install(path: str) -> str:
    """Route the parallel loops of the loaded library ``path`` through onnxc's launcher.

    ``path`` must already be loaded (``tvm.runtime.load_module``).  Returns and records in
    :data:`status` which launcher its kernels use.
    """
    global _pool
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "tvm":
        return _record(path, f"tvm ({ENV_SWITCH}=tvm)")
    try:
        # by its absolute name: dlopen searches the library path, not the working
        # directory, for a name without a slash, so RTLD_NOLOAD missed a library loaded as
        # "model.so" and its kernels silently stayed on TVM's fixed split
        lib = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        slot = ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelLaunch")
    except (OSError, ValueError):
        return _record(path, "tvm (no parallel kernels)")
    if "__TVMBackendParallelBarrier" in _relocated_symbols(path):
        return _record(path, "tvm (a kernel synchronises inside a parallel loop)")
    if _pool is None:
        try:
            launch = ctypes.cast(lib.onnxc_parallel_launch, ctypes.c_void_p).value
            configure = lib.onnxc_pool_configure
        except AttributeError:
            return _record(path, "tvm (artifact built without onnxc's launcher)")
        configure.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        configure.restype = ctypes.c_int
        configure(max(_threads, 1), _chunks(), slot.value)  # TVM's launcher is the fallback
        _pool = (lib, launch, configure)
    slot.value = _pool[1]
    return _record(path, "onnxc")


def _relocated_symbols(path: str) -> set:
    """Names the library's dynamic relocations refer to (ELF64 little-endian; empty for
    anything else).  A kernel that calls TVMBackendParallelBarrier loads the pointer
    ``__TVMBackendParallelBarrier`` through the GOT, so a relocation names it; the symbol's
    mere definition proves nothing (LLVM keeps the unused declaration at -O0, as in the
    NaN-check variants)."""
    try:
        with open(path, "rb") as f:  # mapped, not read: the params make artifacts large
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # ValueError: an empty file
        return set()
    with data:
        return _rela_names(data) if data[:6] == b"\x7fELF\x02\x01" else set()


def _rela_names(data) -> set:
    """The symbol names of every SHT_RELA section's entries in ELF64 ``data``."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize)
                for k in range(shnum)]
    names: set = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 4 or not entsize:  # SHT_RELA
            continue
        symtab = sections[link]
        strtab = sections[symtab[6]]
        for k in range(size // entsize):
            info, = struct.unpack_from("<Q", data, offset + k * entsize + 8)
            sym = info >> 32
            if not sym:
                continue
            st_name, = struct.unpack_from("<I", data, symtab[4] + sym * symtab[9])
            start = strtab[4] + st_name
            names.add(data[start:data.find(b"\0", start)].decode("ascii", "replace"))
    return names


def configure(threads: int) -> int:
    """Use ``threads`` threads (caller included) in onnxc's pool; returns the number in use."""
    global _threads
    _threads = max(int(threads), 1)
    if _pool is None:
        return _threads
    return int(_pool[2](_threads, _chunks(), None))


def _record(path: str, what: str) -> str:
    status[path] = what
    return what
