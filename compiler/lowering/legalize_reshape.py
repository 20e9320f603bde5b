"""Reshapes over symbolic shapes stay views.

TVM legalizes ``relax.reshape`` as a copy kernel, and ``RewriteDataflowReshape`` turns
the copy back into a view when it recognises a reshape in its TIR
(``has_reshape_pattern``).  Over a symbolic shape the copy's indices divide and take
modulos by symbolic extents and are not recognised, so every reshape of a model exported
with a dynamic image stayed a copy with several divisions per element (ShuffleNetV2's
channel shuffles over a symbolic image: 25 of 42 ms a run at 224 x 224), and its reads
mixing the batch with the other axes kept the model off the batch loop.  A reshape of a
row-major tensor is always the same bytes, so a reshape whose input or output shape is
symbolic is left a ``relax.reshape``, which the graph (``graph._binding``) makes a view of
its input's storage.  Static reshapes keep TVM's path (their copies fuse into
neighbouring kernels where that pays, and ``RewriteDataflowReshape`` makes the rest views).
Returned for our pipeline's ``LegalizeOps`` (``compiler.lowering.install``).
"""

from __future__ import annotations

from tvm import tirx


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, tirx.IntImm) for d in shape)


def legalize_reshape(bb, call):
    from tvm.relax.transform.legalize_ops.manipulate import _reshape
    from tvm import topi

    if not (_static(call.args[0].ty.shape) and _static(call.ty.shape)):
        return call  # a view (graph._binding)
    return _reshape(topi.reshape, "reshape")(bb, call)


LEGALIZE_MAP = {"relax.reshape": legalize_reshape}
