"""onnxc compiler: ONNX model -> one deployable ``.so`` (see DESIGN.md).

    >>> import compiler
    >>> cm = compiler.compile("model.onnx", target="host")
    >>> cm.export("model.so"); sess = cm.session()
"""

__version__ = "0.1.0"

from . import converters  # noqa: E402,F401  (registers onnxc's converters)
from . import converters_nn  # noqa: E402,F401  (Attention, losses, ...)
from . import converters_seq  # noqa: E402,F401  (RotaryEmbedding, LinearAttention, RNN, ...)
from . import converters_quant  # noqa: E402,F401  (QLinearMatMul, QLinearConv, BitCast, ...)
from .driver import CompiledModel  # noqa: E402
from .specialize import DynamicModel, compile  # noqa: E402
from .errors import (CompileCrashError, CompileError, CompileTimeoutError,  # noqa: E402
                     ModelError, UnsupportedError)

__all__ = ["compile", "CompiledModel", "DynamicModel", "CompileError", "ModelError", "UnsupportedError",
           "CompileCrashError", "CompileTimeoutError", "__version__"]
