"""pack_int_matmul: structure (count, names, packed layout, one fused f32 kernel), numerics
against onnxruntime and against exact integer arithmetic, and matmuls it must leave alone;
the u8 x s8 form (weights by fours, vpmaddubsw / vpdpbusd): packing, per-tensor and
per-column weights against onnxruntime, saturation as onnxruntime's and reported, and the
``exact`` option keeping the i16 pair path."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import compiler
import targets
from passes.int8_quads import SATURATING
from passes.pack_int_matmul import RULE, RULE_U8, pack_int, pack_quads, pad_rows

def host_dot():
    """The host's u8 x s8 dot ("avx2", "avx512vnni", ...; None: every matmul stays on i16
    pairs), read per test: ``--fake-host`` patches the host after import."""
    info = targets.resolve("host")
    return targets.int8_dot(info.arch, info.features)


def need_dot():
    """The host's dot, or skip the test."""
    dot = host_dot()
    if dot is None:
        pytest.skip("host has no u8 x s8 dot")
    return dot

NP = {"uint8": np.uint8, "int8": np.int8}
ONNX = {"uint8": TP.UINT8, "int8": TP.INT8}


def dynamic_model(m, k, n, w, wz, bias=None, per_row_zp=False):
    """onnxruntime's quantize_dynamic pattern: x -> DynamicQuantizeLinear -> MatMulInteger(
    xq, W) -> Cast -> * (x_scale * w_scale) [-> + bias], W's zero point ``wz`` (scalar or
    per column)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["accf"], to=TP.FLOAT, name="cast"),
             helper.make_node("Mul", ["xs", "ws"], ["s"], name="scale"),
             helper.make_node("Mul", ["accf", "s"], ["y0"], name="deq")]
    inits = {"w": w, "wz": wz, "ws": np.array(0.01, np.float32)}
    out = "y0"
    if bias is not None:
        nodes.append(helper.make_node("Add", ["y0", "b"], ["y"], name="bias"))
        inits["b"], out = bias, "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [m, k])],
                          [helper.make_tensor_value_info(out, TP.FLOAT, [m, n])],
                          [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def integer_model(m, k, n, a_dtype, w=None, wz=None, az_shape=(), b_input=False):
    """MatMulInteger(a, W, az, wz) -> int32 output, ``a`` an input of ``a_dtype``; W an
    initializer, or an input when ``b_input``."""
    ins = [helper.make_tensor_value_info("a", ONNX[a_dtype], [m, k]),
           helper.make_tensor_value_info("az", ONNX[a_dtype], list(az_shape))]
    inits = {"wz": wz}
    if b_input:
        ins.append(helper.make_tensor_value_info("w", ONNX[str(w.dtype)], [k, n]))
    else:
        inits["w"] = w
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "az", "wz"], ["y"], name="mmi")], "g", ins,
        [helper.make_tensor_value_info("y", TP.INT32, [m, n])],
        [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def ort_run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _pass(cm):
    return next(p for p in cm.report["passes"] if p["name"] == "pack_int_matmul")


def test_pack_int_layout_dtype_and_padding():
    w = np.arange(5 * 20).reshape(5, 20) - 50          # fits int8
    p = pack_int(w, 16)
    assert p.shape == (2, 3, 16, 2) and p.dtype == np.int8 and p.flags.c_contiguous
    assert p[1, 1, 3, 1] == w[3, 19] and p[0, 2, 0, 0] == w[4, 0]
    assert p[0, 2, 0, 1] == 0 and p[1, 0, 4, 0] == 0   # odd K's zero row, padded columns
    assert pack_int(w * 3, 16).dtype == np.int16       # u8 weights minus a zero point


def test_pad_rows_only_without_a_register_tile_divisor():
    assert [pad_rows(m) for m in (128, 78, 12, 7, 1, 37, 77, 197)] == [1, 1, 1, 1, 1, 4, 4, 4]


@pytest.mark.parametrize("m,k,n,wtype,per_channel,bias", [
    (1, 768, 768, "int8", False, True),      # M = 1 (one row tile)
    (7, 65, 100, "uint8", False, True),      # odd K, N not whole panels, u8 weights + zp
    (128, 768, 100, "int8", True, False),    # per-column weight zero points, no bias
    (128, 65, 768, "uint8", True, True),     # u8 per-column zero points, odd K
    (37, 96, 40, "int8", False, True),       # prime M: rows padded to 40 (pad_rows)
])
def test_dynamic_quantized_matmul_matches_ort(m, k, n, wtype, per_channel, bias):
    rng = np.random.default_rng(0)
    # s8 weights in [-64, 64): onnxruntime's AVX2 u8 x s8 kernel (vpmaddubsw) saturates
    # pair sums past 32767, so full-range s8 weights are checked against exact arithmetic
    # below instead
    lo, hi = (-64, 64) if wtype == "int8" else (0, 256)
    w = rng.integers(lo, hi, (k, n)).astype(NP[wtype])
    zlo, zhi = (-3, 4) if wtype == "int8" else (100, 150)
    wz = (rng.integers(zlo, zhi, n) if per_channel else np.array(rng.integers(zlo, zhi)))
    wz = wz.astype(NP[wtype])
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    model = dynamic_model(m, k, n, w, wz, b)
    x = rng.standard_normal((m, k)).astype(np.float32) + 0.3   # nonzero activation zp
    cm = compiler.compile(model, target="host")
    rep = _pass(cm)
    wfull = w.astype(np.int64) - wz.astype(np.int64)
    quads = host_dot() is not None and wfull.min() >= -128 and wfull.max() <= 127
    rewrites = {k: v for k, v in rep["rewrites"].items() if k != SATURATING}
    assert rewrites == {RULE_U8 if quads else RULE: 1} and rep["nodes"] == ["mmi"]
    # MatMulInteger, its dequantisation and the bias are one kernel of the int8 rule
    rows = [r for r in cm.report["kernel_table"] if "mmi" in r["nodes"]]
    assert len(rows) == 1 and rows[0]["rule"] == "cpu.matmul_int8"
    assert {"mmi", "cast", "deq"} <= set(rows[0]["nodes"])
    got = cm.session().run(None, {"x": x})[0]
    ref = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("a_dtype,w_dtype", [("uint8", "int8"), ("uint8", "uint8"),
                                             ("int8", "int8")])
def test_integer_output_exact_full_range(a_dtype, w_dtype):
    rng = np.random.default_rng(1)
    m, k, n = 9, 130, 48
    info_a, info_w = np.iinfo(NP[a_dtype]), np.iinfo(NP[w_dtype])
    a = rng.integers(info_a.min, info_a.max + 1, (m, k)).astype(NP[a_dtype])
    w = rng.integers(info_w.min, info_w.max + 1, (k, n)).astype(NP[w_dtype])
    az = np.array(info_a.max // 3, NP[a_dtype])
    wz = np.array(info_w.min + 5, NP[w_dtype])
    model = integer_model(m, k, n, a_dtype, w, wz)
    cm = compiler.compile(model, target="host")
    assert _pass(cm)["rewrites"] == {RULE: 1}
    got = cm.session().run(None, {"a": a, "az": az})[0]
    exact = (a.astype(np.int64) - int(az)) @ (w.astype(np.int64) - int(wz))
    np.testing.assert_array_equal(got, exact)
    if (a_dtype, w_dtype) != ("uint8", "int8"):  # onnxruntime is exact off its u8s8 path
        np.testing.assert_array_equal(got, ort_run(model, {"a": a, "az": az})[0])


def test_non_constant_weight_is_left_to_the_generic_path():
    rng = np.random.default_rng(2)
    w = rng.integers(-128, 128, (32, 16)).astype(np.int8)
    model = integer_model(4, 32, 16, "uint8", w, np.array(0, np.int8), b_input=True)
    cm = compiler.compile(model, target="host")
    assert _pass(cm)["changed"] is False
    assert "cpu.matmul_int8" not in cm.report["schedules"]
    a = rng.integers(0, 256, (4, 32)).astype(np.uint8)
    feeds = {"a": a, "az": np.array(3, np.uint8), "w": w}
    np.testing.assert_array_equal(cm.session().run(None, feeds)[0],
                                  (a.astype(np.int64) - 3) @ w.astype(np.int64))


def test_per_row_activation_zero_point_is_not_packed():
    # a_zero_point [M] (one per row) is not the scalar the packed kernel subtracts
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (32, 16)).astype(np.int8)
    model = integer_model(4, 32, 16, "uint8", w, np.array(0, np.int8), az_shape=(4,))
    cm = compiler.compile(model, target="host")
    assert _pass(cm)["changed"] is False
    a = rng.integers(0, 256, (4, 32)).astype(np.uint8)
    az = np.array([1, 2, 3, 4], np.uint8)
    np.testing.assert_array_equal(cm.session().run(None, {"a": a, "az": az})[0],
                                  (a.astype(np.int64) - az[:, None]) @ w.astype(np.int64))


def saturating_matmul(a, w):
    """``a @ w`` as vpmaddubsw computes it: each pair of consecutive k (from k = 0) summed
    in int16 with saturation, the pair sums added in int32 (K padded to fours with 0)."""
    a, w = a.astype(np.int64), w.astype(np.int64)
    k = a.shape[1]
    a, w = np.pad(a, ((0, 0), (0, -k % 2))), np.pad(w, ((0, -k % 2), (0, 0)))
    pairs = a[:, 0::2, None] * w[None, 0::2] + a[:, 1::2, None] * w[None, 1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=1)


def test_pack_quads_layout_and_padding():
    w = np.arange(6 * 20).reshape(6, 20) % 200 - 100
    q = pack_quads(w, 16)
    assert q.shape == (2, 2, 16, 4) and q.dtype == np.int8 and q.flags.c_contiguous
    assert q[1, 1, 3, 1] == w[5, 19] and q[0, 0, 2, 3] == w[3, 2]
    assert not q[:, 1, :, 2:].any() and not q[1, :, 4:].any()   # K to fours, N to panels


@pytest.mark.parametrize("per_channel,bias,lo,hi", [
    (False, True, -64, 64),       # per-tensor, bias, saturation-proof (|w0| + |w1| <= 128)
    (True, False, -64, 64),       # per-column weight scales, no bias
    (False, False, -128, 128),    # full range: pair sums can pass int16, as in onnxruntime
])
def test_u8s8_dynamic_matches_ort(per_channel, bias, lo, hi):
    dot = need_dot()
    m, k, n = 24, 200, 72
    rng = np.random.default_rng(4)
    w = rng.integers(lo, hi, (k, n)).astype(np.int8)
    wz = np.zeros(n if per_channel else (), np.int8)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    model = dynamic_model(m, k, n, w, wz, b)
    cm = compiler.compile(model, target="host")
    rep = _pass(cm)
    assert rep["rewrites"].get(RULE_U8) == 1 and RULE not in rep["rewrites"]
    saturating = hi > 64 and dot in targets.INT8_DOT_SATURATES
    assert rep["rewrites"].get(SATURATING, 0) == int(saturating)
    # mostly large u8 values (pair sums past int16), a nonzero activation zero point
    x = (rng.standard_normal((m, k)) * 2 + 4).astype(np.float32)
    got = cm.session().run(None, {"x": x})[0]
    ref = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())


def test_u8s8_integer_output_saturates_as_vpmaddubsw_and_exact_option_does_not():
    dot = need_dot()
    rng = np.random.default_rng(6)
    m, k, n = 9, 130, 48
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    az = np.array(85, np.uint8)
    model = integer_model(m, k, n, "uint8", w, np.array(0, np.int8))
    exact = (a.astype(np.int64) - 85) @ w.astype(np.int64)
    got = compiler.compile(model, target="host").session().run(None, {"a": a, "az": az})[0]
    if dot in targets.INT8_DOT_SATURATES:
        sat = saturating_matmul(a, w) - 85 * w.astype(np.int64).sum(axis=0)
        assert np.abs(sat - exact).max() > 0   # the data does saturate
        np.testing.assert_array_equal(got, sat)
        np.testing.assert_array_equal(got, ort_run(model, {"a": a, "az": az})[0])
    else:  # vpdpbusd sums the four products in int32
        np.testing.assert_array_equal(got, exact)
    # negative: exact keeps the i16 pair path (vpmaddwd) on a saturating target
    cm = compiler.compile(model, target="host", pass_config={"pack_int_matmul": {"exact": True}})
    if dot in targets.INT8_DOT_SATURATES:
        assert _pass(cm)["rewrites"] == {RULE: 1}
    np.testing.assert_array_equal(cm.session().run(None, {"a": a, "az": az})[0], exact)


@pytest.mark.parametrize("m,k,n", [(9, 130, 48), (4, 32, 16)])
def test_s8_activations_shift_into_the_u8_dot(m, k, n):
    """s8 activations (quantize_static's default) take the form by fours too, their sign bit
    flipped into the dot's u8 (``a + 128``) and the zero point corrected by ``(za + 128) *
    colsum``: the exact product on VNNI hosts, vpmaddubsw's saturation of the shifted
    values elsewhere (as onnxruntime's x86 kernels, which flip the sign bit the same way)."""
    dot = need_dot()
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    az = np.array(-37, np.int8)
    model = integer_model(m, k, n, "int8", w, np.array(0, np.int8))
    cm = compiler.compile(model, target="host")
    assert _pass(cm)["rewrites"].get(RULE_U8) == 1
    got = cm.session().run(None, {"a": a, "az": az})[0]
    exact = (a.astype(np.int64) + 37) @ w.astype(np.int64)
    if dot in targets.INT8_DOT_SATURATES:
        shifted = a.astype(np.int64) + 128
        want = saturating_matmul(shifted, w) - (128 - 37) * w.astype(np.int64).sum(axis=0)
    else:
        want = exact
        np.testing.assert_array_equal(got, ort_run(model, {"a": a, "az": az})[0])
    np.testing.assert_array_equal(got, want)


def test_wide_weights_stay_on_pairs():
    # u8 weights minus a zero point (outside s8) are not packed by fours, whatever the host
    rng = np.random.default_rng(7)
    wu = rng.integers(0, 256, (32, 16)).astype(np.uint8)
    cm = compiler.compile(integer_model(4, 32, 16, "uint8", wu, np.array(3, np.uint8)),
                          target="host")
    assert _pass(cm)["rewrites"] == {RULE: 1}


def test_panel_set_from_the_targets_registers():
    """Integer panels four int32 vectors wide where 32 registers hold a 6 x 4 tile
    (AVX-512: 64 columns), two where 16 do (AVX2: 16); the kernel reads the panels; the
    user's panel wins."""
    from compiler.driver import _front_only, _int8_dot

    panels = {name: _int8_dot(targets.resolve(name), None)["pack_int_matmul"]["panel"]
              for name in ("x86-avx2", "x86-avx512")}
    assert panels == {"x86-avx2": 16, "x86-avx512": 64}
    mine = _int8_dot(targets.resolve("x86-avx512"), {"pack_int_matmul": {"panel": 32}})
    assert mine["pack_int_matmul"]["panel"] == 32
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.integers(-60, 60, (96, 128)).astype(np.int8), "w")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TP.UINT8, [20, 96])],
        [helper.make_tensor_value_info("y", TP.INT32, [20, 128])], [w]),
        opset_imports=[helper.make_opsetid("", 17)])
    for name, shape in (("x86-avx512", (2, 24, 64, 4)), ("x86-avx2", (8, 24, 16, 4))):
        _, _, graph = _front_only(model, name)
        weights = [tuple(int(d) for d in p.shape) for f in graph.prim_funcs.values()
                   for p in f.params if str(p.dtype) == "int8"]
        assert shape in weights, (name, weights)


