"""Errors the compiler raises for people: each names what is wrong, where, and what to do."""


class CompileError(Exception):
    """Base of every user-facing compiler error (the CLI exits 1 with its message)."""


class ModelError(CompileError):
    """The ONNX model is unreadable or invalid."""


class UnsupportedError(CompileError):
    """The model uses operators, types or shapes this compiler does not support (yet)."""


class DimRangeError(UnsupportedError):
    """A symbolic dim's range (declared with ``--dim`` / ``dims=``, else the default) holds
    values the model cannot run at; the message names the range that it can.  Never
    deferred to a compile per shape: a concrete shape would not make the range valid."""


class CompileCrashError(CompileError):
    """The compile process died of a signal (a crash in TVM, LLVM or a converter).

    Attributes: ``signal`` (name, e.g. ``"SIGSEGV"``), ``stage`` (the compile stage that was
    running, or None), ``crash_traceback`` (the crashed process's Python frames, or "").
    """

    def __init__(self, message, signal_name=None, stage=None, crash_traceback=""):
        super().__init__(message)
        self.signal, self.stage, self.crash_traceback = signal_name, stage, crash_traceback


class CompileTimeoutError(CompileError):
    """The compile process ran past its timeout and was killed (``stage`` says where)."""

    def __init__(self, message, stage=None):
        super().__init__(message)
        self.stage = stage
