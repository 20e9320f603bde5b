"""op_fp16(x) => cast_fp16(op(cast_fp32(x))) for reductions; matmul/conv get out_dtype fp32.

TVM 0.27 accumulates fp16 sums in fp16 (sum, mean, variance, std, prod, cumsum, softmax
and log_softmax's exp-sum, average pools, matmul, conv): a sum stops growing at 2048 when
adding ones, and overflows to inf past 65504 (the mean of 2048 values around 40).  Its
layer/group/instance/rms_norm kernels already accumulate in fp32 and are not touched.
Runs after the fusion passes (which match fp16 ops by their ops, not casts); the casts
fuse into the reduction's kernel.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .context import GraphPass, PassReport
from .dataflow import Dataflow, Match, record, rewrite
from .relax_util import with_fields

_LOW = ("float16", "bfloat16")
# reductions whose kernel accumulates in the input dtype: cast the input up, result down
_CAST_WRAPPED = ("sum", "mean", "variance", "std", "prod", "cumsum", "nn.softmax",
                 "nn.log_softmax", "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d",
                 "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d")
# ops with an out_dtype attribute: accumulate in it, keep fp16 operands
_OUT_DTYPE = ("matmul", "nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose",
              "nn.conv2d_transpose", "nn.conv3d_transpose")


class AccumulateFp32(GraphPass):
    """reduce_fp16(x) => cast_fp16(reduce(cast_fp32(x)))"""

    name = "accumulate_fp32"
    opt_level = 1

    def rewrite(self, mod, report: PassReport, options: dict):
        df = Dataflow(mod)
        matches = [m for b in df.roots()
                   for m in [_match(df, b.var, b.value)] if m]
        record(report, df, matches)
        casts: dict = {}   # one fp32 copy per fp16 tensor, shared by its reductions
        return rewrite(mod, matches, lambda m: _plan(df, m, casts))


def _match(df: Dataflow, root, value):
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
        return None
    name = value.op.name[len("relax."):]
    dtype = str(getattr(value.ty, "dtype", ""))
    if dtype not in _LOW or any(str(getattr(a.ty, "dtype", "")) != dtype
                                for a in value.args):
        return None
    if name in _OUT_DTYPE:
        return Match(f"{name} fp16 => accumulate in fp32", root, [], {"call": value})
    if name in _CAST_WRAPPED:
        if name == "cumsum" and value.attrs.dtype is not None and str(value.attrs.dtype) \
                not in ("", "void"):
            return None
        return Match(f"{name} fp16 => accumulate in fp32", root, [], {"call": value})
    return None


def _plan(df: Dataflow, m: Match, casts: dict):
    call = m.info["call"]
    dtype = str(call.ty.dtype)

    def up(em, a):
        key = df.source(a)
        if key not in casts:
            casts[key] = em.emit(relax.op.astype(a, "float32"))
        return casts[key]

    def build(em):
        if call.op.name[len("relax."):] in _OUT_DTYPE:
            wide = relax.Call(call.op, call.args, with_fields(call.attrs, out_dtype="float32"),
                              call.ty_args)
        else:
            wide = relax.Call(call.op, [up(em, a) for a in call.args], call.attrs,
                              call.ty_args)
        return relax.op.astype(em.emit(wide), dtype)

    return build
