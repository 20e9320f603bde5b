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

import os
import shutil
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
    with tempfile.TemporaryDirectory(prefix="onnxc-") as tmp:
        with open(os.path.join(tmp, "blob.bin"), "wb") as f:
            f.write(blob_head(meta, payload))
            f.write(payload)
        with open(os.path.join(tmp, "blob.S"), "w") as f:
            f.write(_ASM)
        obj = os.path.join(tmp, "blob.o")
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
