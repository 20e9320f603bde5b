"""onnxc compiler: ONNX model -> one deployable ``.so`` (see DESIGN.md).

    >>> import compiler
    >>> cm = compiler.compile("model.onnx", target="host")
    >>> cm.export("model.so"); sess = cm.session()
"""

__version__ = "0.1.0"

from .frontend import converters as _converters  # noqa: E402

_converters.register_all()  # onnxc's converters into the operator registry

from .driver import CompiledModel  # noqa: E402
from .api import compile  # noqa: E402
from .specialize import DynamicModel  # noqa: E402
from .errors import (CompileCrashError, CompileError, CompileTimeoutError,  # noqa: E402
                     ModelError, UnsupportedError)

__all__ = ["compile", "CompiledModel", "DynamicModel", "CompileError", "ModelError", "UnsupportedError",
           "CompileCrashError", "CompileTimeoutError", "__version__"]
