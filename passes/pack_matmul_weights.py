"""matmul(x, W[K, N]) => matmul_packed(x, Wp[N/nr, K, nr]), Wp packed at compile time.

With the weight as ``N/nr`` contiguous ``K x nr`` panels, the CPU rule ``matmul_packed``
streams each panel straight into its ``mr x nr`` register tile: no per-call copy of a
strided ``K x nr`` panel of W (rows ``4 N`` bytes apart), as ``cpu.matmul`` makes
(single core, BERT-base M = 128: 207 -> 232 GFLOP/s on the 3072x768 weight, 231 -> 253 on
768x768).  Fires on float32 ``x[.., M, K] @ W[K, N]`` with a constant 2-D W, static
shapes; an ``N`` that is not a multiple of ``panel`` (two fp32 vectors of the target) gets
zero columns up to whole panels, dropped again in the write-back (MobileNetV2's 1280 x 1001
classifier: 2.8-9 ms under cpu.matmul, 20-60x onnxruntime, single-thread on Zen 3).  When M's
divisors make only thinner register tiles than ``rows`` (prime M: 37, 197; 128 on AVX2's
6-row tile; ``pad_rows``), the kernel computes M rounded up to ``rows`` (x's row index
clamped) and drops the extra rows: 67 -> 250 GFLOP/s at 197 x 768 x 768.  A symbolic M (batch x seq tokens, ``lowering/symbolic.py``) is always
rounded up so: one kernel, whole register tiles, only the write-back guarded.  Emitted through ``call_te`` (a call_tir of our own TE compute), so
FoldConstant does not undo the packing, and a reduction that FuseOps fuses bias / GELU /
residual adds into.  Runs after the passes that build the matmul chains (fuse_gelu,
fuse_attention) and needs the weights folded to constants (fold_constants).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import GenericConst  # Relax constants in TVM 0.27

from .context import GraphPass, PassReport
from .dataflow import record_calls, rewrite_calls
from .relax_util import const_view, filled_const

RULE = "matmul(x, W) => matmul_packed(x, [N/nr, K, nr](W))"


class PackMatmulWeights(GraphPass):
    """matmul(x, W) => matmul_packed(x, pack(W)) for float32 matmuls with constant W."""

    name = "pack_matmul_weights"
    opt_level = 2
    # panel and rows: the CPU rule's register tile; compile_static sets both from the
    # target (compiler/driver.py _matmul_tiles: two fp32 vectors wide); these are AVX-512's
    # one_row_dims: symbolic dims compiled for one row (``dims=`` opt 1: a decoder's seq,
    # compiler/driver.py _one_row_dims); an M of such a dim is not padded to ``rows``
    options = {"panel": 32, "rows": 12, "one_row_dims": ()}

    def rewrite(self, mod, report: PassReport, options: dict):
        panel, rows = int(options["panel"]), int(options["rows"])
        one_row = frozenset(options["one_row_dims"])
        packs: dict = {}  # one packed constant per weight, however many matmuls read it
        out, rewritten = rewrite_calls(
            mod, "relax.matmul", lambda m, call: _packed(m, call, panel, rows, one_row, packs))
        record_calls(report, RULE, rewritten)
        return out


def matmul_packed(x, wp, rows: int = 1, n: int | None = None):
    """TE compute: ``out[.., i, j] = sum_k x[.., i, k] * wp[j // nr, k, j % nr]`` with
    ``wp`` of shape [N/nr, K, nr].  With ``rows`` > 1 that does not divide M, the sum runs
    over M rounded up to a multiple of ``rows``, reading row ``min(i, M - 1)`` of x (no
    branch in the inner loop); with ``n`` < the packed columns (W's last panel padded with
    zero columns), over whole panels.  A second stage drops the extra rows and columns."""
    *bat, m, kk = x.shape
    no, _, nr = (int(d) for d in wp.shape)
    n = no * nr if n is None else int(n)
    k = te.reduce_axis((0, kk), "k")
    m, mp, padded = padded_rows(m, rows)

    def row(i):
        return te.min(i, m - 1) if padded else i

    out = te.compute(
        (*bat, mp, no * nr),
        lambda *idx: te.sum(
            x[(*idx[:-2], row(idx[-2]), k)]
            * wp[te.indexdiv(idx[-1], nr), k, te.indexmod(idx[-1], nr)], axis=k),
        name="matmul_packed")
    if not padded and n == no * nr:
        return out
    return te.compute((*bat, m, n), lambda *idx: out[idx], name="matmul_rows")


def padded_rows(m, rows: int):
    """(M, the rows a packed matmul computes, whether they run past M): a static M rounded
    up to a multiple of ``rows``; a symbolic one (batch x seq tokens) to whole multiples of
    ``rows`` when it is above 1, else M as it is (a decode step's one row a call).  Rows
    past M read row M - 1 (no branch in the inner loop)."""
    if isinstance(m, (int, tvm.tirx.IntImm)):
        m = int(m)
        mp = -(-m // rows) * rows
        return m, mp, mp != m
    if rows > 1:
        return m, te.indexdiv(m + (rows - 1), rows) * rows, True
    return m, m, False


def pad_rows(m: int, rows: int, vectors: int = 2) -> int:
    """The multiple to round M up to (computed rows, x's row index clamped), or 1: M as it
    is, in tiles of its largest divisor up to ``rows``.

    ``rows`` is the register tile the CPU rule makes on this target (accumulator budget /
    ``vectors`` per panel row: 12 with AVX-512's 32 registers and 2-vector panels, 6 with
    AVX2's 16); the rule tiles the (padded) rows by their largest divisor ``t`` up to it.
    A ``t``-row tile does ``t x vectors`` FMAs per k step for ``vectors`` weight loads and
    ``t`` broadcasts; it is costed against the full tile by the larger of its loads per FMA
    (relative to the full tile's) and the FMA latency it cannot hide (fewer than
    ``LATENCY_ACCUMULATORS`` independent accumulators), times the rows it computes
    (``padded / M``); the cheapest ``t`` wins, M unpadded on a tie.  Measured, one thread:
    Zen 3 (AVX2, 6-row tile), M = 128 (t = 4, cost 1.125) padded to 132 (1.031): 0.86-0.95x
    the time over five K x N shapes; emeraldrapids (AVX-512, 12 rows), M = 49 in 7-row tiles
    (1.10) against padded to 60 (1.22): 0.865x the time (six 768 x 3072 / 3072 x 768 FFN
    pairs, weights streamed from L3); M = 37 or 197 in 1-row tiles (cost 4): ~65 GFLOP/s against
    250 at 12 rows."""
    rows = max(int(rows), 1)
    divisor = max(d for d in range(1, min(m, rows) + 1) if m % d == 0)
    best, best_cost = 1, tile_cost(divisor, rows, vectors)
    for t in range(rows, 1, -1):
        padded = -(-m // t) * t
        if padded == m:
            continue
        cost = padded / m * tile_cost(t, rows, vectors)
        if cost < best_cost - 1e-9:
            best, best_cost = t, cost
    return best


# independent accumulators that keep two FMA pipes of 4-cycle latency busy (Zen 3-5, Intel
# since Skylake): a 1-row tile of 2 vectors waits on the latency 4x
LATENCY_ACCUMULATORS = 8


def tile_cost(t: int, rows: int, vectors: int = 2) -> float:
    """Time per row of a ``t``-row register tile relative to the full ``rows``-row one (see
    ``pad_rows``): the larger of its loads per FMA and the FMA latency it cannot hide."""
    loads = (vectors + t) / (t * vectors) / ((vectors + rows) / (rows * vectors))
    return max(loads, LATENCY_ACCUMULATORS / (t * vectors), 1.0)


def pack_kn(w: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> [ceil(N/nr), K, nr]: ``wp[jo, k, ji] = w[k, jo * nr + ji]``, the last panel
    padded with zero columns."""
    k, n = w.shape
    out = np.empty((-(-n // nr), k, nr), w.dtype)
    pack_kn_into(out, w, nr)
    return out


def pack_kn_into(out: np.ndarray, w: np.ndarray, nr: int) -> None:
    """Write ``pack_kn(w, nr)`` into ``out`` (its shape), in one pass over ``w``."""
    k, n = w.shape
    full = n // nr
    out[:full] = w[:, :full * nr].reshape(k, full, nr).transpose(1, 0, 2)
    if full < out.shape[0]:
        out[full] = 0
        out[full, :, :n - full * nr] = w[:, full * nr:]


def float_weight_matmul(call, rows: int, one_row=frozenset()):
    """(x, W as numpy, rows to pad M to) of a float32 ``relax.matmul`` ``x[.., M, K] @ W``
    with W a constant 2-D float32 array and K static (M and batch dims may be symbolic:
    then M is padded to ``rows``, unless M is a dim of ``one_row``: then 1); None for any
    other matmul.  Shared by the passes that pack such weights (this one,
    pack_bf16_matmul)."""
    x, weight = call.args
    if not isinstance(weight, GenericConst):
        return None
    out_dtype = call.attrs.out_dtype if call.attrs is not None else None
    if (str(out_dtype) if out_dtype is not None else "") not in ("", "void", "float32"):
        return None
    xt = x.ty
    w = const_view(weight)  # read in place, not copied
    if str(xt.dtype) != "float32" or w.dtype != np.float32 or w.ndim != 2:
        return None
    if xt.ndim is None or xt.ndim < 2 or xt.shape is None:
        return None
    if not isinstance(xt.shape[-1], tvm.tirx.IntImm) or int(xt.shape[-1]) != w.shape[0]:
        return None
    mdim = xt.shape[-2]
    if isinstance(mdim, tvm.tirx.IntImm):
        return x, w, pad_rows(int(mdim), rows)
    # a decode step's one row computed as 1, not ``rows``: the 6-row tile's FMAs and
    # broadcasts per weight byte left the weight stream 1.3x slower (Zen 3, one thread:
    # LM head 768 x 50257 from DRAM 8.1 -> 11.2 GB/s, scripts/bench_gemv.py)
    return x, w, 1 if _at_one(mdim, one_row) else rows


def _at_one(e, one_row) -> bool:
    """True when extent ``e`` is 1 with every dim of ``one_row`` at 1: such a dim, or a
    product of them (``batch * seq``: GPT-2's Conv1D flattens its rows)."""
    if isinstance(e, tvm.tirx.Var):
        return e.name in one_row
    if isinstance(e, tvm.tirx.IntImm):
        return int(e) == 1
    if isinstance(e, tvm.tirx.Mul):
        return _at_one(e.a, one_row) and _at_one(e.b, one_row)
    return False


def _packed(m, call, panel: int, rows: int, one_row=frozenset(), packs=None):
    """``call`` (a relax.matmul) as matmul_packed on W packed in ``panel`` columns, emitted
    through ``m`` (rewrite_calls' mutator); None when it does not qualify.  ``packs``
    ({weight's memory: packed constant}) shares one packed copy between the matmuls that
    read one weight: an unrolled LSTM's recurrent weight, read at every step, was packed
    once per step (100 steps x 2 layers: 199 MB of params, each step's 1 MB streamed from
    DRAM: 5.7x onnxruntime)."""
    qualified = float_weight_matmul(call, rows, one_row)
    if qualified is None:
        return None
    x, w, pad = qualified
    xt = x.ty
    x = m.visit_expr(x)
    # packed straight into the constant's buffer: one pass over W (was three copies)
    wp = shared_pack(packs, call.args[1], w, panel, lambda: filled_const(
        (-(-int(w.shape[1]) // panel), int(w.shape[0]), panel), str(w.dtype),
        lambda out: pack_kn_into(out, w, panel)))
    lead = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in list(xt.shape)[:-1]]
    if None not in lead and len(lead) > 1 and flatten_rows(lead[-1], int(np.prod(lead)), rows):
        # [.., M, K] with a few rows per batch (ConvNeXt's [1, 7, 7, 768] tokens): one
        # [B*M, K] matmul (reshapes are views), so the weight panel serves all B*M rows
        # and the row tile is whole; the epilogue then follows in a kernel of its own
        total, k = int(np.prod(lead)), int(xt.shape[-1])
        flat = m.builder_.emit(relax.op.reshape(x, [total, k]))
        y = m.builder_.emit(
            m.builder_.call_te(matmul_packed, flat, wp, pad_rows(total, rows),
                               int(w.shape[1]), primfunc_name_hint="matmul"),
            name_hint=m.binding.var.name)
        return relax.op.reshape(y, [*lead, int(w.shape[1])])
    return m.builder_.call_te(matmul_packed, x, wp, pad, int(w.shape[1]),
                              primfunc_name_hint="matmul")


def shared_pack(packs, weight, w: np.ndarray, panel: int, make):
    """The packed constant of ``w`` (the memory of the constant ``weight``), made by
    ``make()`` the first time and taken from ``packs`` ({memory: (weight, packed)}; None:
    no sharing) after, so the matmuls reading one weight share one packed copy."""
    key = (w.ctypes.data, w.shape, w.strides, panel)
    if packs is not None and key in packs:
        return packs[key][1]
    wp = make()
    if packs is not None:
        packs[key] = (weight, wp)  # the weight held: its memory stays its own
    return wp


def flatten_rows(m: int, total: int, rows: int) -> bool:
    """Whether ``x[.., M, K] @ W`` (``total`` rows over the batch dims) runs better as one
    ``[total, K]`` matmul: when M is below four register tiles (7 or 14 tokens: the K x nr
    weight panel would serve one or two tiles per batch row, streamed again for each)
    and the batch dims hold more rows.  Flattening costs the epilogue's fusion (it
    follows the reshape back), so M's of 49 and up keep the batched kernel."""
    return total > m and m < 4 * max(int(rows), 1)
