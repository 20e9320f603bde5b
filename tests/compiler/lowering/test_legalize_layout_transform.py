"""compiler/lowering/legalize_layout_transform.py: a layout transform of whole blocks is
computed over its output's index space (NCHW -> NCHWc then takes cpu.transpose_tiled); one
that pads keeps TVM's legalization; values equal onnxruntime's either way.  NCHW -> NCHWc
and NCHWc -> NCHW both take cpu.transpose_tiled."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import compiler
from compiler.driver import schedule_kernels
from compiler.lowering import install
from tests.conftest import assert_close, ort_run


def _legalized(channels: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, 7, 7), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.layout_transform(
                x, index_map=lambda n, c, h, w: (n, c // 16, h, w, c % 16), pad_value=0.0))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps(customize_legalize_map=install())(bb.get())
    return [(gv.name_hint, f) for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)]


def test_structure_whole_blocks_iterate_the_output():
    (name, func), = _legalized(32)
    assert name == "te_layout_transform"
    text = func.script()
    assert "T.grid(T.int64(1), T.int64(2), T.int64(7), T.int64(7), T.int64(16))" in text
    assert "c // 16" not in text and "// T.int64(16)" not in text  # no division per write


def test_negative_padded_transform_keeps_tvms():
    (name, func), = _legalized(24)  # 24 channels into blocks of 16: padded
    assert name == "te_layout_transform_with_pad"


def _conv_model(cin=64, cout=32, hw=14):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((cout, cin, 1, 1)).astype(np.float32), "w")
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "conv",
                          [vi("x", TensorProto.FLOAT, [1, cin, hw, hw])],
                          [vi("y", TensorProto.FLOAT, [1, cout, hw, hw])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cin,hw", [(64, 14), (32, 7), (48, 9)])
def test_nchwc_conv_transforms_match_onnxruntime(tmp_path, cin, hw):
    m = _conv_model(cin=cin, hw=hw)
    path = str(tmp_path / "conv.onnx")
    onnx.save(m, path)
    _, rules, _ = schedule_kernels(path, layout="NCHWc")
    # the input's NCHW -> NCHWc transform is a tiled transpose where the width allows tiles
    # and so is the output's NCHWc -> NCHW (``x[n, c // 16, h, w, c % 16]``)
    if hw >= 7:
        assert rules["te_layout_transform"] == "cpu.transpose_tiled", rules
        assert rules["te_layout_transform1"] == "cpu.transpose_tiled", rules
    x = np.random.default_rng(1).standard_normal((1, cin, hw, hw)).astype(np.float32)
    got = compiler.compile(m, target="host", layout="NCHWc").session().run(None, {"x": x})
    assert_close(got, ort_run(m, {"x": x}), atol=1e-4)
