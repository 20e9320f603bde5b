"""``compiler.registry``: the operator registry's public names (``register_op``,
``register_te_op``, ``previous``, ...).  The registry lives in ``compiler/frontend/registry.py``."""

from .frontend.registry import (ALL_TARGETS, DEFAULT_DOMAIN, REGISTRY,  # noqa: F401
                                ConvertContext, OpEntry, OperatorRegistry, RegistrationError,
                                previous, register_op, register_te_op, tvm_converter)
