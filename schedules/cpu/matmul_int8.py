"""Integer matmul with the weight pre-packed [N/nr, K/2, nr, 2] (passes/pack_int_matmul.py),
or [N/nr, K/4, nr, 4] for 8-bit activations by s8 weights (``quad_intrin``: the activation
stays 8-bit, four k per i32 lane, ``vpdpbusd`` on AVX512-VNNI / AVX-VNNI, ``vpmaddubsw`` +
``vpmaddwd`` by ones + ``vpaddd`` on AVX2 / AVX-512BW, whose pair sums saturate to int16 as
onnxruntime's do, ``usdot`` (i8mm) / ``sdot`` (dotprod) on aarch64; passes/int8_quads.py
decides which, and shifts an activation of the other 8-bit type into the dot's).  The i16
pairs:

``C[b.., i, j] += int32(A16[b.., i, 2 ko + ki]) * int32(Wp[j // nr, ko, j % nr, ki])``, A16
the activation widened to int16 minus its zero point (a stage of the same kernel, kept as
its own parallel vectorised loop), Wp int8 / int16, C int32.  Register tile ``mr`` rows x
``nr`` columns of i32 accumulators; on x86 the inner step over (``lanes`` columns, 2 k) is
tensorized as one ``vpmaddwd`` (AVX2 ymm / AVX-512BW zmm): a row's i16 pair broadcast
straight from memory (one ``vpbroadcastd``), ``lanes`` x 2 weights sign-extended to i16,
products summed pair-wise into i32 lanes: exact for every u8 / s8 combination (no
``vpmaddubsw`` saturation; widening A inside the step cost 3 more instructions per row).
On AVX512-VNNI targets LLVM fuses the step's ``vpmaddwd`` + ``vpaddd`` into ``vpdpwssd``
(checked in the assembly; ``vpdpbusd``, four u8 x s8 products per lane, would need
[K/4, 16, 4] panels and u8 activations: not done).  LLVM
does not form ``vpmaddwd`` from the plain i32 loop (it emits ``vpmulld``, 1/2 the rate), so
the step is written with the LLVM intrinsic.  Other targets get the same tile as plain
vectorised i32 code.  The epilogue (zero-point column sums, and what FuseOps fused after it:
cast, scale, bias) is inlined into the tile's write-back.  Parallel over (batch, N panels,
M tiles).
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..base import MatchingCPURule
from . import common

_LLVM = {"avx2": (8, "llvm.x86.avx2.pmadd.wd"), "avx512": (16, "llvm.x86.avx512.pmaddw.d.512")}
# int8_dot kind -> (i32 lanes, byte dot step, i16 pair sum or None): vpmaddubsw then vpmaddwd
# by ones (onnxruntime's AVX2 / AVX-512BW step, pair sums saturate to int16), or vpdpbusd
# (VNNI: the four products summed in int32, accumulated in place); aarch64's usdot (u8 x s8,
# i8mm) and sdot (s8 x s8, dotprod) likewise
_QUAD = {"avx2": (8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
         "avx512": (16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
         "avxvnni": (8, "llvm.x86.avx512.vpdpbusd.256", None),
         "avx512vnni": (16, "llvm.x86.avx512.vpdpbusd.512", None),
         "neoni8mm": (4, "llvm.aarch64.neon.usdot.v4i32.v16i8", None),
         "neondot": (4, "llvm.aarch64.neon.sdot.v4i32.v16i8", None)}
_REGISTERED: set = set()


def dot_lanes(target, width: int):
    """(vpmaddwd width ``kind`` or None, int32 lanes) for an int8 rule whose vector dimension
    is ``width`` wide on ``target``: the target's int16 dot when ``width`` is whole vectors
    of it, else plain fp32-width vectors (None when not even those divide ``width``)."""
    return _fitting(common.targets.cpu_facts(target)["int16_dot"], width, _LLVM,
                    common.lanes_fp32(target))


def _dot_desc(lanes: int, depth: int, a_dtype: str, b_dtype: str):
    """The description both dot intrinsics share: ``C[0:lanes] += sum_{k < depth}
    int32(A[k]) * int32(B[0:lanes, k])``."""
    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((depth,), a_dtype, offset_factor=1),
             B: T.Buffer((lanes, depth), b_dtype, offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:depth], B[0:lanes, 0:depth])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, depth):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")
    return desc


def dot_intrin(kind: str, a_dtype: str, b_dtype: str) -> tuple:
    """(name, lanes) of the tensor intrinsic ``C[0:L] += sum_k int32(A[k]) * int32(B[0:L, k])``
    (k < 2) as one ``vpmaddwd`` of width ``kind`` ("avx2", "avx512"), registered once."""
    lanes, llvm = _LLVM[kind]
    name = f"onnxc_dot_{lanes}x2_{a_dtype}_{b_dtype}_{kind}"
    if name in _REGISTERED:
        return name, lanes
    a2, b2l = f"{a_dtype}x2", f"{b_dtype}x{2 * lanes}"
    i16, i32 = f"int16x{2 * lanes}", f"int32x{lanes}"

    desc = _dot_desc(lanes, 2, a_dtype, b_dtype)

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((2,), a_dtype, offset_factor=1),
             B: T.Buffer((lanes, 2), b_dtype, offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            pair = T.reinterpret(T.cast(A.vload([0], a2), "int16x2"), dtype="int32")
            a16 = T.reinterpret(T.broadcast(pair, lanes), dtype=i16)
            b16 = T.cast(B.vload([0, 0], b2l), i16)
            C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], i32) + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm), a16, b16, dtype=i32)

    TensorIntrin.register(name, desc, impl)
    _REGISTERED.add(name)
    return name, lanes


def quad_lanes(target, width: int, a_dtype: str):
    """(byte dot kind or None, int32 lanes) for a rule by fours of ``a_dtype`` activations
    whose vector dimension is ``width`` wide on ``target``: the target's ``int8_dot`` when
    it takes ``a_dtype`` and ``width`` is whole vectors of it, else plain fp32-width vectors
    (None when not even those divide ``width``)."""
    kind = common.targets.cpu_facts(target)["int8_dot"]
    if kind is not None and common.targets.INT8_DOT_ACTIVATION[kind] != a_dtype:
        kind = None  # not the packing pass's form for this target: plain vectors
    return _fitting(kind, width, _QUAD, common.lanes_fp32(target))


# a zmm kind's ymm form, for a vector dimension of half a zmm (the 8-channel blocks of
# convert_layout's half blocks on AVX-512): every AVX-512 target has AVX2, and its
# AVX512-VNNI the ymm ``vpdpbusd`` (AVX512-VL)
_HALF = {"avx512": "avx2", "avx512vnni": "avxvnni"}


def _fitting(kind, width: int, table: dict, fp32_lanes: int):
    """(kind or None, i32 lanes) for a vector dimension ``width`` wide: ``kind`` when
    ``width`` is whole vectors of it, else its half-width form (AVX-512 -> 256-bit) when
    that fits, else plain vectors of the fp32 width or half of it; None when none divides
    ``width``."""
    for k in (kind, _HALF.get(kind)):
        if k is not None and width % table[k][0] == 0:
            return k, table[k][0]
    for lanes in (fp32_lanes, fp32_lanes // 2):
        if lanes >= 4 and width % lanes == 0:
            return None, lanes
    return None


def quad_intrin(kind: str) -> tuple:
    """(name, lanes) of the tensor intrinsic ``C[0:L] += sum_k int32(A[k]) * int32(B[0:L,
    k])`` (k < 4, A of the kind's activation type, ``targets.INT8_DOT_ACTIVATION``, B int8)
    as one ``vpdpbusd`` (VNNI kinds), ``usdot`` / ``sdot`` (aarch64), or ``vpmaddubsw`` +
    ``vpmaddwd`` by ones + ``vpaddd``, whose first step saturates each pair sum ``A[2p]
    B[i, 2p] + A[2p+1] B[i, 2p+1]`` to int16 (as onnxruntime's AVX2 kernel); registered
    once.  The four bytes of A are broadcast as one i32 straight from memory."""
    lanes, step, pairs = _QUAD[kind]
    a_dtype = common.targets.INT8_DOT_ACTIVATION[kind]
    name = f"onnxc_dot_{lanes}x4_{a_dtype}_int8_{kind}"
    if name in _REGISTERED:
        return name, lanes
    u8, s8, i16, i32 = (f"{a_dtype}x{4 * lanes}", f"int8x{4 * lanes}", f"int16x{2 * lanes}",
                        f"int32x{lanes}")
    a4 = f"{a_dtype}x4"

    desc = _dot_desc(lanes, 4, a_dtype, "int8")

    if pairs is None:
        @T.prim_func(s_tir=True)
        def impl(A: T.Buffer((4,), a_dtype, offset_factor=1),
                 B: T.Buffer((lanes, 4), "int8", offset_factor=1),
                 C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
                T.writes(C[0:lanes])
                a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], a4),
                                                            dtype="int32"), lanes), dtype=u8)
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(step), C.vload([0], i32), a,
                    B.vload([0, 0], s8), dtype=i32)
    else:
        @T.prim_func(s_tir=True)
        def impl(A: T.Buffer((4,), "uint8", offset_factor=1),
                 B: T.Buffer((lanes, 4), "int8", offset_factor=1),
                 C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
                T.writes(C[0:lanes])
                a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"),
                                                            dtype="int32"), lanes), dtype=u8)
                t = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(step), a,
                                            B.vload([0, 0], s8), dtype=i16)
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], i32) + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(pairs), t, T.broadcast(T.int16(1), 2 * lanes),
                    dtype=i32)

    TensorIntrin.register(name, desc, impl)
    _REGISTERED.add(name)
    return name, lanes


def match_quad_matmul(sch):
    """(block rv, nr, A dtype, "int8") of the only reduction block when it reduces over (ko,
    ki) into an int32 buffer, reading a uint8 / int8 ``A[.., i, ko * 4 + ki]`` and an int8
    ``Wp[j // nr, ko, j % nr, ki]`` (passes/pack_int_matmul.py's form by fours); else None."""
    return match_pair_matmul(sch, "int32", ("uint8", "int8"), ("int8",), group=4)


def match_int_matmul(sch):
    """(block rv, nr, A dtype, Wp dtype) of the only reduction block when it reduces over
    (ko, ki) (``S..SRR``) into an int32 buffer indexed by its spatial iters, reading an
    int16 ``A[.., i, ko * 2 + ki]`` and ``Wp[j // nr, ko, j % nr, ki]``; else None."""
    return match_pair_matmul(sch, "int32", ("int16",), ("int8", "int16", "uint8"))


def match_pair_matmul(sch, out_dtype: str, a_dtypes, w_dtypes, group: int = 2):
    """(block rv, nr, A dtype, Wp dtype) of the only reduction block when it reduces over
    (ko, ki) (``S..SRR``) into an ``out_dtype`` buffer indexed by its spatial iters,
    reading ``A[.., i, ko * group + ki]`` (a dtype in ``a_dtypes``) and ``Wp[j // nr, ko, j
    % nr, ki]`` (in ``w_dtypes``, ``ki`` < ``group``); else None.  cpu.matmul_bf16 matches
    with it too."""
    found = common.only_reduction(sch)
    if found is None:
        return None
    rv, kinds = found
    if len(kinds) < 4 or not kinds.endswith("RR") or "R" in kinds[:-2]:
        return None
    block = sch.get(rv)
    ivs = [iv.var for iv in block.iter_vars]
    *_, i, j, ko, ki = ivs
    if len(block.writes) != 1:
        return None
    out = block.writes[0]
    if out.source.dtype != out_dtype or not common.same_vars(common.region_vars(out), ivs[:-2]):
        return None
    nr = a_dtype = w_dtype = None
    for r in block.reads:
        if r.source.same_as(out.source):
            continue
        idx, shape = common.region_vars(r), r.source.shape
        if (len(idx) == 4 and isinstance(shape[2], tirx.IntImm) and int(shape[3]) == group
                and _is(idx[0], tirx.FloorDiv, j, shape[2]) and idx[1].same_as(ko)
                and _is(idx[2], tirx.FloorMod, j, shape[2]) and idx[3].same_as(ki)):
            nr, w_dtype = int(shape[2]), str(r.source.dtype)
        elif len(idx) >= 2 and idx[-2].same_as(i) and str(r.source.dtype) in a_dtypes:
            a_dtype = str(r.source.dtype)
    if nr is None or a_dtype is None or w_dtype not in w_dtypes:
        return None
    return rv, nr, a_dtype, w_dtype


def _is(e, op, var, const) -> bool:
    return (isinstance(e, op) and e.a.same_as(var) and isinstance(e.b, tirx.IntImm)
            and int(e.b) == int(const))


class MatmulInt8(MatchingCPURule):
    """u8 / s8 activations x packed int8 / int16 weights -> int32 (+ fused f32 epilogue)."""

    name = "cpu.matmul_int8"

    def match(self, sch):
        m = match_int_matmul(sch)
        return (*m, 2) if m is not None else _with(match_quad_matmul(sch), 4)

    def schedule(self, sch, m, target):
        mm, nr, a_dtype, w_dtype, group = m
        if group == 4:  # bytes by fours (vpdpbusd / vpmaddubsw / usdot / sdot)
            chosen = quad_lanes(target, nr, a_dtype)
            if chosen is None:
                return None
            kind, lanes = chosen
            intrin = quad_intrin(kind)[0] if kind is not None else None
            return schedule_pairs(sch, mm, nr, "_a8", intrin, lanes, target)
        chosen = dot_lanes(target, nr)
        if chosen is None:
            return None
        kind, lanes = chosen
        intrin = dot_intrin(kind, a_dtype, w_dtype)[0] if kind is not None else None
        return schedule_pairs(sch, mm, nr, "_a16", intrin, lanes, target)


def _with(m, group):
    return (*m, group) if m is not None else None


def schedule_pairs(sch, mm, nr: int, stage: str, intrin, lanes: int, target):
    """The register tile of a matmul over k pairs (``S..SRR``: packed ``[N/nr, K/2, nr, 2]``
    weights), shared with cpu.matmul_bf16: ``mr`` rows x ``nr`` columns, the (``lanes``
    columns, k pair) step tensorized as ``intrin`` (None: the k pair outside the lanes, plain
    vectors), the epilogue in the write-back, parallel over (batch, panels, row tiles).  The
    activation's producer block whose name ends with ``stage`` stays a stage of its own
    (inlined, the tensorized step would no longer read a plain buffer).  None when the
    loops do not fit."""
    ncores = common.targets.cpu_facts(target)["cores"]
    act = [b for b in sch.get_producers(mm) if sch.get(b).name_hint.endswith(stage)]
    if len(act) != 1:
        return None
    act = sch.get(act[0]).name_hint
    pads, after, tail = common.inline_around(sch, mm, keep_pads=False, keep=(act,))
    loops = sch.get_loops(mm)
    *bat, i, j, ko, ki = loops
    ext = [common.const_extent(sch, lp) for lp in loops]
    if any(e is None for e in ext[-3:]) or ext[-3] % nr:
        return None
    # a symbolic M (and batch dims): only as whole multiples of the pass's row padding
    rows = ext[-4] if ext[-4] is not None else common.row_multiple(sch.get(i).extent)
    if rows is None:
        return None
    nv = nr // lanes
    it = common.reg_rows(rows, nv, common.acc_budget(target, "matmul"))
    io, ii = sch.split(i, [None, it])
    jo, jv, jl = sch.split(j, [None, nv, lanes])
    # panels outer (a K x nr panel stays in L2 across the row tiles), as cpu.matmul_packed
    # tensorized: (lanes, k pair) is the intrinsic's block; else the k pair outside the
    # lanes, each step a broadcast times a vector
    inner = (jl, ki) if intrin is not None else (ki, jl)
    sch.reorder(*bat, jo, io, ko, ii, jv, *inner)
    wb, rest = common.write_back_at(sch, mm, io, tail, pads, after)
    common.parallel(sch, [*bat, jo, io], ncores)
    if intrin is None:  # before decompose_reduction, as cpu.matmul_packed
        sch.unroll(ki)
        sch.vectorize(jl)
    init = sch.decompose_reduction(mm, ko)
    if intrin is not None:
        sch.tensorize(jl, intrin)
    sch.unroll(jv)
    sch.unroll(ii)
    _vectorize_inner(sch, init, lanes)
    _vectorize_inner(sch, wb, lanes)
    for p in rest:
        common.schedule_elementwise(sch, p, lanes, ncores)
    return sch


def _vectorize_inner(sch, blk, lanes):
    """The write-back / init tile's column loop: whole vectors, unrolled; a tile cut at N
    (the last panel's zero columns dropped) stays scalar."""
    loop = sch.get_loops(blk)[-1]
    n = common.const_extent(sch, loop)
    if n is None or n % lanes:
        return
    if n > lanes:
        vo, loop = sch.split(loop, [None, lanes])
        sch.unroll(vo)
    sch.vectorize(loop)
