"""Helpers shared by the CPU rules (x86 and aarch64): target facts, loop extents, tile choices."""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym.pattern import detect_linear_equation

import targets


def lanes_fp32(target) -> int:
    """fp32 lanes of the widest vector unit of ``target`` (16 AVX-512, 8 AVX2, else 4)."""
    return targets.cpu_facts(target)["lanes"]


def vector_registers(target) -> int:
    """Vector registers of ``target`` (32 AVX-512 / aarch64, 16 AVX2 / SSE)."""
    return targets.cpu_facts(target)["vector_registers"]


def cores(target) -> int:
    return targets.cpu_facts(target)["cores"]


def l2_bytes(target) -> int:
    """Per-core L2 bytes of ``target`` (the host's when it is the host CPU, else 1 MB)."""
    return targets.l2_bytes(target)


def const_extent(sch, loop):
    """Extent of ``loop`` as int, or None when symbolic."""
    e = sch.get(loop).extent
    return e.value if isinstance(e, tirx.IntImm) else None


def elements(buf) -> int | None:
    """Elements of a buffer (None when its shape is symbolic)."""
    try:
        return math.prod(int(d) for d in buf.shape)
    except TypeError:
        return None


def divisors(n: int):
    return [d for d in range(1, n + 1) if n % d == 0]


# Tasks per core a conv1d's parallel loop should offer (the channel blocks times chunks of
# output positions)
TASKS_PER_CORE = 2


def position_chunks(blocks: int, tiles: int, ncores: int) -> int:
    """Chunks of a conv1d's output positions (a divisor of its ``tiles`` pixel tiles) that
    give ``blocks`` channel blocks ``TASKS_PER_CORE`` to twice that many tasks per core, or
    0 when the blocks alone do (or one core runs it, or no divisor fits).  With the blocks
    alone, the parallel padding stage left half the padded input in the other core's cache
    for every block's task: WaveNet's 64 -> 64 dilated conv (2 blocks, 4000 samples) ran
    0.44 ms on one thread and 0.58 on two (onnxruntime 0.23; with the chunks 0.22).  Used
    by conv2d_packed and conv_transpose's 1-D kernels."""
    want = TASKS_PER_CORE * ncores
    if ncores <= 1 or blocks >= want:
        return 0
    # (at most twice the tasks wanted: a prime number of tiles keeps one chunk, not one
    # task per tile)
    fits = [d for d in divisors(tiles) if want <= blocks * d <= 2 * want]
    return min(fits) if fits else 0


def vector_tile(n: int, lanes: int, vectors: int = 2) -> int:
    """A divisor of ``n`` to vectorise: ``vectors`` (or fewer) full vectors if that divides
    ``n``, else the largest divisor of at most one vector.  (Odd lengths above one vector,
    e.g. 28 or 56 lanes, make LLVM split and spill: 5x slower than 14 lanes measured.)"""
    for k in range(vectors, 0, -1):
        if n % (k * lanes) == 0:
            return k * lanes
    return max(d for d in divisors(n) if d <= lanes)


def reg_rows(n: int, vectors_per_row: int, budget: int = 24, cap: int = 16) -> int:
    """Largest divisor of ``n`` (<= cap) whose rows x vectors fit ``budget`` registers."""
    best = 1
    for d in divisors(n):
        if d <= cap and d * vectors_per_row <= budget:
            best = d
    return best


# TIR's ``if_then_else`` (a select between loads: concats, pads, rotate-half)
SELECT = tvm.ir.Op.get("prim.if_then_else")


