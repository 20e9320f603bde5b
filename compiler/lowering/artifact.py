"""Write the one-file artifact: kernels + embedded blob (manifest, graph, plan, params).

The blob is assembled into an object file between two global symbols and linked into
the kernels' shared library by TVM's ``export_library(addons=...)``; ``runtime/artifact.py``
reads it back from the ELF file without loading it.  The blob (and so the params payload
inside it, see ``runtime/artifact.py``) starts on a page boundary, so that the loader maps
the params from the file and the kernels read them in place.  The library also carries
onnxc's parallel launcher (``runtime/native/parallel_launch.c``, compiled here with the same
C compiler), which ``runtime/parallel.py`` installs at load.  When the build was split
over processes (``compiler/lowering/parallel_build.py``) the kernels arrive as objects
already emitted, so ``export_library`` only links; built in one piece, it first has LLVM
emit their machine code.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import struct
import subprocess
import tempfile

from runtime.artifact import BEGIN_SYMBOL, END_SYMBOL, PAYLOAD_ALIGN, blob_head

from ..errors import CompileError

# the dynamic parallel launcher every artifact carries (runtime/parallel.py, its header says why)
PARALLEL_LAUNCH_C = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "runtime", "native", "parallel_launch.c")

_ASM = f"""\
    .section .onnxc_blob,"a",@progbits
    .balign {PAYLOAD_ALIGN}
    .globl {BEGIN_SYMBOL}
{BEGIN_SYMBOL}:
    .incbin "blob.bin"
    .globl {END_SYMBOL}
{END_SYMBOL}:
    .section .note.GNU-stack,"",@progbits
