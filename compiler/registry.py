"""``compiler.registry``: the operator registry's public names (``register_op``,
``register_te_op``, ...).  The registry lives in ``compiler/frontend/registry.py``."""

from .frontend.registry import (ALL_TARGETS, DEFAULT_DOMAIN, REGISTRY,  # noqa: F401
                                ConvertContext, OpEntry, OperatorRegistry, register_op,
                                register_te_op, tvm_converter)