def uses_var(expr, var) -> bool:
    """``expr`` reads the variable ``var``."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def stride(expr, var) -> int | None:
    """The constant coefficient of ``var`` in ``expr`` (``x * s + r``), else None."""
    coef = detect_linear_equation(expr, [var])
    if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm):
        return None
    return int(coef[0])


def unit_stride(expr, var) -> bool:
    """``expr`` is ``var`` + terms free of ``var``, or free of ``var`` altogether: lanes of
    ``var`` read consecutive elements (strided reads, ``2 x + r``, would be gathers: a
    stride-2 pool ran 1.8x slower vectorised than the fallback's scalar loop)."""
    return not uses_var(expr, var) or stride(expr, var) == 1


def input_producer(sch, main, blocks, rank: int):
    """The block among ``blocks`` writing ``main``'s input (its read of rank ``rank``),
    else None."""
    block = sch.get(main)
    out = block.writes[0].source
    buf = next((r.source for r in block.reads
                if len(r.source.shape) == rank and not r.source.same_as(out)), None)
    for p in blocks:
        if buf is not None and any(w.source.same_as(buf) for w in sch.get(p).writes):
            return p
    return None


def lane_reads(reads, x) -> bool | None:
    """Over the read regions ``reads``: None when one reads the iter ``x`` other than in its
    last index with unit stride (lanes of ``x`` would gather); else whether any reads ``x``
    (what a rule vectorising or tiling ``x`` inside a reduction needs of its inputs)."""
    any_x = False
    for r in reads:
        idx = region_vars(r)
        if any(uses_var(e, x) for e in idx[:-1]) or (idx and not unit_stride(idx[-1], x)):
            return None
        any_x = any_x or (bool(idx) and uses_var(idx[-1], x))
    return any_x


def blocks(sch):
    """The blocks under the root block, in order."""
    return sch.get_child_blocks(sch.get_sblock("root"))


def iter_kinds(block):
    """"S"/"R" per block iter var, or None for other iter types (scan, opaque)."""
    out = ""
    for iv in block.iter_vars:
        if iv.iter_type == tirx.IterVar.DataPar:
            out += "S"
        elif iv.iter_type == tirx.IterVar.CommReduce:
            out += "R"
        else:
            return None
    return out


def inline_producers(sch, block_rv):
    """Inline every other block of a one-output kernel into ``block_rv`` (pads too);
    returns the block again (inlining replaces its handle), or None when a producer
    could not be inlined (not a plain kernel of the caller's shape)."""
    name = sch.get(block_rv).name_hint
    before, _, _ = inline_around(sch, block_rv, keep_pads=False)
    return None if before else sch.get_sblock(name)


def inline_around(sch, main_rv, keep_pads=True, keep=()):
    """Inline every spatial block but ``main_rv`` (the conv / matmul), the blocks named in
    ``keep`` and padding producers (kept when ``keep_pads``: padding inlined into the
    reduction would put a branch in the inner loop; a max pool's ``pad_temp`` also when
    unpadded: its order keys, built once per input element, ``legalize_pool``).  Returns
    (blocks left before main, blocks left after main, the single consumer of main that
    writes the output or None)."""
    main = sch.get(main_rv)
    pads = list(keep)
    for blk in sch.get_producers(main_rv):
        b = sch.get(blk)
        if keep_pads and ("if_then_else" in str(b.body) or b.name_hint == "pad_temp"):
            pads.append(b.name_hint)
    changed = True
    while changed:
        changed = False
        for blk in blocks(sch):
            b = sch.get(blk)
            if b.same_as(main) or b.name_hint in pads:
                continue
            try:
                sch.compute_inline(blk)
                changed = True
            except Exception:  # noqa: BLE001 - writes an output, or not inlinable
                pass
    order = [sch.get(b).name_hint for b in blocks(sch)]
    pos = order.index(main.name_hint)
    before = [sch.get_sblock(n) for n in order[:pos]]
    after = [sch.get_sblock(n) for n in order[pos + 1:]]
    cons = sch.get_consumers(main_rv)
    tail = cons[0] if len(cons) == 1 and len(after) == 1 else None
    return before, after, tail


def schedule_elementwise(sch, blk, lanes, ncores):
    """Parallel outer loops, vectorised inner loop (when it divides) of a spatial block."""
    loops = sch.get_loops(blk)
    inner = const_extent(sch, loops[-1])
    if inner is not None and inner % lanes == 0:
        _, v = sch.split(loops[-1], [None, lanes])
        sch.vectorize(v)
        loops = sch.get_loops(blk)[:-1]
    elif inner is not None and inner <= 4 * lanes and len(loops) > 1:
        sch.vectorize(loops[-1])
        loops = loops[:-1]
    elif inner is not None and len(loops) > 1:
        # a row of no whole vectors (an NCHW pad's 226 pixels): rows in parallel, each row's
        # loop partitioned at its bounds tests, so the interior is a plain copy LLVM
        # vectorises.  Fused into one loop, each element paid a division per dim and a
        # test (MobileNetV2's stem pad: most of the stem conv's time on emeraldrapids)
        sch.annotate(loops[-1], "pragma_loop_partition_hint", 1)
        loops = loops[:-1]
    elif inner is None and len(loops) > 1:
        # a symbolic row: rows in parallel, each a plain loop (TVM's loop partition of an
        # int64 symbolic loop fails: "mismatched types int64 vs int32")
        loops = loops[:-1]
    if len(loops) > 1 and const_extent(sch, loops[-1]) is None:
        # a symbolic image's columns (NCHW[b]c pads: the lanes vectorised above) stay a
        # loop in each task: fused, every vector paid a division and a modulo by symbolic
        # extents (EfficientNet's stem pad over 224 x 224: 1.3 ms of a 1.7 ms kernel)
        loops = loops[:-1]
    loops = loops[:one_symbolic_fusion(sch, blk, loops)]
    if loops and ncores > 1:
        sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])


