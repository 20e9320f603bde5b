"""compiler/lowering/input_alignment.py: the kernels reading a model input are built
element-aligned on it, the graph records it (``inputs[i]["align"]``), and the runtime reads
such an input where the caller's array lies instead of copying it into the arena."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from tvm import te

from compiler.lowering import input_alignment
from compiler.lowering.graph import KernelGraph, Tensor
from runtime.session import KERNEL_ALIGN, arg_positions, input_align
from tests.conftest import REPO


def _double():
    a = te.placeholder((4, 64), name="A")
    b = te.compute((4, 64), lambda j, i: a[j, i] * 2.0, name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    sch.vectorize(sch.get_loops(sch.get_sblock("B"))[-1])
    return sch.mod["main"]


def _unaligned(shape, off, dtype=np.float32):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + off
    return raw[start:start + n].view(dtype).reshape(shape)


def test_structure_relax_declares_marked_params_element_aligned_and_runs_unaligned():
    import tvm_ffi

    func = _double().with_attr(input_alignment.ATTR, [0])
    mod = input_alignment.relax(tvm.IRModule({"f": func.with_attr("global_symbol", "f")}))
    out = mod["f"]
    assert [p.ty.data_alignment for p in out.params] == [4, 64]  # A relaxed, B as it was
    assert input_alignment.ATTR not in out.attrs
    lib = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    a = _unaligned((4, 64), 4)
    a[...] = np.arange(256, dtype=np.float32).reshape(4, 64)
    b = tvm.runtime.tensor(np.zeros((4, 64), np.float32))
    lib["f"](tvm_ffi.from_dlpack(a, require_alignment=4), b)
    np.testing.assert_array_equal(b.numpy(), a * 2)


def test_negative_unmarked_kernels_untouched():
    mod = tvm.IRModule({"f": _double().with_attr("global_symbol", "f")})
    assert input_alignment.relax(mod) is mod
    assert [p.ty.data_alignment for p in mod["f"].params] == [64, 64]


def test_arg_positions_skip_scalar_arguments():
    call = {"args": [3, 4, 5], "scalars": [[1, "n"], [4, "n * 2"]]}
    assert arg_positions(call) == [0, 2, 3]
    assert arg_positions({"args": [1, 2]}) == [0, 1]


def test_mark_names_readers_of_inputs_and_their_views_not_written_inputs():
    g = KernelGraph()
    x = g.add(Tensor("x", [4, 64], "float32", "input"))
    kv = g.add(Tensor("kv", [4, 64], "float16", "input"))
    view = g.add(Tensor("xv", [256], "float32", "intermediate", base=x))
    y = g.add(Tensor("y", [4, 64], "float32", "intermediate"))
    rows = g.add(Tensor("rows", [4, 64], "float16", "intermediate", base=kv))
    g.inputs = [("x", x), ("kv", kv)]
    g.prim_funcs = {"k0": _double(), "k1": _double(), "k2": _double()}
    g.calls = [{"kernel": "k0", "args": [view, y], "num_outputs": 1},
               {"kernel": "k1", "args": [y, rows], "num_outputs": 1},  # writes into kv
               {"kernel": "k2", "args": [kv, y], "num_outputs": 1, "scalars": [[0, "n"]]}]
    assert input_alignment.mark(g) == {"x": 4, "kv": KERNEL_ALIGN}
    assert list(g.prim_funcs["k0"].attrs[input_alignment.ATTR]) == [0]
    assert input_alignment.ATTR not in (g.prim_funcs["k1"].attrs or {})
    # k2 reads kv (written by k1: the input stays copied, the parameter relaxed anyway)
    # at kernel position 1, after the scalar
    assert list(g.prim_funcs["k2"].attrs[input_alignment.ATTR]) == [1]


def test_artifact_without_align_keeps_the_64_byte_contract():
    assert input_align({"name": "x", "tensor": 0}) == KERNEL_ALIGN == 64
    assert input_align({"name": "x", "tensor": 0, "align": 4}) == 4


# Conv (its NCHW -> NCHWc layout transform reads the input with vector moves LLVM emits
# aligned when it may) and a residual add reading the input again; run in a child so that
# a fault is a failed test, not a dead test session.
_CHILD = textwrap.dedent("""
    import numpy as np, onnx, sys
    from onnx import TensorProto, helper, numpy_helper
    import compiler
    sys.path.insert(0, {repo!r})
    from tests.conftest import ort_run, assert_close
    rng = np.random.default_rng(0)
    vi = helper.make_tensor_value_info
    w = numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["c", "x"], ["y"])], "g",
        [vi("x", TensorProto.FLOAT, [1, 32, 28, 28])], [vi("y", TensorProto.FLOAT, [1, 32, 28, 28])],
        [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = compiler.compile(m, target="host").session()
    assert sess.graph["inputs"][0]["align"] == 4, sess.graph["inputs"]
    (_, _, _, in_place), = sess._static[1]
    for off in (4, 36, 2, 0):
        n = 32 * 28 * 28 * 4
        raw = np.empty(n + 128, np.uint8)
        s = (-raw.ctypes.data) % 64 + off
        x = raw[s:s + n].view(np.float32).reshape(1, 32, 28, 28)
        x[...] = rng.standard_normal(x.shape)
        # read where it lies unless below float32's alignment (2)
        assert (sess._wrap_input(x, *in_place) is not None) == (off % 4 == 0), off
        # 288-term sums of values up to ~70: fp32 rounding ~5e-5 on every host
        assert_close(sess.run(None, {{"x": x}}), ort_run(m, {{"x": x}}), atol=1e-3)
    print("ok")
""")


def test_element_aligned_input_read_in_place_end_to_end(request):
    if request.config.getoption("--fake-host"):
        pytest.skip("runs compiled code")
    r = subprocess.run([sys.executable, "-c", _CHILD.format(repo=str(REPO))], cwd=str(REPO),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode,
                                                                    r.stderr[-2000:])
