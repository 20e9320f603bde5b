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
from . import control_flow  # noqa: E402,F401  (If, Loop, Scan: unrolled at import)
from . import converters_shape_values  # noqa: E402,F401  (Compress, OneHot, TopK, NonZero, ...)
from . import converters_misc  # noqa: E402,F401  (Celu, Swish, LpNormalization, Col2Im, ...)
from . import converters_signal  # noqa: E402,F401  (windows, MelWeightMatrix, DFT, STFT)
from . import converters_ml  # noqa: E402,F401  (ai.onnx.ml, TfIdfVectorizer, RoiAlign max)
from . import converters_resize  # noqa: E402,F401  (Resize 11+, Upsample: exact gathers)
from . import converters_narrow  # noqa: E402,F401  (Cast, Q/DQ on bfloat16, float8, int4, ...)
from . import converters_deform  # noqa: E402,F401  (DeformConv)
from . import converters_flexattention  # noqa: E402,F401  (FlexAttention, ai.onnx.preview)
from .driver import CompiledModel  # noqa: E402
from .specialize import DynamicModel, compile  # noqa: E402
from .errors import (CompileCrashError, CompileError, CompileTimeoutError,  # noqa: E402
                     ModelError, UnsupportedError)

__all__ = ["compile", "CompiledModel", "DynamicModel", "CompileError", "ModelError", "UnsupportedError",
           "CompileCrashError", "CompileTimeoutError", "__version__"]