def one_symbolic_fusion(sch, blk, loops) -> int:
    """How many of ``loops`` (the outer loops of ``blk``) a parallel fusion may take: all,
    or, where the block's buffer indices already divide by symbolic extents (a reshape
    over a symbolic image: ShuffleNet's channel shuffle), those before its second symbolic
    loop: two fused symbolic loops put their divisions into every such index, and TVM's
    simplifier took 209 s on one such kernel (0.1 s with one)."""
    symbolic = [k for k, lp in enumerate(loops) if const_extent(sch, lp) is None]
    if len(symbolic) < 2 or not _symbolic_divmod(sch.get(blk)):
        return len(loops)
    return symbolic[1]


def _symbolic_divmod(block) -> bool:
    """Whether a buffer index in ``block`` divides or takes a modulo by a symbolic value."""
    for load in nodes(block.body, tvm.ir.expr.TensorLoad):
        for e in load.indices:
            for kind in (tirx.FloorDiv, tirx.FloorMod):
                if any(not isinstance(d.b, tirx.IntImm) for d in nodes(e, kind)):
                    return True
    return False


def vectorize_row(sch, blk, lanes):
    """Vectorise a row's elementwise loop ``ROW_VECTORS`` (or fewer) vectors per iteration:
    independent vectors overlap the latency of exp's polynomial chain (one vector per
    iteration ran 12x128x128 softmax at 0.24 ms, four at 0.17-0.20 ms, znver3 time_evaluator).
    A row that is no whole number of vectors (197 tokens) is partitioned: whole vectors, then
    the rest (12x197x197 softmax 0.42-0.50 -> 0.36 ms, 4x77x77 0.026 -> 0.019 ms against a
    plain loop left to LLVM's vectoriser), itself one short vector (a scalar tail of 8 in a
    56-wide row held 3/4 of Erf's time).  A predicated split instead
    is scalarised lane by lane, with an ``if`` each (2x slower)."""
    loops = sch.get_loops(blk)
    if len(loops) < 2:
        return
    ext = const_extent(sch, loops[-1])
    if ext is None or ext < 2:
        return
    if ext <= lanes:
        sch.vectorize(loops[-1])
        return
    head = ext - ext % lanes
    if head < 2 * lanes:  # one vector and a tail: left to LLVM
        return
    loop = loops[-1]
    if head < ext:
        loop, tail = sch.loop_partition(loop, [head, None])
        if ext - head > 1:
            # the tail as one short vector (LLVM widens it): scalar, an exp / erf tail ran
            # ~40 ops an element; 8 of 56 a row held 3/4 of Erf's time (3.0x onnxruntime)
            sch.vectorize(tail)
    width = next(v * lanes for v in (ROW_VECTORS, 2, 1) if head % (v * lanes) == 0)
    if head > width:
        _, loop = sch.split(loop, [None, width])
    sch.vectorize(loop)


