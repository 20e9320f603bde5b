"""Helpers for schedule rule tests: fused PrimFuncs from Relax, tiny ONNX models."""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tests.hosts import CompileOnly

# AVX-512, 2 cores: the rules' structure does not depend on the machine running the test
TARGET = tvm.target.Target(
    {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 2})


def fused_primfunc(build, shapes, contains, legalize_map=None):
    """The fused PrimFunc whose name contains ``contains`` of a Relax function built by
    ``build(bb, *params)`` over float32 params of ``shapes`` (legalized, with
    ``legalize_map`` over TVM's if given, e.g. ``compiler.lowering.install()``; fused)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(name=f"p{i}", ty=relax.TensorType(shape=s, dtype="float32"))
              for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([
        relax.transform.LegalizeOps(customize_legalize_map=legalize_map),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    funcs = [f for gv, f in mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and contains in gv.name_hint]
    assert len(funcs) == 1, [gv.name_hint for gv in mod.functions]
    return funcs[0]


def loop_kinds(sch) -> str:
    """The scheduled function's TIR as text (to look for parallel / vectorized loops)."""
    return sch.mod["main"].script()


def onnx_model(nodes, inputs, outputs, inits=()):
    """An opset-17 model from nodes, (name, shape) inputs/outputs and numpy initializers."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in dict(inits).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def check_against_ort(model, feeds, rule_name, **compile_kw):
    """Compile with onnxc for ``host`` (``compile_kw`` passed on), check the rule scheduled a
    kernel, compare with onnxruntime (not under a fabricated host, where nothing runs)."""
    import compiler
    import onnxruntime as ort

    cm = compiler.compile(model, target="host", **compile_kw)
    assert cm.report["schedules"].get(rule_name, 0) >= 1, cm.report["schedules"]
    try:
        got = cm.session().run(None, feeds)
    except CompileOnly:  # compiled for a fabricated host (tests/hosts.py): the rule is the check
        return
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
