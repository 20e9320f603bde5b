"""int8_quads: when the packing passes take the layout by fours (target dot, activation
dtype, weight range, ``exact``), the shift of an activation into the dot's 8-bit type, the
per-kernel saturation test, the target's dot per CPU (targets.int8_dot) and the driver
setting the passes' ``u8_dot`` from the target."""

from __future__ import annotations

import numpy as np
import pytest

import targets
from compiler.driver import _int8_dot
from passes import int8_quads

W = np.array([[60, -64], [3, 127]])


@pytest.mark.parametrize("options,a_dtype,w,want", [
    ({"u8_dot": "avx2", "exact": False}, "uint8", W, True),
    ({"u8_dot": "", "exact": False}, "uint8", W, False),           # no dot on the target
    ({"u8_dot": "avx2", "exact": False}, "int8", W, True),         # s8: shifted to u8
    ({"u8_dot": "neondot", "exact": True}, "uint8", W, True),      # sdot is exact
    ({"u8_dot": "avx2", "exact": False}, "int16", W, False),       # not 8-bit
    ({"u8_dot": "avx2", "exact": False}, "uint8", W + 1, False),   # 128: not s8
    ({"u8_dot": "avx2", "exact": True}, "uint8", W, False),        # exact: vpmaddwd
    ({"u8_dot": "avx512", "exact": True}, "uint8", W, False),
    ({"u8_dot": "avx512vnni", "exact": True}, "uint8", W, True),   # vpdpbusd is exact
    ({"u8_dot": "avxvnni", "exact": True}, "uint8", W, True),
])
def test_use_quads(options, a_dtype, w, want):
    assert int8_quads.use_quads(options, a_dtype, w) is want


@pytest.mark.parametrize("kind,a_dtype,want", [
    ("avx512vnni", "uint8", (0, "uint8")), ("avx512vnni", "int8", (-128, "uint8")),
    ("avx2", "int8", (-128, "uint8")), ("neoni8mm", "int8", (-128, "uint8")),
    ("neondot", "uint8", (128, "int8")), ("neondot", "int8", (0, "int8")),
])
def test_shift_into_the_dots_type(kind, a_dtype, want):
    assert int8_quads.shift({"u8_dot": kind}, a_dtype) == want


@pytest.mark.parametrize("dtype,by", [("uint8", 128), ("int8", -128)])
def test_shifted_flips_the_sign_bit(dtype, by):
    """The TE expression of ``a - by`` in the other 8-bit type, evaluated on every value."""
    import tvm
    from tvm import te

    a = te.placeholder((256,), dtype, "a")
    other = "int8" if dtype == "uint8" else "uint8"
    out = te.compute((256,), lambda i: int8_quads.shifted(a[i], by), "s")
    f = tvm.compile(te.create_prim_func([a, out]), target="llvm")
    x = np.arange(256).astype(np.uint8).view(dtype)
    y = tvm.runtime.empty((256,), other)
    f(tvm.runtime.tensor(x), y)
    np.testing.assert_array_equal(y.numpy().astype(np.int32), x.astype(np.int32) - by)


def test_can_saturate_per_pair_of_consecutive_k():
    avx2, vnni = {"u8_dot": "avx2"}, {"u8_dot": "avx512vnni"}
    safe = np.array([[[64, -64, 127, 1]]], np.int8)              # pairs sum to 128, 128
    assert not int8_quads.can_saturate(avx2, safe)
    # 100 and 29 are in different pairs: still safe; in one pair they are not
    assert not int8_quads.can_saturate(avx2, np.array([[100, 1, 29, 0]], np.int8))
    assert int8_quads.can_saturate(avx2, np.array([[100, 29, 0, 0]], np.int8))
    assert int8_quads.can_saturate(avx2, np.array([[0, 0, -128, -1]], np.int8))
    assert not int8_quads.can_saturate(vnni, np.array([[-128, -128, 127, 127]], np.int8))


@pytest.mark.parametrize("cpu,kind", [("znver3", "avx2"), ("skylake-avx512", "avx512"),
                                      ("alderlake", "avxvnni"), ("znver5", "avx512vnni"),
                                      ("sapphirerapids", "avx512vnni"), ("x86-64-v2", None)])
def test_target_dot_and_driver_option(cpu, kind):
    info = targets.resolve({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu})
    assert targets.int8_dot(info.arch, info.features) == kind
    config = _int8_dot(info, {"pack_int_conv": {"exact": True}})
    assert config["pack_int_matmul"]["u8_dot"] == config["pack_int_conv"]["u8_dot"] == (kind or "")
    assert config["pack_int_conv"]["exact"] is True      # the user's options are kept
    # a user's u8_dot wins over the target's
    assert _int8_dot(info, {"pack_int_matmul": {"u8_dot": ""}})["pack_int_matmul"]["u8_dot"] == ""


@pytest.mark.parametrize("preset,kind", [("arm", None), ("arm-sve", None),
                                         ("arm-dotprod", "neondot"), ("arm-i8mm", "neoni8mm")])
def test_arm_dots(preset, kind):
    info = targets.resolve(preset)
    assert targets.int8_dot(info.arch, info.features) == kind
    assert _int8_dot(info, {})["pack_int_matmul"]["u8_dot"] == (kind or "")