# vectors per iteration of a vectorised row loop (vectorize_row)
ROW_VECTORS = 4


def region_vars(region):
    """The start index of each dimension of a buffer region."""
    return [r.min for r in region.region]


def same_vars(exprs, want) -> bool:
    """``exprs`` are exactly the variables ``want`` (None in ``want`` matches anything)."""
    return len(exprs) == len(want) and all(w is None or e.same_as(w) for e, w in zip(exprs, want))


def only_reduction(sch):
    """(block rv, its iter kinds) of the function's only block with a reduction iter when
    every other block is spatial (and no block has scan/opaque iters); else None."""
    cands = []
    for blk in blocks(sch):
        k = iter_kinds(sch.get(blk))
        if k is None:
            return None
        if "R" in k:
            cands.append((blk, k))
    return cands[0] if len(cands) == 1 else None


def single_reduction(sch, kinds: str):
    """(block rv, block, iter vars) of the function's only reduction block when its iter
    kinds are ``kinds`` and every other block is spatial; else None."""
    found = only_reduction(sch)
    if found is None or found[1] != kinds:
        return None
    rv = found[0]
    block = sch.get(rv)
    return rv, block, [iv.var for iv in block.iter_vars]


# What a window pooling or a row reduction may write: float32, and the 8-bit activations of
# quantized models (QOperator's uint8 MaxPool; QDQ LayerNorm -> QuantizeLinear rows)
FLOAT_OR_8BIT = ("float32", "uint8", "int8")
# A float32 max pool reduces int32 order keys (compiler/lowering/legalize_pool.py): what the
# window rules may reduce, with and without the 8-bit activations
POOL_KEYS = "int32"
POOLED = FLOAT_OR_8BIT + (POOL_KEYS,)
FLOAT_OR_KEYS = ("float32", POOL_KEYS)


def nodes(root, kind) -> list:
    """Every node of type ``kind`` under ``root`` (a TIR statement or expression)."""
    out = []

    def take(node, visitor):
        out.append(node)
        visitor.default_visit(node)

    tvm_ffi.structural_visit(root, [(kind, take)])
    return out


def fp32_output(block, spatial, dtypes=("float32",)):
    """(output region, the other reads) when ``block`` writes one float32 buffer (or one
    of ``dtypes``), of as many dimensions as ``spatial`` (4-D NCHW / NHWC, 5-D NCHW[b]c),
    indexed exactly by the ``spatial`` vars; else None."""
    if len(block.writes) != 1:
        return None
    out = block.writes[0]
    if out.source.dtype not in dtypes or len(out.source.shape) != len(spatial) or not same_vars(
            region_vars(out), spatial):
        return None
    return out, [r for r in block.reads if not r.source.same_as(out.source)]


def schedule_pads(sch, pads, pad_name, at, lanes, ncores):
    """The blocks a window reduction leaves before it (``inline_around``): the one named
    ``pad_name`` (its padded input) is built under loop ``at``, its innermost loop
    vectorised when at most 4 vectors wide; the others become parallel, vectorised
    elementwise stages."""
    for p in pads:
        if sch.get(p).name_hint == pad_name:
            sch.compute_at(p, at, preserve_unit_loops=True)
            inner = sch.get_loops(p)[-1]
            extent = const_extent(sch, inner)
            if extent is not None and extent <= 4 * lanes:
                sch.vectorize(inner)
        else:
            schedule_elementwise(sch, p, lanes, ncores)


