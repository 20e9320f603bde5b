"""Lets that TVM's vectorizer cannot take, inlined after scheduling.

Legalizations bind a value once with a TIR ``Let`` where it is used more than once (relu's
and clip's Select: ``legalize_nan.bind_once``; the stable sigmoid's exp), so that the
inlined producer is not copied into every use.  Where such a Let feeds a QDQ
requantisation (``round`` -> ``clip`` -> a cast to an 8-bit integer: EfficientNet-B0's
and MobileNetV3's quantized swish / hard-swish epilogues), TVM 0.27's vectorizer fails
on it ("Let cannot bind the same var to two different values") and the model did not
build.  Those kernels get their Lets substituted out (the value copied into each use:
a longer expression, the same arithmetic); every other kernel keeps them.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx

from .cpu.common import nodes

_NARROW = ("int8", "uint8")


def needs_inlining(func) -> bool:
    """A Let under a cast to an 8-bit integer somewhere in ``func``."""
    return any(str(c.ty) in _NARROW and nodes(c.value, tirx.Let)
               for c in nodes(func, tirx.Cast))


def inline_lets(func):
    """``func`` with every ``Let(v, value, body)`` replaced by ``body[v := value]``."""
    def on_let(let, mutator):
        value, body = mutator.mutate(let.value), mutator.mutate(let.body)
        var = let.var
        return tvm_ffi.structural_mutate(
            body, [(tirx.Var, lambda v, _: value if v.same_as(var) else v)])

    return tvm_ffi.structural_mutate(func, [(tirx.Let, on_let)])


def vectorizable(func):
    """``func``, its Lets inlined when :func:`needs_inlining` says TVM cannot vectorize
    them."""
    return inline_lets(func) if needs_inlining(func) else func
