"""concat(x1, ..., xn) => a concat kernel the fuser leaves alone, for the planner to place.

When the concat axis is the first non-unit axis (N=1 NCHW / NCHW[b]c channel concats, axis
0), the output is the inputs' bytes back to back: the memory planner can put each input's
buffer at its offset inside the output's (``compiler/lowering/graph.py`` ``place_concats``)
so that the producers write in place and no kernel runs.  This pass marks those concats:
each becomes a ``call_tir`` of topi's concatenate with the PrimFunc attrs
``op_pattern`` = opaque (FuseOps then fuses neither producers nor consumers into it: a
DenseNet concat stays out of the following BatchNorm + Relu) and ``onnxc.concat_axis``.
Extraction drops the marked calls it can place and keeps the others as (unfused) kernels.

Refused here (the concat is left to TVM as before, fused with its neighbours): symbolic or
empty shapes, a non-leading axis, an input that would start at a byte offset that is no
multiple of 64 (kernels assume aligned buffers), an input that is a model input or a constant, the same
tensor twice, and a concat whose output or inputs the function returns.  Must run last among
the graph passes (after convert_layout, which decides the blocked layout the axis refers to).
"""

from __future__ import annotations

import logging
import math

import numpy as np
from tvm import relax, topi
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from .context import GraphPass, PassReport
from .dataflow import Dataflow, dtype_of, record_calls, rewrite_calls, shape_of

log = logging.getLogger("onnxc.passes")

# TVM's OpPatternKind: kOpaque.  FuseOps fuses nothing into or out of an opaque function.
OPAQUE = 8
# the PrimFunc attribute extraction looks for; its value is the concat axis
CONCAT_ATTR = "onnxc.concat_axis"
# kernels assume 64-byte aligned buffers: every input must start on such a boundary
ALIGN = 64


class PlaceConcat(GraphPass):
    """concat(x1, ..., xn) on a leading axis => unfused concat kernel marked for placement"""

    name = "place_concat"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        df = Dataflow(mod)
        params = set(mod["main"].params)
        refused: dict = {}

        def replace(m, call):
            reason = _refusal(df, params, m.binding.var, call)
            if reason is not None:
                refused[reason] = refused.get(reason, 0) + 1
                return None
            axis = int(call.attrs.axis) % len(call.ty.shape.values)
            fields = [m.visit_expr(f) for f in df.value(call.args[0]).fields]
            return m.builder_.call_te(
                topi.concatenate, fields, axis, primfunc_name_hint="concat_placed",
                primfunc_attrs={"op_pattern": OPAQUE, CONCAT_ATTR: axis})

        mod, replaced = rewrite_calls(mod, "relax.concat", replace)
        record_calls(report, "concat => placed concat (no kernel if the planner places it)",
                     replaced)
        for reason, n in refused.items():
            log.info("place_concat: %d concat(s) left to fusion: %s", n, reason)
        return mod


def _refusal(df: Dataflow, params: set, var, call) -> str | None:
    """Why the concat ``call`` (bound to ``var``) cannot be placed, or None."""
    tup = df.value(call.args[0])
    if not isinstance(tup, relax.Tuple) or len(tup.fields) < 2:
        return "its inputs are not a tuple of two or more tensors"
    shape = shape_of(call)
    if shape is None or any(shape_of(f) is None for f in tup.fields):
        return "symbolic shapes"
    axis = int(call.attrs.axis) % len(shape)
    if math.prod(shape[:axis]) != 1:
        return f"axis {axis} is not the first non-unit axis (the inputs are not contiguous " \
               "slices of the output)"
    sources = [df.source(f) for f in tup.fields]
    if any(math.prod(shape_of(f)) == 0 for f in tup.fields):
        return "an empty input"
    itemsize = np.dtype(dtype_of(call)).itemsize
    if any(math.prod(shape_of(f)) * itemsize % ALIGN for f in tup.fields[:-1]):
        return f"an input would start at a byte offset that is no multiple of {ALIGN}"
    for s in sources:
        if isinstance(s, GenericConst):
            return "an input is a constant"
        if s in params:
            return "an input is a model input"
    if len(set(sources)) != len(sources):
        return "the same tensor is concatenated twice"
    if df.returned(var) or any(df.returned(s) for s in sources):
        return "the output or an input is a model output"
    return None