def write_back_at(sch, main, at, tail, pads, after, write_layout=None, scope="local"):
    """The register tile's write-back: cache ``main``'s output in registers (``scope``
    "local"; "global": a row cache the tiles accumulate in, in memory),
    optionally lay the tile out by ``write_layout`` (an index map of the written buffer),
    write it back under loop ``at``, and inline the single elementwise consumer ``tail``
    (bias, activation, residual add) into that write-back.  Returns (write-back block, the
    blocks left to schedule as elementwise stages: ``pads``, plus ``after`` when there was
    no single consumer to inline)."""
    wb = sch.cache_write(main, 0, scope)
    if write_layout is not None:
        sch.transform_layout(main, ("write", 0), write_layout)
    sch.reverse_compute_at(wb, at, preserve_unit_loops=True)
    if tail is not None:
        sch.reverse_compute_inline(tail)
        return wb, list(pads)
    return wb, list(pads) + list(after)


def parallel(sch, loops, ncores: int) -> None:
    """Fuse ``loops`` and run them across the cores (nothing on one core).  Annotate before
    ``decompose_reduction``: the update block alone is no longer a reduction there."""
    if ncores > 1 and loops:
        sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])


# Accumulator registers per register tile, by the target's vector registers; the rest hold
# the tile's operand vectors and a broadcast.  32 registers (AVX-512 zmm, aarch64 v): 20 for
# conv tiles (24 and more spilled: conv2d_packed measured 2.5x slower on znver5), 24 for
# matmul rows x vectors.  16 registers (AVX2 / SSE ymm, xmm): 12 for both, the 6 x 2-vector
# tile of AVX2 GEMMs (12 accumulators + 2 operand vectors + 1 broadcast).
ACC_BUDGET = {32: {"conv": 20, "matmul": 24}, 16: {"conv": 12, "matmul": 12}}


def acc_budget(target, kind: str = "conv") -> int:
    """Accumulators a ``kind`` ("conv" or "matmul") register tile may use on ``target``."""
    regs = vector_registers(target)
    return ACC_BUDGET[32 if regs >= 32 else 16][kind]


def pixel_tile(oh: int, ow: int, groups: int, width: int = 1, max_group=None,
               budget: int = 20) -> tuple:
    """(yt, xt, gt): a ``yt x xt`` pixel tile (divisors of oh, ow) times ``gt`` channel
    groups (a divisor of ``groups``, at most ``max_group``; each ``width`` registers wide)
    within ``budget`` accumulators (``acc_budget``), with the fewest loads per FMA: a weight vector
    serves ``yt * xt`` FMAs, a broadcast ``gt``.  Ties go to wider rows (contiguous input)."""
    best, best_cost = (1, 1, 1), None
    for gt in divisors(groups):
        if max_group is not None and gt > max_group:
            break
        for xt in divisors(ow):
            for yt in divisors(oh):
                if xt > 16 or yt * xt * gt * width > budget:
                    continue
                cost = (1 / gt + 1 / (yt * xt), -xt)
                if best_cost is None or cost < best_cost:
                    best, best_cost = (yt, xt, gt), cost
    return best


def matmul_block(sch):
    """(block rv, iter vars, the reads other than the output) of the function's only
    reduction block when it reduces over its last iter alone (``S..SR``, at least three
    iters), all other blocks being spatial, writes one float32 buffer indexed by exactly
    its spatial iters and reads two others; else None.  The matmul rules then check how
    the two operands are indexed."""
    found = only_reduction(sch)
    if found is None:
        return None
    rv, kinds = found
    if len(kinds) < 3 or kinds[-1] != "R" or "R" in kinds[:-1]:
        return None
    ivs = [iv.var for iv in sch.get(rv).iter_vars]
    o = fp32_output(sch.get(rv), ivs[:-1])
    if o is None or len(o[1]) != 2:
        return None
    return rv, ivs, o[1]


