"""``precision=``: which matmuls compute in bf16, whether the target can, and the error.

``fp32`` (the default) changes nothing.  ``bf16`` turns on ``passes/pack_bf16_matmul.py``
(constant-weight matmuls: bf16 weights and activations, fp32 accumulation) and needs a
target with AVX512-BF16 (``vdpbf16ps``): refused otherwise, not silently fp32 (and not an
emulation, which would be slower than fp32 and so never what a user asking for bf16
wants).  ``bf16-emulated`` is the same graph with the kernels in plain fp32 vector code on
the same bf16-rounded inputs: any target, for measuring the error where bf16 cannot run.

The report's ``precision`` entry carries the max relative error of the build against the
fp32 build of the same model on one seeded random input (normwise per output:
``max|y - y32| / max|y32|``, the largest over the outputs): ``measured`` when this host can
run the build, else ``emulated`` (a ``bf16-emulated`` build and an fp32 build for this host),
or ``null`` with the reason when it was not asked for (``precision_check=False``).  Above
``WARN_ABOVE`` the report warns.
"""

from __future__ import annotations

import numpy as np

from .errors import CompileError

PRECISIONS = ("fp32", "bf16", "bf16-emulated")
WARN_ABOVE = 2e-2  # the bound for BERT-base outputs against fp32


def check(precision: str, tinfo, where: str) -> None:
    """Refuse an unknown precision, or ``bf16`` for a target without AVX512-BF16."""
    if precision not in PRECISIONS:
        raise CompileError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    if not tinfo.is_cpu:
        raise CompileError(f"{where}: precision {precision!r} is for CPU targets; target "
                           f"{tinfo.name!r} is not one (use precision 'fp32')")
    if precision == "bf16" and "avx512bf16" not in tinfo.features:
        raise CompileError(
            f"{where}: precision 'bf16' needs a target with AVX512-BF16 (vdpbf16ps); target "
            f"{tinfo.name!r} ({tinfo.cpu}) has no avx512bf16. Compile for a CPU that has it "
            "(e.g. a target dict with mcpu znver4, znver5 or sapphirerapids), use precision "
            "'fp32', or 'bf16-emulated' to measure the bf16 error on this target")


def speed_warning(precision: str, tinfo) -> str | None:
    """A warning when ``bf16`` is unlikely to be faster than fp32 on ``tinfo``'s CPU.  On
    AMD's Zen 4 / Zen 5 (LLVM ``znver*``) ``vdpbf16ps`` does twice an fp32 FMA's work at
    its rate (BERT-base bf16 0.48x onnxruntime's fp32 time on znver5); on an Intel core
    (emeraldrapids, AMX hidden) the same kernel ran at ~120 GFLOP/s, no faster than fp32,
    and BERT-base at 2.06x onnxruntime's fp32 time: there the bf16 gain is AMX-BF16's,
    which onnxc does not use."""
    if precision != "bf16" or not tinfo.is_cpu or tinfo.cpu.startswith("znver"):
        return None
    return (f"precision bf16 on {tinfo.cpu}: bf16 matmuls (vdpbf16ps) are not expected to "
            "beat fp32 on this CPU (measured on emeraldrapids: no faster than fp32, "
            "BERT-base 2x onnxruntime's fp32 time); bf16 pays on AMD Zen 4 / Zen 5")


def pass_config(precision: str, tinfo, config: dict) -> dict:
    """``config`` with pack_bf16_matmul's precision and register tile (two vectors wide,
    rows from the accumulator budget, as pack_matmul_weights') for ``tinfo``."""
    if precision == "fp32" or not tinfo.is_cpu:
        return config
    from schedules.cpu import common

    config = {k: dict(v) for k, v in (config or {}).items()}
    opts = config.setdefault("pack_bf16_matmul", {})
    opts.setdefault("precision", "bf16")
    target = tinfo.tvm_target()
    lanes = 16 if precision == "bf16" else common.lanes_fp32(target)
    opts.setdefault("panel", 32)
    opts.setdefault("rows", max(1, common.acc_budget(target, "matmul")
                                // -(-int(opts["panel"]) // lanes)))
    return config


def max_rel_error(outs, refs) -> float:
    """Largest over the outputs of ``max|y - y32| / max|y32|`` (float outputs only)."""
    worst = 0.0
    for y, r in zip(outs, refs):
        if not np.issubdtype(r.dtype, np.floating) or r.size == 0:
            continue
        scale = float(np.max(np.abs(r)))
        err = float(np.max(np.abs(y.astype(np.float64) - r)))
        worst = max(worst, err / scale if scale > 0 else err)
    return worst


def random_feeds(manifest: dict, seed: int = 0) -> dict:
    """One seeded random input (symbolic dims at their OPT value): floats N(0, 1), integers
    in the range of the Gather they index (token ids), else 0..1 (masks)."""
    rng = np.random.default_rng(seed)
    from .tools.bench import index_limits

    bounds = index_limits(manifest.get("index_bounds", []))
    opt = {d["name"]: d["opt"] for d in manifest.get("dims", ())}  # symbolic dims: at OPT
    feeds = {}
    for inp in manifest["inputs"]:
        shape = [int(opt.get(d, d)) if isinstance(d, str) else int(d) for d in inp["shape"]]
        dtype = np.dtype(inp["dtype"])
        if np.issubdtype(dtype, np.floating):
            feeds[inp["name"]] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp["name"]] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[inp["name"]] = rng.integers(0, bounds.get(inp["name"], 2), shape).astype(dtype)
    return feeds


def error_entry(cm, precision: str, rebuild, runnable: bool, enabled: bool) -> dict:
    """The report's ``precision`` entry for the compiled model ``cm``.

    ``rebuild(precision, target)`` compiles the same model again (``target`` None: the
    same target; ``"host"``: this machine); ``runnable``: this host has the features of
    ``cm``'s target."""
    entry = {"mode": precision, "max_rel_error": None, "error_source": None,
             "warn_above": WARN_ABOVE, "why": ""}
    if precision == "fp32":
        entry["why"] = "fp32: no lower precision"
        return entry
    if not enabled:
        entry["why"] = "not measured: precision_check=False"
        return entry
    if runnable:
        ref = rebuild("fp32", None)
        feeds = random_feeds(cm.meta["manifest"])
        outs = cm.session().run(None, feeds)
        entry["error_source"] = "measured"
        entry["why"] = ("this build against the fp32 build of the same model, on this "
                        "host, one seeded random input")
    else:
        emu, ref = rebuild("bf16-emulated", "host"), rebuild("fp32", "host")
        feeds = random_feeds(emu.meta["manifest"])
        outs = emu.session().run(None, feeds)
        entry["error_source"] = "emulated"
        entry["why"] = ("emulated: this host cannot run the build (its target's features "
                        "are missing here); a bf16-emulated build for this host (the same "
                        "bf16 rounding of weights and activations, fp32 accumulation in "
                        "plain vector code, whose summation order and denormal handling may "
                        "differ from vdpbf16ps at fp32 rounding level) against the fp32 "
                        "build, one seeded random input")
    refs = ref.session().run(None, feeds)
    entry["max_rel_error"] = max_rel_error(outs, refs)
    return entry