@pytest.mark.parametrize("wtype", ["int8", "uint8"])
def test_symbolic_rows_of_a_dynamic_export(wtype):
    """quantize_dynamic of a transformer exported with dynamic (batch, seq): M = batch x
    seq tokens is symbolic.  The integer matmul packs (M padded to whole multiples of
    SYMBOLIC_ROWS, reads clamped) and takes cpu.matmul_int8 (before: dlight / the generic
    fallback, MiniLM 66x onnxruntime's time); one artifact against onnxruntime at every
    row count, odd ones, one and the range's edge included."""
    from passes.pack_int_matmul import SYMBOLIC_ROWS

    rng = np.random.default_rng(4)
    k, n = 96, 80
    lo, hi = (-64, 64) if wtype == "int8" else (0, 256)
    w = rng.integers(lo, hi, (k, n)).astype(NP[wtype])
    wz = np.array(0 if wtype == "int8" else 128).astype(NP[wtype])
    model = dynamic_model("m", k, n, w, wz, rng.standard_normal(n).astype(np.float32))
    cm = compiler.compile(model, target="host", dims={"m": (1, 50, 16)})
    rows = [r for r in cm.report["kernel_table"] if "mmi" in r["nodes"]]
    assert len(rows) == 1 and rows[0]["rule"] == "cpu.matmul_int8", rows
    assert SYMBOLIC_ROWS > 1 and _pass(cm)["nodes"] == ["mmi"]
    sess = cm.session()
    for m in (1, 5, 16, 37, 50):
        x = rng.standard_normal((m, k)).astype(np.float32) + 0.3
        ref = ort_run(model, {"x": x})[0]
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5,
                                   atol=1e-4 * np.abs(ref).max())
