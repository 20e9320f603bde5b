"""The onnxc artifact: one ``.so`` holding the kernels and an embedded model blob.

The blob sits between two global symbols (``onnxc_blob_begin``/``onnxc_blob_end``) in a
read-only section of the shared library.  It is found by reading the ELF symbol table of
the file, *without* loading it: a file that is not ours, truncated, corrupted, too new or
built for CPU features this host lacks is refused before any of its code runs.

Blob layout (little endian)::

    magic "ONNXCART" | u32 format version | u32 flags | u64 meta length | u64 payload length
    | 32-byte SHA-256 of (meta + payload) | meta (UTF-8 JSON, padded) | payload (params)

``meta`` holds ``manifest``, ``graph`` and ``memory_plan``.  Nothing is ever unpickled.
The blob starts page-aligned and meta is padded so that the payload does too
(``PAYLOAD_ALIGN``; each param inside it is 64-byte aligned): the loader maps the params
straight from the file and the kernels read them there, without a copy
(:func:`read_artifact`).  Artifacts written with 64-byte padding load the same way.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import struct
import threading
import weakref

import numpy as np

MAGIC = b"ONNXCART"
FORMAT_VERSION = 1
BEGIN_SYMBOL = "onnxc_blob_begin"
END_SYMBOL = "onnxc_blob_end"
_HEADER = struct.Struct("<8sIIQQ32s")
PAYLOAD_ALIGN = 4096  # the payload starts on a page of its own (the blob is page-aligned)
PARAM_ALIGN = 64      # what the kernels assume of a param's address (TVM's kAllocAlignment)

_ELF_MACHINES = {62: "x86_64", 183: "aarch64"}


class ArtifactError(Exception):
    """The file cannot be loaded as an onnxc artifact; the message says why and what to do."""


def _pad(n: int) -> int:
    return (-n) % PAYLOAD_ALIGN


def encode_blob(meta: dict, payload: bytes) -> bytes:
    """Serialise ``meta`` (JSON-able) and ``payload`` (raw params) into one blob:
    ``blob_head(meta, payload) + payload``."""
    return blob_head(meta, payload) + bytes(payload)


def blob_head(meta: dict, payload) -> bytes:
    """The blob up to its payload (header and padded meta), the digest covering
    ``payload`` (any bytes-like object): written before the payload, no copy of it made.

    Raises ArtifactError naming the metadata entry that JSON cannot hold (bytes, a numpy
    scalar, a set...): a bug in what the compiler put there, never a bare TypeError.
    """
    try:
        meta_bytes = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    except (TypeError, ValueError, RecursionError) as e:
        try:
            path, value = _first_unencodable(meta, "meta")
        except RecursionError:  # a cycle
            path, value = "meta", meta
        raise ArtifactError(
            f"cannot write the artifact: metadata entry {path} holds "
            f"{type(value).__name__} {_short(value)}, which JSON cannot hold ({e}); "
            "this is an onnxc bug, please report it with the model") from None
    meta_bytes += b" " * _pad(_HEADER.size + len(meta_bytes))
    digest = hashlib.sha256(meta_bytes)
    digest.update(payload)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta_bytes), len(payload), digest.digest())
    return header + meta_bytes


def _first_unencodable(value, path: str):
    """(path, value) of the first entry of ``value`` that json.dumps refuses."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                return f"{path} (key {_short(k)})", k
            found = _first_unencodable(v, f"{path}.{k}")
            if found[0] is not None:
                return found
        return None, None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _first_unencodable(v, f"{path}[{i}]")
            if found[0] is not None:
                return found
        return None, None
    if value is None or isinstance(value, (str, int, float, bool)):
        return None, None
    return path, value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def decode_blob(blob, where: str = "blob") -> tuple[dict, memoryview]:
    """Check and split a blob into (meta, payload view).  Raises ArtifactError."""
    blob = memoryview(blob)
    if len(blob) < _HEADER.size or bytes(blob[:8]) != MAGIC:
        raise ArtifactError(f"{where}: the embedded blob does not start with the onnxc magic; "
                            "the file is corrupted or was not written by onnxc")
    _, version, _flags, meta_len, payload_len, digest = _HEADER.unpack(blob[:_HEADER.size])
    if version > FORMAT_VERSION:
        raise ArtifactError(f"{where}: artifact format version {version} is newer than this "
                            f"runtime reads (<= {FORMAT_VERSION}); upgrade onnxc or recompile "
                            "the model with this version")
    end = _HEADER.size + meta_len + payload_len
    if end != len(blob):
        raise ArtifactError(f"{where}: blob length {len(blob)} does not match its header "
                            f"({end}); the file is truncated or corrupted")
    h = hashlib.sha256(blob[_HEADER.size:end])
    if h.digest() != digest:
        raise ArtifactError(f"{where}: checksum mismatch in the embedded model (graph or params "
                            "changed after it was written); the file is corrupted, recompile it")
    try:
        meta = json.loads(bytes(blob[_HEADER.size:_HEADER.size + meta_len]))
    except ValueError as e:
        raise ArtifactError(f"{where}: embedded metadata is not valid JSON ({e})") from None
    return meta, blob[_HEADER.size + meta_len:end]


