"""layer_norm(x, axes=[k..n-1]) => reshape(layer_norm(reshape(x, [.., prod]), [-1])).

A layer norm over several trailing axes (ONNX LayerNormalization with ``axis`` before the
last: torch's ``nn.LayerNorm([C, H, W])``, a norm over (tokens, features)) is one over each
row of the flattened trailing dims: the reshapes are views (no copy), gamma and beta are
flattened alike, and the row kernel (``cpu.row_reduction``) takes it.  TVM's layer norm
over several axes ran under no CPU rule: [1, 64, 56, 56] with axis 1 at 347x onnxruntime's
time, [4, 197, 768] with axis -2 at 2x.  The axes must be the trailing ones (what ONNX
LayerNormalization and fuse_layer_norm write); symbolic dims are fine (their product is
the row).  Runs after fuse_layer_norm, whose decomposed norms may span several axes.
"""

from __future__ import annotations

from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import record_calls, rewrite_calls
from .relax_util import element_count

RULE = "layer_norm(x, axes=[k..n-1]) => reshape(layer_norm(reshape(x, [.., prod]), [-1]))"


class FlattenNormAxes(GraphPass):
    """layer_norm over several trailing axes => one over their flattened row"""

    name = "flatten_norm_axes"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        out, rewritten = rewrite_calls(mod, "relax.nn.layer_norm", _flattened)
        record_calls(report, RULE, rewritten)
        return out


def _flattened(m, call):
    x, gamma, beta = call.args
    shape = getattr(x.ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    dims = list(shape.values)
    n = len(dims)
    axes = sorted(int(a) % n for a in call.attrs.axes) if n else []
    if len(axes) < 2 or axes != list(range(n - len(axes), n)):
        return None  # one axis already, or not the trailing ones
    lead, row = dims[:n - len(axes)], element_count(dims[n - len(axes):])
    flat = relax.ShapeExpr([*lead, row])
    a = call.attrs
    tag = m.binding.var.name  # the kernels keep naming the ONNX node (``n<k>_<j>``)

    def emit(expr, j):
        return m.builder_.emit(expr, name_hint=f"{tag}_{j}")
    y = relax.op.nn.layer_norm(
        emit(relax.op.reshape(m.visit_expr(x), flat), 1),
        emit(relax.op.reshape(m.visit_expr(gamma), relax.ShapeExpr([row])), 2),
        emit(relax.op.reshape(m.visit_expr(beta), relax.ShapeExpr([row])), 3),
        axes=[-1], epsilon=float(a.epsilon), center=bool(a.center), scale=bool(a.scale))
    return relax.op.reshape(emit(y, 4), relax.ShapeExpr(dims))
