"""softmax(x, axis=k) => permute(softmax(permute(x, k last), -1)), k not the last axis.

Softmax / LogSoftmax over another axis than the last (a segmentation head's softmax over
the channels of NCHW, a 2-D softmax over axis 0): TVM's kernel reduces along a strided
axis and runs under dlight's reduction rule, one row at a time: [1, 64, 56, 56] over axis
1 took 10.5x onnxruntime's time, [512, 256] over axis 0 850x.  Moved to the last axis by a
transpose (``cpu.transpose_tiled``), the row rule (``cpu.row_reduction``: vector partial
sums, vectorisable exp) takes it, and a transpose moves it back: two extra passes over the
tensor, each a fraction of what the strided reduction cost.  Runs after stable_softmax
(which makes the decomposed forms softmax / log_softmax ops) and before convert_layout
(whose blocked layouts then see the transposes).
"""

from __future__ import annotations

import functools

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import record_calls, rewrite_calls

RULE = "softmax(x, axis=k) => permute(softmax(permute(x, k last), -1))"


class SoftmaxLastAxis(GraphPass):
    """softmax / log_softmax over a non-last axis => over the last, between transposes"""

    name = "softmax_last_axis"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        replaced = []
        for op, make in (("relax.nn.softmax", relax.op.nn.softmax),
                         ("relax.nn.log_softmax", relax.op.nn.log_softmax)):
            mod, done = rewrite_calls(mod, op, functools.partial(_moved, make=make))
            replaced += done
        record_calls(report, RULE, replaced)
        return mod


def _moved(m, call, make):
    x = call.args[0]
    ndim = getattr(x.ty, "ndim", -1)
    if ndim is None or ndim < 2:
        return None
    axis = int(call.attrs.axis) % ndim
    if axis == ndim - 1:
        return None
    order = [d for d in range(ndim) if d != axis] + [axis]
    back = [order.index(d) for d in range(ndim)]
    tag = m.binding.var.name  # the kernels keep naming the ONNX node (``n<k>_<j>``)
    moved = m.builder_.emit(relax.op.permute_dims(m.visit_expr(x), order),
                            name_hint=f"{tag}_1")
    y = m.builder_.emit(make(moved, axis=-1), name_hint=f"{tag}_2")
    return relax.op.permute_dims(y, back)
