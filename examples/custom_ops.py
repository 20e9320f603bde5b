"""Custom operators for onnxc: the seed's ``com.example:SoftmaxV2``, two ways.

Import this module before compiling a model that uses these ops::

    import examples.custom_ops          # registers com.example:SoftmaxV2 and com.example:Swish
    cm = compiler.compile("model_with_softmaxv2.onnx")
    cm.export("model.so")

The artifact holds the compiled kernels: loading it (``runtime.load``) needs neither this
module nor the compiler.

``SoftmaxV2`` is a softmax written with Relax ops in its log-sum-exp-stable form,
``exp(x - max(x)) / sum(exp(x - max(x)))``, so logits of 1e4 do not overflow.  ``Swish``
shows the other way: a TE compute, ``x * sigmoid(beta * x)``.
"""

from __future__ import annotations

from tvm import relax, te

from compiler.registry import register_op, register_te_op

DOMAIN = "com.example"


@register_op(DOMAIN, "SoftmaxV2", since=1)
def softmax_v2(bb, inputs, attrs, ctx):
    """softmax(x, axis) = exp(x - max(x)) / sum(exp(x - max(x))), stable for large logits."""
    x = inputs[0]
    axis = int(attrs.get("axis", -1))
    shifted = bb.emit(relax.op.subtract(x, relax.op.max(x, axis=axis, keepdims=True)))
    e = bb.emit(relax.op.exp(shifted))
    return relax.op.divide(e, relax.op.sum(e, axis=axis, keepdims=True))


def _swish(x, beta: float = 1.0):
    """x * sigmoid(beta * x)"""
    return te.compute(x.shape, lambda *i: x(*i) * te.sigmoid(x(*i) * beta), name="swish")


register_te_op(DOMAIN, "Swish", _swish, since=1, attrs=("beta",))