def gemm_tile(m: int, n: int, lanes: int, budget: int, cap: int = 16) -> tuple:
    """(rows, columns) of a matmul register tile for an ``m x n`` output: ``rows`` x one or
    two vectors of ``lanes`` columns within ``budget`` accumulators, ``m`` and ``n`` padded
    up to whole tiles.  Chosen by cost, not by divisibility: the padded tiles times the
    cycles of one k step of a tile, ``max(FMAs / 2, 4, loads / 2)`` (two FMA pipes of
    latency 4, so fewer than 8 accumulators stall; ``rows`` broadcasts + ``vectors`` loads
    per step; the constants hold for current x86 and Arm cores).  Ties go to fewer padded
    outputs, then to fewer (larger) tiles: less write-back and panel traffic."""
    best, best_cost = (1, lanes), None
    for nv in (1, 2):
        jt = nv * lanes
        for it in range(1, min(cap, budget // nv, max(m, 1)) + 1):
            tiles = -(-m // it) * -(-n // jt)
            step = max(it * nv / 2, 4, (it + nv) / 2)
            cost = (tiles * step, tiles * it * jt, tiles)
            if best_cost is None or cost < best_cost:
                best, best_cost = (it, jt), cost
    return best


def conv_loops(sch, conv, b: int, nd: int):
    """The loops of a channels-first conv block with ``nd`` spatial dims and output channel
    block ``b``: (n, f, outer planes, y (None for 1-D), x, reduction loops, output
    height (1 for 1-D), output width); None when an extent is symbolic or F is not whole
    blocks.  The packed and transposed conv rules both start from it."""
    loops = sch.get_loops(conv)
    ext = [const_extent(sch, lp) for lp in loops]
    if any(e is None for e in ext) or ext[1] % b:
        return None
    n, f, *sp = loops[:2 + nd]
    planes, y, x = sp[:-2], (sp[-2] if nd >= 2 else None), sp[-1]
    oh, ow = (ext[nd] if nd >= 2 else 1), ext[1 + nd]
    return n, f, planes, y, x, loops[2 + nd:], oh, ow


def row_multiple(extent) -> int | None:
    """``r`` when a symbolic row extent is ``((M + r - 1) // r) * r`` (rows padded to whole
    register tiles by pack_matmul_weights / pack_bf16_matmul), else the largest ``r`` of
    at most 32 it provably divides by (TVM folds the padding of some row counts into
    another form: wav2vec2's frames ``(samples - 400) // 320 + 1`` padded to twelves read
    ``(samples - 400) // 3840 * 12 + 12``, and its matmuls fell to dlight), else None."""
    if isinstance(extent, tirx.Mul) and isinstance(extent.b, tirx.IntImm) and isinstance(
            extent.a, tirx.FloorDiv):
        return int(extent.b)
    if isinstance(extent, tirx.IntImm):
        return None
    return tile_columns(extent, 32)


def tile_columns(extent, cap: int) -> int | None:
    """The widest tile (at most ``cap``, above 1) that provably divides a symbolic
    extent: a legalization or pass padded it to whole tiles, ``max((ow + xt - 1) // xt,
    1) * xt`` (conv columns) or ``(M + r - 1) // r * r`` (matmul rows), which the
    simplifier rewrites; None when none does."""
    from tvm.sym.analyzer import Analyzer

    ana = Analyzer()
    for xt in range(cap, 1, -1):
        if ana.can_prove(tirx.floormod(extent, xt) == 0):
            return xt
    return None


def opt_extent(sch, loop):
    """The extent ``loop`` is compiled for when it is a symbolic dim: the dim's ``opt``
    (``dims={"seq": (1, 128, 1)}``: a decoder tuned for its one-token steps, whose
    attention then runs one query row), from the kernel's ``onnxc.dim_opt``; else None."""
    from tvm import tirx

    from compiler.lowering.symbolic import DIM_OPT_ATTR

    ext = sch.get(loop).extent
    attrs = sch.mod["main"].attrs
    if isinstance(ext, tirx.IntImm) or attrs is None or DIM_OPT_ATTR not in attrs:
        return None
    opts = attrs[DIM_OPT_ATTR]
    if isinstance(ext, tirx.Var):
        opt = opts.get(ext.name)
        return None if opt is None else int(opt)
    # a product of dims (``batch * seq``: flattened rows): its value with each dim at its opt
    def at_opt(e):
        if isinstance(e, tirx.IntImm):
            return int(e)
        if isinstance(e, tirx.Var):
            opt = opts.get(e.name)
            return None if opt is None else int(opt)
        if isinstance(e, tirx.Mul):
            a, b = at_opt(e.a), at_opt(e.b)
            return None if a is None or b is None else a * b
        return None

    return at_opt(ext)


# Where a buffer may be referenced in a kernel's JSON form before lowering: loads, stores,
# block read / write regions, and the allocating block's list.  Any other reference (an
# address taken, a match_buffer) makes alias_buffer leave the kernel as it is.
_BUFFER_FIELDS = {("ir.TensorLoad", "source"), ("tirx.BufferStore", "buffer"),
                  ("ir.TensorRegion", "source")}


def alias_buffer(func, name: str, into: str):
    """``func`` with the block-allocated buffer ``name`` stored in buffer ``into`` (every
    read and write of ``name`` goes to ``into`` at the same indices, the allocation
    dropped), or None when either is missing or ambiguous, they differ in shape or dtype,
    or ``name`` is referenced other than by loads, stores and block regions.

    The caller guarantees the program stays correct: each element of ``into`` is written
    from the same element of ``name`` and nothing reads ``name`` after that (softmax's
    ``norm[i] = exp[i] * r``).  TVM 0.27 has no Python mutator over TIR: the function goes
    through its JSON form, where a buffer is one node (a variable of buffer type) that
    every access references (as ``compiler/lowering/input_alignment.py`` does)."""
    import json

    doc = json.loads(tvm.ir.save_json(func))
    nodes = doc["nodes"]

    def text(i):
        return nodes[i]["data"] if nodes[i]["type"] == "ffi.String" else None

    buffers: dict = {}
    for i, n in enumerate(nodes):
        if n["type"] == "ir.Var" and nodes[n["data"]["ty"]]["type"] == "tirx.BufferType":
            buffers.setdefault(text(n["data"]["name"]), []).append(i)
    if len(buffers.get(name, ())) != 1 or len(buffers.get(into, ())) != 1:
        return None
    src, dst = buffers[name][0], buffers[into][0]
    ts, td = (nodes[nodes[v]["data"]["ty"]]["data"] for v in (src, dst))
    if not all(_same_node(nodes, ts[k], td[k]) for k in ("dtype", "shape")):
        return None
    allocs = {nodes[i]["data"]["alloc_buffers"] for i, n in enumerate(nodes)
              if n["type"] == "s_tir.SBlock"}
    dropped = 0
    for i, n in enumerate(nodes):
        data = n.get("data")
        if isinstance(data, list) and src in data:
            if i not in allocs or data.count(src) != 1:
                return None
            data.remove(src)
            dropped += 1
        elif isinstance(data, dict) and i != src:
            for field, value in data.items():
                if value != src:
                    continue
                if (n["type"], field) not in _BUFFER_FIELDS:
                    return None
                data[field] = dst
    if dropped != 1:
        return None
    return tvm.ir.load_json(json.dumps(doc))


def _same_node(nodes, a, b) -> bool:
    """Whether JSON nodes ``a`` and ``b`` are the same value (structurally)."""
    if a == b:
        return True
    na, nb = nodes[a], nodes[b]
    if na["type"] != nb["type"] or na["type"] == "ir.Var":  # variables: by identity
        return False
    da, db = na["data"], nb["data"]
    if isinstance(da, list) and isinstance(db, list):
        return len(da) == len(db) and all(_same_node(nodes, x, y) for x, y in zip(da, db))
    if isinstance(da, dict) and isinstance(db, dict):
        return da.keys() == db.keys() and all(
            k == "span" or (da[k] == db[k] if not isinstance(da[k], int) or k in _POD
                            else _same_node(nodes, da[k], db[k])) for k in da)
    return da == db


# fields of a node's JSON data that hold a value, not the index of another node
_POD = {"data_alignment", "offset_factor"}
