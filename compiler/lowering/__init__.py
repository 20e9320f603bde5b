"""Lowering: Relax graph -> TIR kernels -> the graph the runtime calls, and the artifact.

``legalize_*`` give TVM's LegalizeOps our TE computes where TVM's are missing, wrong or
slow; ``provenance`` names each kernel after the ONNX nodes it computes; ``graph``
extracts the kernel calls and plans storage (``inplace``: outputs reusing a dying input);
``artifact`` writes the ``.so``.
"""

from . import (legalize_conv_nchwc, legalize_hyperbolic, legalize_layout_transform,
               legalize_nan, legalize_pool, legalize_reductions, legalize_reshape,
               legalize_shape_to_tensor, legalize_topk, legalize_vector_math)

_installed = False


def install() -> dict:
    """Install every onnxc legalization; returns the customize map for ``LegalizeOps``.

    On TVM's ops (``FLegalize``, once per process; later calls do nothing): blocked
    conv2d (``legalize_conv_nchwc``, which TVM cannot lower), float max/min/argmax/argmin
    with ONNX's identity and onnxruntime's NaN fold (``legalize_reductions``), max pooling
    that skips NaN (``legalize_pool``), topk as a TE kernel (``legalize_topk``) and relu,
    prelu, clip, float maximum/minimum that keep NaN as onnxruntime does, tanh / atanh that
    keep the sign of zero (``legalize_nan``) and sinh/cosh with exp
    (``legalize_hyperbolic``: LLVM cannot build TVM's intrinsics).  They
    sit on the ops because constant folding legalizes with the registered functions too,
    and must agree with the lowering.

    Returned, not installed: float32 GELU and softmax with vectorisable erf / exp
    (``legalize_vector_math``), for our pipeline's ``LegalizeOps`` only; they replace
    TVM's numerics (a polynomial erf, a range-reduced exp), which other users of
    ``LegalizeOps`` in the process do not ask for; and layout transforms over their
    output's index space (``legalize_layout_transform``: the same values, another loop
    nest), and reshapes over symbolic shapes left views (``legalize_reshape``: TVM's
    copy kernel is not recognised as a reshape there), and symbolic shapes as tensors kept
    out of fusion (``legalize_shape_to_tensor``: TVM's FuseTIR aborts on them).
    """
    global _installed
    if not _installed:  # TVM refuses a second registration at the same level
        legalize_conv_nchwc.install()
        legalize_reductions.install()
        legalize_pool.install()
        legalize_topk.install()
        legalize_nan.install()
        legalize_hyperbolic.install()
        _installed = True
    return {**legalize_vector_math.LEGALIZE_MAP, **legalize_layout_transform.LEGALIZE_MAP,
            **legalize_reshape.LEGALIZE_MAP, **legalize_shape_to_tensor.LEGALIZE_MAP}
