"""NaN / Inf test helpers (issue #17), shared by tests/compiler/test_nan_every_op.py,
tests/compiler/lowering/test_nan_semantics.py, test_legalize_reductions.py and
test_legalize_pool.py: model builders, the element-wise comparison (the one
``scripts/nan_sweep.py`` uses: NaN positions, infinities, signs of zero, values within a
tolerance), special-value inputs and the legalized TIR of one Relax op."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import nan_sweep  # noqa: E402

from tests.conftest import ort_run  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
OPSET = 17


def graph_model(nodes, shape, out_shape, inits=(), out_type=F, opset: int = OPSET):
    """A model of ``nodes`` reading float input ``x`` of ``shape`` and writing ``y``."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info("y", out_type, out_shape)],
                          list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def node_model(op, feeds: dict, inits: dict | None = None, names=None, out_type=F,
               opset: int = OPSET, **attrs):
    """A one-node model of ``op`` over float ``feeds`` (graph inputs) and ``inits``
    (initializers); ``names`` orders its inputs (default: feeds, then inits; "" for an
    omitted optional input).  The output shape is declared from onnxruntime's result, as
    onnxc requires a static one."""
    inits = inits or {}
    names = names if names is not None else list(feeds) + list(inits)
    g = helper.make_graph(
        [helper.make_node(op, names, ["y"], name="y", **attrs)], "g",
        [helper.make_tensor_value_info(k, F, v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    shape = ort_run(m, feeds)[0].shape
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", out_type, shape))
    return m


def assert_nan_equal(got, want, rtol: float = 0.0, atol: float = 0.0,
                     zero_sign: bool = False):
    """``got`` equals ``want`` element-wise: the same dtype and shape, NaN exactly where
    ``want`` has NaN, infinities equal, other values within ``rtol``/``atol`` (exact by
    default), and with ``zero_sign`` the sign of every zero both give."""
    detail = nan_sweep.compare([np.asarray(got)], [np.asarray(want)], zero_sign=zero_sign,
                               rtol=rtol, atol=atol)
    assert not detail, detail


def check_against_ort(m, feeds: dict, zero_sign: bool = False, rtol: float = 1e-5,
                      atol: float = 1e-6):
    """Compile ``m`` for ``host``, run it on ``feeds`` and compare its first output with
    onnxruntime's (``assert_nan_equal``)."""
    import compiler

    expected = ort_run(m, feeds)[0]
    got = compiler.compile(m, target="host").session().run(None, feeds)[0]
    assert_nan_equal(got, expected, rtol=rtol, atol=atol, zero_sign=zero_sign)


def nan_rows(shape, seed: int = 0) -> np.ndarray:
    """Values with NaN leading some rows, inside others, ending others, +-inf, -0.0,
    denormals, an all -inf row and an all-NaN row (rows: the last axis; 8 rows at least)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    n = shape[-1]
    flat[0, 0] = np.nan
    flat[1, n // 2] = np.nan
    flat[2, n - 1] = np.nan
    flat[3, 3] = np.inf
    flat[4, :] = -np.inf
    flat[5, :] = np.nan
    flat[6, 1::7] = -0.0
    flat[7, ::5] = 1e-41
    flat[7, 0] = -np.inf
    return x


def legalized_text(expr, *params) -> str:
    """The TIR (TVMScript) that onnxc's legalizations give for the Relax ``expr`` over
    ``params``."""
    import tvm
    from tvm import relax

    from compiler import lowering

    lowering.install()
    bb = relax.BlockBuilder()
    with bb.function("main", [p for p in params if isinstance(p, relax.Var)]):
        with bb.dataflow():
            out = bb.emit_output(expr)
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return "\n".join(f.script() for _, f in mod.functions.items()
                     if isinstance(f, tvm.tirx.PrimFunc))
