"""``compiler.compile()``: the one public entry, in this process or in a child process.

In-process, :func:`compiler.specialize.compile_in_process` compiles statically
(``driver.compile_static``) or, when the model needs the shapes or values it will be fed,
returns a :class:`~compiler.specialize.DynamicModel`.  ``isolate=True`` runs that same
function in a child process (``compiler.isolate.run_in_child``), which writes the artifact
there; ``onnxc compile`` uses :func:`compile_to_file`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from .driver import CompiledModel, model_label
from .errors import CompileError
from .isolate import STAGE_LOGGER, run_in_child
from .specialize import DynamicModel, compile_in_process


def compile(model, target="host", *, input_shapes=None, input_values=None,
            max_variants: int = 8, isolate: bool = False, timeout=None, **kwargs):
    """Compile ``model`` (path or ``onnx.ModelProto``) for ``target``.

    Returns a :class:`compiler.CompiledModel`, or a :class:`compiler.DynamicModel` when the
    model needs the shapes or values it will be fed (symbolic dimensions, shape-determining
    inputs) and ``input_shapes`` / ``input_values`` do not fix them.  The other keywords
    are ``driver.compile_static``'s (opt_level, disabled_passes, layout, tuning_db, ...).

    ``isolate=True`` compiles in a child process (``compiler.isolate``): a crash inside
    TVM becomes a ``CompileCrashError`` naming the signal and stage, and ``timeout``
    (seconds) bounds the compilation (``CompileTimeoutError``).  Errors keep their type.
    """
    kwargs.update(input_shapes=input_shapes, input_values=input_values,
                  max_variants=max_variants)
    if isolate:
        return _compile_isolated(model, target, timeout, kwargs)
    if timeout is not None:
        raise ValueError("timeout= needs isolate=True (an in-process compile cannot be "
                         "stopped safely)")
    return compile_in_process(model, target, **kwargs)


def compile_to_file(model, output: str, target="host", *, timeout=None, **kwargs) -> dict:
    """Compile ``model`` in a child process and write the artifact to ``output``.

    Returns the compile report.  Raises what the compilation raised (same type and
    message), :class:`CompileCrashError` or :class:`CompileTimeoutError`.  Keywords are
    those of :func:`compile`.
    """
    kind, value = run_in_child(_compile_and_export, (model, target, kwargs, os.fspath(output)),
                               where=model_label(model), timeout=timeout,
                               partial_output=os.fspath(output))
    return value


def _compile_isolated(model, target, timeout, kwargs: dict):
    """A CompiledModel backed by the artifact the child wrote (in a private temporary
    directory), or the child's DynamicModel (it compiles its variants in-process later,
    when it runs)."""
    tmp = tempfile.TemporaryDirectory(prefix="onnxc-isolated-")
    path = os.path.join(tmp.name, "model.so")
    try:
        kind, value = run_in_child(_compile_and_export, (model, target, kwargs, path, True),
                                   where=model_label(model), timeout=timeout,
                                   partial_output=path)
    except BaseException:
        tmp.cleanup()
        raise
    if kind == "dynamic":
        tmp.cleanup()
        assert isinstance(value, DynamicModel)
        return value
    return ArtifactModel(path, value, tmp)


def _compile_and_export(model, target, kwargs, output, allow_dynamic=False):
    """Runs in the child: compile, write the artifact, return ("compiled", report)."""
    cm = compile_in_process(model, target, **kwargs)
    if allow_dynamic and isinstance(cm, DynamicModel):
        return "dynamic", cm
    logging.getLogger(STAGE_LOGGER).debug("stage export")
    cm.export(output)
    return "compiled", cm.report


class ArtifactModel(CompiledModel):
    """A CompiledModel whose kernels live in the artifact a compile process wrote.

    ``export`` copies that file; ``session`` loads it (``runtime.load``).  The file sits in
    a private temporary directory that goes away with this object.
    """

    def __init__(self, path: str, report: dict, tmpdir):
        from runtime.artifact import read_artifact

        meta, payload, _ = read_artifact(path)  # a view of the file's mapping, not a copy
        super().__init__(None, meta, payload, report)
        self.path, self._tmpdir = path, tmpdir

    def export(self, path: str) -> str:
        dest = os.path.abspath(os.fspath(path))
        if not os.path.isdir(os.path.dirname(dest)):
            raise CompileError(f"cannot write {dest}: directory {os.path.dirname(dest)} "
                               "does not exist")
        partial = os.path.join(os.path.dirname(dest),
                               f".{os.path.basename(dest)}.{os.getpid()}.tmp.so")
        try:
            shutil.copyfile(self.path, partial)
            os.replace(partial, dest)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return os.fspath(path)

    def session(self, options=None):
        import runtime

        return runtime.load(self.path, options)