class _Elf:
    """Just enough of ELF64 little endian to find a symbol's bytes in the file."""

    def __init__(self, data, path: str):
        self.data, self.path = data, path
        if len(data) < 64 or bytes(data[:4]) != b"\x7fELF":
            raise ArtifactError(f"{path}: not a shared library (no ELF header); pass the .so "
                                "written by `onnxc compile`")
        if data[4] != 2 or data[5] != 1:
            raise ArtifactError(f"{path}: only 64-bit little-endian ELF files are onnxc artifacts")
        (self.machine,) = struct.unpack_from("<H", data, 18)
        shoff, = struct.unpack_from("<Q", data, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
        if shoff == 0 or shoff + shnum * shentsize > len(data) or shentsize < 64:
            raise ArtifactError(f"{path}: ELF section table lies outside the file "
                                f"({len(data)} bytes); the file is truncated or corrupted")
        self.sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                         for i in range(shnum)]
        for s in self.sections:
            if s[1] != 8 and s[4] + s[5] > len(data):  # SHT_NOBITS has no file bytes
                raise ArtifactError(f"{path}: an ELF section ends past the end of the file; "
                                    "the file is truncated")

    def symbol(self, name: str):
        """(file offset, section index) of a defined symbol, or None."""
        want = name.encode()
        for sh in self.sections:
            if sh[1] not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
                continue
            strtab = self.sections[sh[6]]
            entsize = sh[9] or 24
            for off in range(sh[4], sh[4] + sh[5], entsize):
                st_name, _info, _other, shndx, value, _size = struct.unpack_from(
                    "<IBBHQQ", self.data, off)
                if shndx == 0 or shndx >= len(self.sections):
                    continue
                start = strtab[4] + st_name
                end = start + len(want)
                if bytes(self.data[start:end]) == want and self.data[end] == 0:
                    sec = self.sections[shndx]
                    return sec[4] + (value - sec[3]), shndx
        return None


def library_kernel(kernels, name: str):
    """The artifact library's kernel ``name``; a RuntimeError saying the file is corrupted
    when it is missing (the CPU and the device sessions look their kernels up here)."""
    try:
        return kernels[name]
    except Exception:
        raise RuntimeError(f"kernel {name!r} is missing from the artifact's library; the file "
                           "is corrupted, recompile it") from None


def read_artifact(path: str) -> tuple[dict, np.ndarray, str]:
    """Find, check and decode the blob embedded in ``path``.

    Returns (meta, params payload, ELF architecture).  The payload is a uint8 array over a
    read-only shared mapping of the file, not a copy: the session's param tensors are views
    of it, so the weights stay page-cache pages shared with every process that maps the
    file (and with other sessions of this process: one mapping per file, see
    :func:`_map_file`).  The checksum reads every page once; those pages are file-backed
    and clean, not anonymous memory.  The array is flagged writeable only because DLPack,
    which hands it to the kernels, cannot export a read-only numpy array; the pages are
    mapped read-only, so a write faults instead of changing the weights (no kernel writes
    a param: the in-place planner never gives an output a param's storage).  Like the
    kernels' code, which ``dlopen`` maps the same way, the file must not be overwritten in
    place while a session uses it (replace it by renaming, as ``onnxc compile`` does).
    """
    try:
        data = _map_file(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ArtifactError(f"{path}: is a directory, not an artifact") from None
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read: {e.strerror}") from None
    elf = _Elf(memoryview(data), path)
    begin, end = elf.symbol(BEGIN_SYMBOL), elf.symbol(END_SYMBOL)
    if begin is None or end is None:
        raise ArtifactError(f"{path}: not an onnxc artifact (a shared library with no embedded "
                            "model); compile the model with `onnxc compile MODEL -o OUT.so`")
    if not 0 <= begin[0] <= end[0] <= len(data):
        raise ArtifactError(f"{path}: the embedded model lies outside the file; truncated")
    meta, payload = decode_blob(memoryview(data)[begin[0]:end[0]], where=path)
    start = end[0] - len(payload)
    params = data[start:end[0]]
    if len(payload) and params.ctypes.data % PARAM_ALIGN == 0:
        params = _writeable_alias(params)
    else:  # an empty payload, or a file whose params are not aligned: a copy that is
        params = _aligned_copy(params)
    return meta, params, _ELF_MACHINES.get(elf.machine, f"machine {elf.machine}")


# One read-only mapping per artifact file in this process: sessions of one file share it,
# so its pages count once.  Keyed by the file's identity, so a rewritten file maps anew.
_MAPPINGS: "weakref.WeakValueDictionary[tuple, np.ndarray]" = weakref.WeakValueDictionary()
_MAPPINGS_LOCK = threading.Lock()


def _map_file(path: str) -> np.ndarray:
    """The whole file as a read-only uint8 array over a shared mapping (b"" if empty)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with _MAPPINGS_LOCK:
            data = _MAPPINGS.get(key)
            if data is None:
                if st.st_size == 0:
                    return np.empty(0, dtype=np.uint8)
                data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ),
                                     dtype=np.uint8)
                _MAPPINGS[key] = data
    return data


def _writeable_alias(view: np.ndarray) -> np.ndarray:
    """``view``'s memory (a read-only mapping) as an array DLPack can export; it keeps the
    mapping alive."""
    buf = (ctypes.c_uint8 * view.size).from_address(view.ctypes.data)
    buf._mapping = view
    return np.frombuffer(buf, dtype=np.uint8)


def _aligned_copy(view: np.ndarray) -> np.ndarray:
    raw = np.empty(view.size + PARAM_ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % PARAM_ALIGN
    out = raw[start:start + view.size]
    out[:] = view
    return out
