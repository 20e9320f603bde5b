"""Errors the compiler raises for people: each names what is wrong, where, and what to do."""


class CompileError(Exception):
    """Base of every user-facing compiler error (the CLI exits 1 with its message)."""


class ModelError(CompileError):
    """The ONNX model is unreadable or invalid."""


class UnsupportedError(CompileError):
    """The model uses operators, types or shapes this compiler does not support (yet)."""
