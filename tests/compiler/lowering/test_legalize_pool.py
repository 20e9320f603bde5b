"""compiler/lowering/legalize_pool.py: float max pooling skips NaN as onnxruntime's MLAS
pools do (a NaN is dropped where its window holds a number; an all-NaN window is NaN), on
the scheduled kernels (``cpu.pool2d_nchw``, ``cpu.pool_strided``, ``cpu.pool2d_nchwc``, ``cpu.tiled_reduction``,
the fallback), 1-D to 3-D, padded, strided, dilated and NCHW[b]c.

Against onnxruntime only where MLAS skips the NaN: its 2-D kernels keep a NaN that is a
window's last tap, its 1-D kernel gives -FLT_MAX for an all-NaN window, GlobalMaxPool keeps
a NaN in the next-to-last position (measured; docs/conformance.md).  Elsewhere against the
rule in numpy.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import compiler
from tests.conftest import ort_run
from tests.nan_helpers import assert_nan_equal, graph_model, legalized_text

F = TensorProto.FLOAT
LOWEST = np.finfo(np.float32).min


def _skip_nan_pool(x, kernel, strides, pads, dil):
    """The rule in numpy: pad with -FLT_MAX, then per window the max of its non-NaN values,
    NaN when it has none."""
    k = len(kernel)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + k]) for i in range(k)],
                constant_values=LOWEST)
    span = [(kernel[i] - 1) * dil[i] + 1 for i in range(k)]
    win = sliding_window_view(xp, span, axis=tuple(range(2, 2 + k)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    win = win[(Ellipsis,) + tuple(slice(None, None, d) for d in dil)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.nanmax(win, axis=tuple(range(-k, 0)))


def _special(shape, seed=0, sparse=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    if sparse:  # one NaN per 64 elements, finite elsewhere: MLAS's consistent case
        flat[rng.choice(flat.size, flat.size // 64, replace=False)] = np.nan
        return x
    pick = rng.random(flat.size)
    flat[pick < 0.15] = np.nan
    flat[(pick >= 0.15) & (pick < 0.2)] = np.inf
    flat[(pick >= 0.2) & (pick < 0.25)] = -np.inf
    flat[(pick >= 0.25) & (pick < 0.3)] = -0.0
    flat[(pick >= 0.3) & (pick < 0.33)] = 1e-41
    x.reshape(-1, shape[-1])[0, :] = np.nan  # windows of NaN only
    return x


# (id, input shape, kernel, strides, pads, dilations, schedule rule)
POOLS = [
    ("2d_3x3_s1_p1", [1, 4, 16, 16], [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], "cpu.pool2d_nchw"),
    ("2d_2x2_s2", [1, 4, 16, 16], [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], "cpu.pool_strided"),
    ("2d_dilated", [1, 2, 12, 12], [2, 2], [1, 1], [0, 0, 0, 0], [2, 2], None),
    ("1d", [1, 4, 64], [3], [1], [1, 1], [1], None),
    ("3d", [1, 2, 8, 8, 8], [2, 2, 2], [2, 2, 2], [0] * 6, [1, 1, 1], None),
]


@pytest.mark.parametrize("case", POOLS, ids=[c[0] for c in POOLS])
def test_max_pool_skips_nan_on_scheduled_kernel(case):
    _, shape, kernel, strides, pads, dil, rule = case
    x = _special(shape)
    want = _skip_nan_pool(x, kernel, strides, pads, dil)
    m = graph_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel,
                                      strides=strides, pads=pads, dilations=dil, name="p")],
                    shape, list(want.shape))
    cm = compiler.compile(m, target="host")
    if rule is not None:
        assert [k["rule"] for k in cm.report["kernel_table"]] == [rule]
    assert_nan_equal(cm.session().run(None, {"x": x})[0], want)


def test_max_pool_matches_onnxruntime_where_mlas_skips_nan():
    """MLAS skips a NaN in every position of a 1-D window, and in every position of a 2-D
    window but the last tap (measured: there it keeps it): NaN placed accordingly."""
    x = _special([1, 4, 64], sparse=True)
    m = graph_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3], pads=[1, 1],
                                      name="p")], [1, 4, 64], [1, 4, 64])
    got = compiler.compile(m, target="host").session().run(None, {"x": x})[0]
    assert_nan_equal(got, ort_run(m, {"x": x})[0])
    x = np.random.default_rng(2).standard_normal((1, 4, 16, 16)).astype(np.float32)
    x[0, :, ::2, ::2][np.random.default_rng(3).random((4, 8, 8)) < 0.3] = np.nan  # tap (0, 0)
    x[0, 1, 4, 5] = np.nan  # tap (0, 1)
    m = graph_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                                      name="p")], [1, 4, 16, 16], [1, 4, 8, 8])
    got = compiler.compile(m, target="host").session().run(None, {"x": x})[0]
    assert_nan_equal(got, ort_run(m, {"x": x})[0])


def test_blocked_layout_pool_after_conv():
    """conv -> MaxPool: the pool runs in NCHW[b]c (``cpu.pool2d_nchwc``) and skips NaN."""
    rng = np.random.default_rng(1)
    w = np.eye(16, dtype=np.float32).reshape(16, 16, 1, 1)  # identity 1x1 conv
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                     helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                      pads=[1, 1, 1, 1], name="pool")],
                    [1, 16, 16, 16], [1, 16, 8, 8], [numpy_helper.from_array(w, "w")])
    cm = compiler.compile(m, target="host")
    assert "cpu.pool2d_nchwc" in [k["rule"] for k in cm.report["kernel_table"]]
    x = rng.standard_normal((1, 16, 16, 16)).astype(np.float32)
    x[0, :, ::5, ::3] = np.nan
    assert_nan_equal(cm.session().run(None, {"x": x})[0],
                 _skip_nan_pool(x, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]))


@pytest.mark.parametrize("op", ["GlobalMaxPool", "MaxPool"])
def test_global_max_pool_skips_nan(op):
    """GlobalMaxPool and a MaxPool whose window is the whole input: one max_pool window."""
    x = _special([1, 8, 7, 7])
    x[0, 1, 0, 0] = np.nan  # a leading NaN is skipped too
    attrs = {"kernel_shape": [7, 7]} if op == "MaxPool" else {}
    m = graph_model([helper.make_node(op, ["x"], ["y"], name="g", **attrs)], [1, 8, 7, 7],
                    [1, 8, 1, 1])
    got = compiler.compile(m, target="host").session().run(None, {"x": x})[0]
    assert_nan_equal(got, _skip_nan_pool(x, [7, 7], [1, 1], [0] * 4, [1, 1]))


def test_legalized_pool_is_a_key_max_and_int_keeps_tvm():
    def text(dtype, padding=(1, 1, 1, 1)):
        x = relax.Var("x", relax.TensorType((1, 2, 8, 8), dtype))
        return legalized_text(relax.op.nn.max_pool2d(x, (3, 3), padding=padding), x)

    f32 = text("float32")
    # float32: order keys built in pad_temp (the NaN test there), an integer max per tap,
    # the key turned back into the float after the reduction
    assert "pad_temp" in f32 and "pool_max" in f32 and "pool_max_value" in f32
    update = [ln for ln in f32.splitlines() if "pool_max[v_i0, v_i1, v_i2, v_i3] = " in ln]
    assert len(update) == 2 and "-2147483648" in update[0] and "T.max(" in update[1]
    assert "T.isnan" not in update[1] and "T.Select" not in update[1]
    assert 'pool_max = T.sblock_alloc_buffer((T.int64(1), T.int64(2), T.int64(8), ' \
           'T.int64(8)), "int32")' in f32  # TVM's int max: a reducer rfactor knows
    # unpadded: the keys still get their own stage (once per input element)
    assert "pad_temp" in text("float32", (0, 0, 0, 0))
    # other floats: the select reducer; ints: TVM's
    f16 = text("float16")
    assert "T.isnan" in f16 and "pool_max_value" not in f16
    assert "T.max" in text("int32") and "pool_max_value" not in text("int32")


def test_order_keys_order_floats_and_put_nan_lowest():
    """``order_key`` / ``from_order_key`` compiled: the keys' signed order is the floats'
    (-0 below +0), every NaN's key below -inf's, and the round trip gives the same bits
    (a NaN for a NaN)."""
    import tvm
    from tvm import te

    from compiler.lowering.nan_reducers import from_order_key, order_key

    n = 4096
    x = te.placeholder((n,), "float32", name="x")
    k = te.compute((n,), lambda i: order_key(x[i]), name="k")
    back = te.compute((n,), lambda i: from_order_key(k[i]), name="back")
    lib = tvm.compile(te.create_prim_func([x, k, back]), target="llvm")
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, np.inf, -np.inf, LOWEST, -LOWEST, 1e-45, -1e-45, 1e-41,
                        -1e-41, 1.0, -1.0], np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF],
                    np.uint32).view(np.float32)
    vals = np.concatenate([special, nans, rng.standard_normal(n).astype(np.float32) * 1e3])[:n]
    bits = rng.integers(0, 2**32, n - 600, dtype=np.uint64).astype(np.uint32).view(np.float32)
    vals[600:] = bits  # any bit pattern: NaNs with payloads, subnormals
    out_k = tvm.runtime.empty((n,), "int32")
    out_b = tvm.runtime.empty((n,), "float32")
    lib(tvm.runtime.tensor(vals), out_k, out_b)
    keys, got = out_k.numpy(), out_b.numpy()
    num = ~np.isnan(vals)
    order = np.argsort(vals[num], kind="stable")
    ks, vs = keys[num][order].astype(np.int64), vals[num][order]
    assert np.all((np.diff(ks) > 0) | (np.diff(vs) == 0))  # float order kept
    pz, nz = keys[np.where(vals.view(np.uint32) == 0)[0][0]], keys[1]
    assert nz < pz  # -0 below +0
    assert keys[~num].max() < keys[vals == -np.inf][0]  # NaN below -inf
    assert np.array_equal(got[num].view(np.uint32), vals[num].view(np.uint32))
    assert np.isnan(got[~num]).all()


def test_blocked_pool_update_is_vectorised():
    """The NCHW16c stem pool's tap update lowers to a 16-lane integer max of order keys:
    with T.isnan in the update TVM's vectoriser scalarised it (``_s`` loops), and LLVM for
    znver5 then kept the tile in stack memory behind masked stores (400 vs 172 us alone)."""
    import tvm
    from tvm import s_tir, tirx

    from compiler import lowering
    from schedules.cpu.pool import Pool2dNCHWc
    from tests.schedules.util import TARGET, fused_primfunc

    lowering.install()
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(
        x, (3, 3), strides=2, padding=1, layout="NCHW16c")), [(1, 4, 112, 112, 16)], "pool")
    with TARGET:
        sch = Pool2dNCHWc().apply(f, TARGET)
    st, tx = s_tir.transform, tirx.transform
    mod = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")
                        .with_attr("target", TARGET)})
    with tvm.transform.PassContext(opt_level=3):
        low = tvm.ir.transform.Sequential([
            st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(),
            st.ConvertBlocksToOpaque(), st.CompactBufferAllocation(), st.LowerOpaqueBlock(),
            tx.FlattenBuffer(), tx.VectorizeLoop(True)])(mod)["main"].script()
    update = [ln for ln in low.splitlines() if "pool_max_global[i3_1" in ln and "T.max(" in ln]
    assert update and "pool_max_global[T.Ramp(" in update[0] and "_s in range" not in low
    assert 'pool_max_global = T.decl_buffer((128,), "int32")' in low or "int32" in update[0] \
        or '"int32"' in low


@pytest.mark.parametrize("lanes, side, kernel, stride, pad", [
    (8, 17, 3, 2, 1),    # ResNet's stem pool shape at a small, odd size (9 outputs: no tile of 8)
    (8, 14, 3, 2, 1),    # even output row (7)
    (16, 12, 2, 2, 0),   # NCHW16c, ceil-free 2x2/2
])
def test_blocked_pool_kernel_skips_nan(lanes, side, kernel, stride, pad):
    """The ``cpu.pool2d_nchwc`` kernel itself (taps innermost per pixel, the NaN identity
    folded into the first tap by LLVM): NaN leading, inside and last in a window, +-inf,
    -0.0, subnormals and all-NaN windows, against the rule in numpy."""
    import tvm

    from compiler import lowering
    from schedules.cpu.pool import Pool2dNCHWc
    from tests.schedules.util import fused_primfunc

    lowering.install()
    blocks = 2
    f = fused_primfunc(lambda bb, x: bb.emit(relax.op.nn.max_pool2d(
        x, (kernel, kernel), strides=stride, padding=pad, layout=f"NCHW{lanes}c")),
        [(1, blocks, side, side, lanes)], "pool", )
    target = tvm.target.Target("llvm")  # runs here: this machine's vectors
    with target:
        sch = Pool2dNCHWc().apply(f, target)
    assert sch is not None
    lib = tvm.compile(tvm.IRModule({"k": sch.mod["main"].with_attr("global_symbol", "k")}),
                      target=target)
    x = _special([1, blocks * lanes, side, side], seed=side)
    lo = stride - pad  # output (1, 1)'s window, clear of the padding, all NaN
    x[0, 3, lo:lo + kernel, lo:lo + kernel] = np.nan
    xb = np.ascontiguousarray(x.reshape(1, blocks, lanes, side, side).transpose(0, 1, 3, 4, 2))
    want = _skip_nan_pool(x, [kernel] * 2, [stride] * 2, [pad] * 4, [1, 1])
    out = tvm.runtime.tensor(np.zeros((1, blocks) + want.shape[2:] + (lanes,), np.float32))
    lib["k"](tvm.runtime.tensor(xb), out)
    got = out.numpy().transpose(0, 1, 4, 2, 3).reshape(want.shape)
    assert np.isnan(want).any() and np.isnan(got).any()
    assert_nan_equal(got, want)
