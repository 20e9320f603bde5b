"""onnxc runtime: load a compiled model (``.so``) and run it.

Needs only this package, numpy and TVM's runtime; nothing from ``compiler/``.

    >>> import runtime
    >>> sess = runtime.load("model.so")
    >>> outs = sess.run(None, {"input": x})

Loading a ``.so`` runs its code (that is what a shared library is): load only artifacts
you or someone you trust compiled.  Before anything in the file runs, the loader reads
its embedded metadata straight from the file and refuses a file that is not an onnxc
artifact, is truncated or corrupted, has a newer format, was built for another
architecture or TVM, or needs CPU features this host lacks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

from . import parallel
from .artifact import FORMAT_VERSION, ArtifactError, read_artifact
from .cpu_features import host_arch, missing_features
from .dims import DimError
from .instruments import NonFiniteError, SessionOptions
from .memory_plan import MemoryPlan, MemoryPlanner
from .session import MemoryLimitError, NodeArg, Session

__all__ = ["load", "Session", "SessionOptions", "NodeArg", "ArtifactError", "NonFiniteError",
           "MemoryLimitError", "DimError",
           "MemoryPlan", "MemoryPlanner", "check_compatible", "make_session", "FORMAT_VERSION"]


def check_compatible(manifest: dict, where: str, elf_arch: str | None = None) -> None:
    """Refuse (ArtifactError) an artifact this host cannot run."""
    target = manifest.get("target", {})
    arch = target.get("arch") or elf_arch
    if arch == "cuda":  # GPU kernels; the ELF's host code must match this host
        from .device import check_cuda

        check_cuda(target, where)
        arch = elf_arch
    if arch and arch != host_arch():
        raise ArtifactError(f"{where}: built for {arch} (target {target.get('name')!r}), but "
                            f"this host is {host_arch()}; recompile with --target host")
    missing = missing_features(target.get("features", ()), host_arch())
    if missing:
        raise ArtifactError(f"{where}: compiled for CPU {target.get('cpu')!r} with features "
                            f"{', '.join(missing)} that this host lacks (running it would die of "
                            "SIGILL); recompile with --target host or a lower preset such as "
                            "x86-avx2")
    import tvm

    built = str(manifest.get("tvm_version", ""))
    if built.split(".")[:2] != tvm.__version__.split(".")[:2]:
        raise ArtifactError(f"{where}: built with TVM {built}, this runtime has TVM "
                            f"{tvm.__version__}; recompile the model with this installation")


def load(path: str, options: SessionOptions | None = None) -> Session:
    """Load an artifact written by ``onnxc compile`` / ``CompiledModel.export``.

    ``options`` (:class:`SessionOptions`) turns on profiling or NaN/Inf checks.

    Raises
    ------
    ArtifactError
        The file is not a loadable onnxc artifact for this host; the message says why.
    MemoryLimitError
        The model's planned memory (arena + params) exceeds what this host has available.
    """
    path = str(path)
    meta, params, elf_arch = read_artifact(path)
    for key in ("manifest", "graph", "memory_plan"):
        if key not in meta:
            raise ArtifactError(f"{path}: embedded metadata has no {key!r}; the file is corrupted")
    check_compatible(meta["manifest"], path, elf_arch)

    import tvm

    lib_path, alias_dir = _library_path(path)
    try:
        kernels = tvm.runtime.load_module(lib_path)
        if meta["manifest"].get("target", {}).get("arch") != "cuda":
            parallel.install(lib_path)  # dynamic chunks, not TVM's fixed split (runtime/parallel.py)
    except Exception as e:  # dlopen failure: say what, not where in TVM
        raise ArtifactError(f"{path}: the kernel library cannot be loaded: "
                            f"{str(e).strip().splitlines()[-1]}") from None
    finally:
        if alias_dir:  # the loaded library stays mapped; its name is no longer needed
            shutil.rmtree(alias_dir, ignore_errors=True)
    return make_session(meta, params, kernels, options)


# dlopen returns the library already loaded under the same name, even when the file there
# has been replaced since (a model recompiled to the same path in one process): the new
# graph then calls kernels of the old library.  A replaced file is loaded under a fresh name.
_LOADED: dict = {}  # real path -> identity of the file loaded from it
_LOADED_LOCK = threading.Lock()


def _library_path(path: str) -> tuple[str, str | None]:
    """(name to dlopen ``path`` by, temporary directory to remove after loading or None)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _LOADED_LOCK:
        previous = _LOADED.setdefault(real, key)
        if previous == key:
            return path, None
    alias_dir = tempfile.mkdtemp(prefix="onnxc-reload-")
    alias = os.path.join(alias_dir, os.path.basename(real))
    try:
        os.link(real, alias)
    except OSError:  # another filesystem, or links not allowed: a copy
        shutil.copyfile(real, alias)
    return alias, alias_dir


def make_session(meta: dict, params, kernels, options: SessionOptions | None = None):
    """A :class:`Session` (CPU), or a ``runtime.device.DeviceSession`` for CUDA artifacts."""
    if meta["manifest"].get("target", {}).get("arch") == "cuda":
        from .device import DeviceSession

        return DeviceSession(meta, params, kernels, options)
    if meta["manifest"].get("batch_loop"):  # a one-sample graph run once per sample
        from .batch_loop import BatchLoopSession

        return BatchLoopSession(Session(meta, params, kernels, options), meta["manifest"])
    return Session(meta, params, kernels, options)
