"""Layout transforms that pad nothing, computed over their output's index space.

TVM legalizes ``relax.layout_transform`` as a copy over the *input's* index space whose
writes go through the index map (``out[n, c // 16, h, w, c % 16] = x[n, c, h, w]``): a
flat scalar loop with a division per element that no rule takes (``cpu.elementwise``).
NCHW -> NCHW16c of [1, 1024, 14, 14] ran 171 us against onnxruntime's ReorderInput 47
(emeraldrapids, one thread).  Here a transform whose map is a bijection of the shape (whole
channel blocks: no padding) is ``out[o] = x[inverse(o)]`` over the output's index space, so
NCHW -> NCHWc is the transpose ``cpu.transpose_tiled`` schedules (56 us there), and so is
NCHWc -> NCHW (44 -> 27 us; onnxruntime 23; at [1, 96, 56, 56], where a row copy gathers
each output vector from 16 lines, 179 -> 81 us, onnxruntime 77).  A transform that pads (24
channels into blocks of 16) or whose map TVM cannot invert keeps TVM's legalization.
Returned for our pipeline's ``LegalizeOps`` (``compiler.lowering.install``); weights are
folded by TVM's own, the same values.
"""

from __future__ import annotations

from tvm import te, tirx


def legalize_layout_transform(bb, call):
    from tvm.relax.transform.legalize_ops.manipulate import _layout_transform

    index_map = call.attrs.index_map
    shape = call.args[0].ty.shape
    try:
        _, padding = index_map.non_surjective_inverse(shape)
        inverse = index_map.inverse(shape) if isinstance(padding, tirx.IntImm) else None
    except Exception:  # noqa: BLE001 - not invertible over this shape: TVM's legalization
        inverse = None
    if inverse is None:
        return _layout_transform(bb, call)

    def te_layout_transform(a):
        return te.compute(index_map.map_shape(list(a.shape)),
                          lambda *o: a(*inverse.map_indices(list(o))),
                          name="te_layout_transform")

    return bb.call_te(te_layout_transform, call.args[0],
                      primfunc_name_hint="te_layout_transform")


LEGALIZE_MAP = {"relax.layout_transform": legalize_layout_transform}
