"""onnxc's converters, one module per ONNX operator category (``onnx/defs/<category>``).

Each module registers, in the operator registry (``compiler.frontend.registry``),
converters for the ops where TVM 0.27's are wrong, silent or missing; ``common`` holds
what they share.  :func:`register_all` imports them all (``import compiler`` calls it).
"""

import importlib

# One module per category (microsoft: onnxruntime's com.microsoft contrib ops; experimental:
# ONNX 1.0-1.4's experimental ops, dropped from the spec, that onnxruntime still runs); control flow (If, Loop, Scan) is compiler/frontend/control_flow.py.
CATEGORIES = ("tensor", "math", "nn", "reduction", "rnn", "quantization", "narrow",
              "shape_values", "signal", "ml", "resize", "contrib", "microsoft", "experimental")


def register_all() -> None:
    """Register every onnxc converter (importing a module registers its converters once)."""
    importlib.import_module("..control_flow", __name__)
    for name in CATEGORIES:
        importlib.import_module(f".{name}", __name__)
