"""A symbolic shape as a tensor is a kernel of its own, kept out of fusion.

``relax.shape_to_tensor`` of a shape holding dims (``Shape(mask)`` fed to a tensor op:
the index arithmetic of transformers' mask functions, ``mask[batch_idx, kv_idx]``, as
torch's dynamo exporter writes it) legalizes to a kernel that takes the dims as scalar
arguments.  Fused with kernels whose buffer shapes define the same dims, TVM 0.27's
FuseTIR defines each such dim twice and ``RenewDefs`` aborts ("VarRemapGet(source) ==
nullptr"): MiniLM / BERT / LLaMA / T5 exported with a separate batch symbol for the mask
failed to lower.  TVM's kernel is kept and marked opaque (``op_pattern`` 8), so FuseOps
leaves it alone, as ``shape_arith.materialize`` does for the importer's own shape
kernels; it writes a few ints.  Returned for our pipeline's ``LegalizeOps``
(``compiler.lowering.install``).
"""

from __future__ import annotations

from tvm import relax

from ..frontend.shape_arith import mark_opaque


def legalize_shape_to_tensor(bb, call):
    from tvm.relax.transform.legalize_ops.create import _shape_to_tensor

    out = _shape_to_tensor(bb, call)  # the call itself when the shape has no values
    if out is not call and isinstance(out.args[0], relax.GlobalVar):  # call_tir(kernel, ...)
        mark_opaque(bb, out)
    return out


LEGALIZE_MAP = {"relax.shape_to_tensor": legalize_shape_to_tensor}
