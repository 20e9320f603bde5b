"""What onnxc's converters share: registration, refusals, and static facts about inputs.

A converter refuses (``refuse``, ``UnsupportedError`` naming the node) what it cannot
convert exactly rather than converting it wrongly; most need static shapes
(``static_shape``) and some constant inputs (``constant_value``, ``const_input``).
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
from tvm import relax

from ...errors import UnsupportedError
from ..registry import register_op, tvm_converter


def register(op, since=1, override=False, until=None):
    """Decorator: register an onnxc converter for default-domain ``op`` from opset ``since``
    (to ``until``, if given: an op version older ONNX defined differently);
    ``override=True`` where it replaces a registered one (TVM's), see ``registry.previous``."""
    return register_op("", op, since=since, until=until, implementation="onnxc",
                       override=override)


def refuse(ctx, what: str):
    """Raise ``UnsupportedError`` naming the node: ``what`` is not supported."""
    node = ctx.node
    raise UnsupportedError(f"node {node.name!r} ({node.op_type}): {what} is not supported")


def static_shape(x) -> list[int]:
    """Static shape of a tensor expression (ints)."""
    from tvm import tirx

    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        raise UnsupportedError("input shape is not known at compile time")
    return [int(v.value) for v in values]


def shape_of(x) -> list | None:
    """Shape of a tensor expression: ints where static, TIR expressions where symbolic
    (dims of a model exported with dynamic axes, compiled once for their ranges); None
    when even the rank is unknown."""
    from tvm import tirx

    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None:
        return None
    return [int(v.value) if isinstance(v, tirx.IntImm) else v for v in values]


def np_dtype(dtype: str):
    """The numpy dtype of a TVM dtype string (bfloat16 through ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def scalar(value, dtype: str):
    """A rank-0 Relax constant of ``dtype`` holding ``value`` rounded as numpy would."""
    arr = np.array(value, dtype=np_dtype(dtype))
    return relax.const(arr, dtype)


def dtype_of(x) -> str:
    """The dtype of a tensor expression, as a string."""
    return str(x.ty.dtype)


def is_float(dtype: str) -> bool:
    """float16/32/64 and bfloat16."""
    return dtype.startswith("float") or dtype.startswith("bfloat")


def attr_text(v, default):
    """A string attribute as ``str`` (ONNX gives bytes), ``default`` when absent."""
    v = default if v is None else v
    return v.decode() if isinstance(v, bytes) else str(v)


def tensor_const(arr: np.ndarray):
    """A Relax constant of exactly ``arr``'s dtype (``relax.const`` alone turns int64
    arrays into int32)."""
    return relax.const(arr, str(arr.dtype))


def const_input(x, what: str, node):
    """The numpy value of a constant input, or refuse naming the node."""
    if x is None:
        return None
    if hasattr(x, "value") and hasattr(x.value, "numpy"):
        return x.value.numpy()
    raise UnsupportedError(f"node {node.name!r} ({node.op_type}): {what} must be a constant "
                           "(an initializer) for onnxc")


def refuse_attribute(op, attr, why, since=1):
    """Refuse ``op`` when attribute ``attr`` is set (TVM ignores it), else delegate."""

    @register(op, since, override=True)
    def convert(bb, inputs, attrs, ctx):
        if attr in attrs and why(attrs[attr]):
            raise UnsupportedError(f"node {ctx.node.name!r} ({op}): attribute {attr}="
                                   f"{attrs[attr]!r} is not supported")
        return tvm_converter(op)(bb, inputs, attrs, ctx)

    convert.__doc__ = f"{op} (TVM's), refusing {attr} which TVM ignores"
    return convert


FOLD_MAX_ELEMENTS = 1 << 16


def constant_value(x):
    """The numpy value of an input known at compile time, or None.

    A Relax constant, a shape value whose dims are all static (int64, as ONNX's Shape
    gives), or a constant scalar (TVM's Gather of a shape value returns an ``IntImm``)."""
    from tvm import tirx
    from tvm.ir.expr import GenericConst

    if isinstance(x, GenericConst):
        return x.value.numpy()
    if isinstance(x, relax.ShapeExpr):
        if all(isinstance(v, tirx.IntImm) for v in x.values):
            return np.array([int(v.value) for v in x.values], np.int64)
        return None
    if isinstance(x, (tirx.IntImm, tirx.FloatImm)):
        return np.array(x.value, dtype=str(x.ty))
    return None


def constant_values(inputs):
    """numpy values of all (non-omitted) inputs, or None if any is not known."""
    values = [None if x is None else constant_value(x) for x in inputs]
    if any(v is None for x, v in zip(inputs, values) if x is not None):
        return None
    return values


def fold_result(arr: np.ndarray):
    """``arr`` as a constant when small enough to compute at import, else None."""
    arr = np.asarray(arr)
    return tensor_const(arr) if arr.size <= FOLD_MAX_ELEMENTS else None


def static_dims(x, ctx):
    """Static shape of a tensor expression (ints), refusing naming the node if unknown."""
    from tvm import tirx

    values = getattr(getattr(x.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        raise UnsupportedError(f"node {ctx.node.name!r} ({ctx.node.op_type}): input shape "
                               "is not known at compile time")
    return [int(v.value) for v in values]


def float_only(ctx, x, what="input"):
    """Refuse unless ``x`` is a float tensor."""
    if not is_float(dtype_of(x)):
        refuse(ctx, f"{what} of type {dtype_of(x)}")


def normalize_axis(ctx, axis: int, rank: int, what="axis") -> int:
    """``axis`` in [0, rank), refusing one out of range."""
    if not -rank <= axis < rank:
        refuse(ctx, f"{what}={axis} for an input of rank {rank}")
    return axis % rank


def int_values(ctx, x, what: str) -> list[int]:
    """The values of a constant integer input, refusing a non-constant one."""
    return [int(v) for v in np.asarray(const_input(x, what, ctx.node)).reshape(-1)]


# fp32 lanes of the CPU target being compiled for (the driver sets it around the import);
# None: not a CPU target (GPU targets, or not compiling).  Converters that emit a kernel
# written already scheduled for CPUs (``schedules/cpu/recurrence.py``, ``topk.py``,
# ``scan.py``) do so only under a value, and otherwise emit Relax ops.
_LANES: contextvars.ContextVar = contextvars.ContextVar("cpu_lanes", default=None)


@contextlib.contextmanager
def cpu_kernels(lanes):
    """Let converters emit CPU kernels for a CPU of ``lanes`` fp32 lanes while importing;
    None: Relax ops only."""
    token = _LANES.set(lanes)
    try:
        yield
    finally:
        _LANES.reset(token)


def cpu_lanes():
    """fp32 lanes of the CPU target being imported for, None when not a CPU target."""
    return _LANES.get()



def kernel_shape(x) -> list:
    """``x``'s dims for a kernel template (``schedules/cpu/templates.py``): an int each,
    None where symbolic."""
    from tvm import tirx

    return [int(d) if isinstance(d, tirx.IntImm) else None for d in x.ty.shape.values]
