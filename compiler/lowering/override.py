"""Replace TVM's legalization of a Relax op, once, in a way that can find what it replaced.

Our ``legalize_*`` modules register their TE computes on the op's ``FLegalize`` attribute at
a higher level than TVM's (CONVENTIONS 13: explicit overrides through one registry call);
``make(default)`` receives TVM's own legalization, which the new one falls back to for the
dtypes or attributes it does not take.  The returned function is marked so that a reloaded
module does not wrap its own legalization a second time.
"""

from __future__ import annotations

import tvm

ATTR = "FLegalize"


def install_legalization(op_name: str, make, mark: str) -> None:
    """Register ``make(tvm_default)`` as ``op_name``'s legalization (level 11), unless a
    legalization marked ``mark`` is already registered."""
    op = tvm.ir.Op.get(op_name)
    default = op.get_attr(ATTR)
    if getattr(default, mark, False):
        return  # already installed (module reloaded)
    legalize = make(default)
    setattr(legalize, mark, True)
    tvm.ir.register_op_attr(op_name, ATTR, legalize, level=11)