"""


def write_artifact(path: str, kernels, meta: dict, payload: bytes, cc: str = "cc",
                   toolchain: dict | None = None) -> None:
    """Link ``kernels`` (a built TVM module) and the blob into ``path``, atomically.

    ``toolchain`` (``targets.TargetInfo.toolchain``: ``cc``, ``cxx``, ``install``) names the
    cross compilers for another architecture (aarch64): ``cc`` assembles the blob, ``cxx``
    links the library; None uses this machine's ``cc`` and TVM's default linker.
    """
    link_kw = {}
    if toolchain is not None:  # cross-compiling: the cross gcc assembles, the cross g++ links
        cc = toolchain["cc"]
        link_kw = {"cc": toolchain["cxx"]}
        for tool in (toolchain["cc"], toolchain["cxx"]):
            if shutil.which(tool) is None:
                raise CompileError(f"cannot write {path}: the cross compiler {tool!r} is not "
                                   f"installed ({toolchain.get('install', 'install it')})")
    path = os.path.abspath(path)
    out_dir = os.path.dirname(path)
    if not os.path.isdir(out_dir):
        raise CompileError(f"cannot write {path}: directory {out_dir} does not exist")
    if shutil.which(cc) is None:
        raise CompileError(f"cannot write {path}: the C compiler {cc!r} is not installed "
                           "(apt-get install gcc)")
    machine = _ELF_MACHINE.get(platform.machine()) if toolchain is None else None
    if machine is not None and _links_with_gold():
        link_kw["options"] = ["-fuse-ld=gold"]
    with tempfile.TemporaryDirectory(prefix="onnxc-") as tmp:
        obj = os.path.join(tmp, "blob.o")
        if machine is not None:  # this machine's objects: written here, no assembler
            write_blob_object(obj, blob_head(meta, payload), payload, machine)
        else:  # a cross toolchain: its assembler knows the target's object format
            with open(os.path.join(tmp, "blob.bin"), "wb") as f:
                f.write(blob_head(meta, payload))
                f.write(payload)
            with open(os.path.join(tmp, "blob.S"), "w") as f:
                f.write(_ASM)
            r = subprocess.run([cc, "-c", "blob.S", "-o", obj], cwd=tmp, capture_output=True,
                               text=True)
            if r.returncode != 0:
                raise CompileError(f"assembling the model blob failed: {r.stderr.strip()}")
        launcher = os.path.join(tmp, "parallel_launch.o")  # runtime/parallel.py installs it
        r = subprocess.run([cc, "-O2", "-fPIC", "-c", PARALLEL_LAUNCH_C, "-o", launcher],
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"compiling onnxc's parallel launcher failed: {r.stderr.strip()}")
        partial = os.path.join(out_dir, f".{os.path.basename(path)}.{os.getpid()}.tmp.so")
        try:
            kernels.export_library(partial, addons=[obj, launcher], **link_kw)
            os.replace(partial, path)
        except Exception as e:
            raise CompileError(f"writing {path} failed: {str(e).strip().splitlines()[-1]}") \
                from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)


# ELF e_machine of the hosts whose blob object write_blob_object writes (64-bit, little endian)
_ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
_SHF_ALLOC, _PROGBITS, _SYMTAB, _STRTAB, _STB_GLOBAL = 2, 1, 2, 3, 1


def write_blob_object(path: str, head: bytes, payload, machine: int) -> None:
    """Write the relocatable ELF object ``cc -c blob.S`` (``_ASM``) assembles: the section
    ``.onnxc_blob`` (allocated, read-only, 4096-aligned) holding ``head + payload`` between
    the global symbols ``BEGIN_SYMBOL`` and ``END_SYMBOL``, and an empty
    ``.note.GNU-stack`` (no executable stack).

    The assembler reads the blob from a file and writes it again (GPT-2's 500 MB: 1.5 CPU s,
    4 s on a loaded host); here the payload is written once, straight from memory.
    ``machine``: the ELF e_machine (``_ELF_MACHINE``), 64-bit little-endian only.
    """
    if machine not in _ELF_MACHINE.values():
        raise ValueError(f"no blob object writer for ELF machine {machine}")
    size = len(head) + memoryview(payload).nbytes
    shstr = b"\0.onnxc_blob\0.note.GNU-stack\0.symtab\0.strtab\0.shstrtab\0"
    names = {n: shstr.index(b"\0" + n.encode() + b"\0") + 1
             for n in (".onnxc_blob", ".note.GNU-stack", ".symtab", ".strtab", ".shstrtab")}
    strtab = b"\0" + BEGIN_SYMBOL.encode() + b"\0" + END_SYMBOL.encode() + b"\0"
    sym = struct.Struct("<IBBHQQ")  # Elf64_Sym
    symtab = (sym.pack(0, 0, 0, 0, 0, 0)
              + sym.pack(1, _STB_GLOBAL << 4, 0, 1, 0, 0)
              + sym.pack(2 + len(BEGIN_SYMBOL), _STB_GLOBAL << 4, 0, 1, size, 0))
    blob_at = PAYLOAD_ALIGN  # the section's data starts on its alignment
    symtab_at = blob_at + size + (-(blob_at + size)) % 8
    strtab_at = symtab_at + len(symtab)
    shstr_at = strtab_at + len(strtab)
    shdr_at = shstr_at + len(shstr) + (-(shstr_at + len(shstr))) % 8
    sh = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
    headers = b"".join([
        sh.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        sh.pack(names[".onnxc_blob"], _PROGBITS, _SHF_ALLOC, 0, blob_at, size, 0, 0,
                PAYLOAD_ALIGN, 0),
        sh.pack(names[".note.GNU-stack"], _PROGBITS, 0, 0, blob_at + size, 0, 0, 0, 1, 0),
        sh.pack(names[".symtab"], _SYMTAB, 0, 0, symtab_at, len(symtab), 4, 1, 8, sym.size),
        sh.pack(names[".strtab"], _STRTAB, 0, 0, strtab_at, len(strtab), 0, 0, 1, 0),
        sh.pack(names[".shstrtab"], _STRTAB, 0, 0, shstr_at, len(shstr), 0, 0, 1, 0),
    ])
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little endian, SysV
    elf = ident + struct.pack("<HHIQQQIHHHHHH", 1, machine, 1, 0, 0, shdr_at, 0, 64, 0, 0,
                              sh.size, 6, 5)
    with open(path, "wb") as f:
        f.write(elf + bytes(blob_at - len(elf)))
        f.write(head)
        f.write(payload)
        f.write(bytes(symtab_at - blob_at - size))
        f.write(symtab + strtab + shstr + bytes(shdr_at - shstr_at - len(shstr)))
        f.write(headers)


@functools.lru_cache(maxsize=None)
def _links_with_gold() -> bool:
    """Whether TVM's link command (``tvm.support.cc.get_cc()``) links a shared library
    here with ``-fuse-ld=gold``.  GNU gold copies the blob's section into the library in
    half the time of the default linker (GPT-2's 500 MB: 1.5 against 3.2 CPU s); where it
    is missing the default linker links."""
    from tvm.support.cc import get_cc

    cc = get_cc()
    if cc is None or shutil.which("ld.gold") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="onnxc-gold-") as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write("int onnxc_probe(void) { return 1; }\n")
        r = subprocess.run([cc, "-shared", "-fPIC", "-fuse-ld=gold", src, "-o",
                            os.path.join(tmp, "probe.so")], capture_output=True)
        return r.returncode == 0
