"""``compile_static()``: ONNX model -> CompiledModel (kernels + graph + memory plan + params).

The stages, in order (DESIGN.md's data flow):
load + validate -> import to Relax -> our graph passes -> lower and group into kernels
-> schedule -> build -> extract the graph and plan memory.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import logging
import os
import platform
import socket
import time
from datetime import datetime, timezone

import onnx

import passes
import runtime
import schedules
import targets

from . import __version__
from . import precision as precisions
from .lowering import input_alignment, legalize_conv_nchwc, parallel_build
from .lowering.artifact import write_artifact
from .lowering.batch_loop import fix_dim, loop_dim, worth_looping
from .errors import CompileError
from .frontend.fold_onnx import fold_constants as fold_onnx_constants
from .lowering.graph import extract, flops_at, plan_storage
from .lowering.kernel_table import generic_warning, kernel_table
from .frontend.converters.common import cpu_kernels
from .frontend.shape_arith import declared_ranges
from .frontend.importer import import_onnx, index_bounds, input_signature
from .frontend.loader import load_model, text
from .frontend.narrow_import import io_types
from .pipeline import FUSE, graph_passes, lowering
from .lowering.checked import attach_checked, fused_steps
from .lowering.layouts import binding_layouts
from .lowering.provenance import name_fused_calls
from .lowering.row_variants import add_row_variants
from .lowering.symbolic import annotate_dim_opt, resolve_ranges
from .native_log import routed

log = logging.getLogger("onnxc")
# "stage <name>" (DEBUG) as each stage starts: compiler.isolate names the stage a crash hit
stage_log = logging.getLogger("onnxc.stage")


class CompiledModel:
    """A compiled model in memory: export it to one ``.so`` or run it right away.

    Attributes
    ----------
    report : dict
        What the compilation did (the same dict as ``onnxc compile --report``).
    """

    def __init__(self, kernels, meta: dict, payload: bytes, report: dict, toolchain=None):
        self._kernels = kernels
        self.meta = meta
        self._payload = payload
        self.report = report
        self._toolchain = toolchain  # cross compilers (targets.TargetInfo.toolchain) or None

    @property
    def memory_plan(self) -> runtime.MemoryPlan:
        return runtime.MemoryPlan.from_dict(self.meta["memory_plan"])

    def export(self, path: str) -> str:
        """Write the artifact (kernels, graph, plan, params, manifest) to ``path``."""
        write_artifact(os.fspath(path), self._kernels, self.meta, self._payload,
                       toolchain=self._toolchain)
        return os.fspath(path)

    def session(self, options: runtime.SessionOptions | None = None) -> runtime.Session:
        """A session over the in-memory kernels (no export needed)."""
        runtime.check_compatible(self.meta["manifest"], "compiled model")
        return runtime.make_session(self.meta, self._payload, self._kernels, options)


def compile_static(model, target="host", *, opt_level: int = 3, disabled_passes=(),
            required_passes=(), pass_config=None, layout: str = "auto", tuning_db=None,
            memory_reuse: bool = True, dump_ir=None, dims=None, precision: str = "fp32",
            precision_check: bool = True, batch_loop: bool = True) -> CompiledModel:
    """Compile an ONNX model (path or ModelProto) with static shapes for ``target``.

    The stages themselves, in this process; ``compiler.compile`` (``compiler/api.py``) is
    the public entry, which also handles symbolic shapes and child-process isolation.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
    target : str or dict
        A preset (``host``, ``x86``, ``x86-avx2``, ``x86-avx512``) or a TVM target dict.
    opt_level, disabled_passes, required_passes, pass_config, dump_ir
        Graph pass configuration (see ``passes.PassContext``).
    layout : str
        Activation layout of conv graphs: ``auto`` (NCHW[b]c on CPU targets, ``b`` = the
        target's fp32 lanes; NCHW on CUDA), ``NCHW``, ``NCHWc`` or ``NHWC``.  The report
        says what was chosen and why (``passes/convert_layout.py``).
    tuning_db : str, os.PathLike, schedules.database.TuningDatabase or None
        A tuning database directory (``onnxc tune``): kernels whose record for this target
        says tuning won use the tuned schedule; the report counts tuned and untuned kernels.
    memory_reuse : bool
        False gives every tensor its own buffer (no sharing, no in-place), for comparison.
    dims : dict, optional
        ``{dim name: (min, max[, opt])}``: the range of each symbolic input dimension
        (``dim_param``).  Those dims stay symbolic: one build serves every value in the
        range, the arena is planned for the maxima, and the session refuses a feed outside
        them.  A dim not given gets ``lowering.symbolic.DEFAULT_RANGE`` (the report's
        ``dims`` and ``warnings`` say so).
    precision : str
        ``fp32``; ``bf16`` (constant-weight matmuls in bf16 with fp32 accumulation, on
        targets with AVX512-BF16; refused elsewhere); ``bf16-emulated`` (the same numbers
        in fp32 code, any target).  See ``compiler/precision.py``.
    precision_check : bool
        For bf16: measure the max relative error against an fp32 build (one more compile,
        two where this host cannot run the build and emulates it); the report's
        ``precision`` entry.
    batch_loop : bool
        On CPU targets, a symbolic dim that leads every tensor holding it, and over which
        every kernel is separable, in a graph with convs or pools over it (a CNN's
        dynamic batch) is compiled as a loop over a one-sample build
        (``lowering/batch_loop.py``); False keeps it symbolic.

    Raises
    ------
    CompileError, targets.TargetError, passes.PassConfigError
        With a message naming what is wrong.
    """
    t0 = time.perf_counter()
    pass_config_in = pass_config  # the caller's, for the fp32 build precision_check makes
    database = _open_tuning_db(tuning_db)
    stage = _Stages(model_label(model))
    where = stage.where
    tinfo = targets.resolve(target)
    precisions.check(precision, tinfo, where)
    pass_config, layout_report = _choose_layout(layout, tinfo, pass_config, disabled_passes)
    pass_config = precisions.pass_config(precision, tinfo, pass_config)
    rows_config = pass_config  # before _one_row_dims: the batch loop's analysis sets its own
    pass_config = _one_row_dims(dims, pass_config)
    ctx = passes.PassContext(opt_level=opt_level, disabled=disabled_passes,
                             required=required_passes, config=pass_config, dump_ir=dump_ir)
    load_warnings: list = []  # free text read with escapes (loader.check_text)
    proto, onnx_folded, graph = _front(model, ctx, stage, load_warnings, dims)
    ranges = resolve_ranges(graph.dim_names, dims, where, graph.dim_caps)
    if ranges and tinfo.is_cuda:
        raise CompileError(f"{where}: symbolic dims {graph.dim_names} on a CUDA target: the "
                           "device runtime plans static shapes only; give input_shapes=")
    loop = (stage("batch_loop", _loop_decision, model, graph, ranges, rows_config,
                  dict(opt_level=opt_level, disabled=disabled_passes,
                       required=required_passes), where)
            if ranges and batch_loop and tinfo.is_cpu else None)
    if loop is not None:
        return _compile_batch_loop(
            model, proto, graph, loop, ranges, t0, target=target, opt_level=opt_level,
            disabled_passes=disabled_passes, required_passes=required_passes,
            pass_config=pass_config_in, layout=layout, tuning_db=database,
            memory_reuse=memory_reuse, dump_ir=dump_ir, precision=precision,
            precision_check=precision_check)
    at_opt = {d["name"]: d["opt"] for d in ranges}
    if ranges:
        flops_at(graph, at_opt)
        # rules read each dim's opt (a decoder's seq opt 1: one-row attention kernels); the
        # build asserts each dim's range to TVM's lowering (lowering/assume_dim_ranges.py)
        graph.prim_funcs = annotate_dim_opt(graph.prim_funcs, at_opt, _min_max(ranges))
        # symbolic-row matmuls get variants of other row tiles: one-row ones (seq opt 1)
        # a padded one for prompts, padded ones smaller tiles for few rows
        row_variants = stage("row_variants", add_row_variants, graph,
                             *_padded_rows(pass_config), graph.dim_names)
    else:
        row_variants = []
    if tinfo.is_cuda or ranges:  # unscheduled GPU kernels do not build; checked variants
        # of symbolic kernels would need their temporaries' shapes bound: none for now
        graph.checked = {}
        for call in graph.calls:
            call.pop("checked", None)
    if tinfo.is_cpu:  # kernels read model inputs where the caller's array lies
        graph.input_align = input_alignment.mark(graph)
    # groups of kernels are scheduled and built in worker processes while this one does
    # its own group (compiler/lowering/parallel_build.py): "schedule" and "build" time it
    # (forked outside any stage: a child holding the stage's log pipe would keep it open);
    # the checked variants in a child of their own, else in "build_checked" after
    # ("build" is this process's group, "build_wait" the rest of the workers' time); the
    # memory plan reads which rule scheduled each kernel (a softmax runs in place only under
    # cpu.row_reduction's order: compiler/lowering/inplace.py), so it follows them (the
    # workers have finished before this process's own group in the models measured)
    with _start_build(graph.prim_funcs, tinfo, database, graph.checked) as workers:
        kernels_mod, rules = stage("schedule", _schedule_module, workers.local, tinfo,
                                   database)
        stage("build", _build, workers.build_local, kernels_mod, tinfo, where)
        kernels, more_rules, build_groups = stage("build_wait", _build, workers.finish,
                                                  None, tinfo, where)
    rules.update(more_rules)
    graph_meta, plan = stage("plan_memory", plan_storage, graph, memory_reuse, ranges, rules)
    stage.cpu_seconds["build_workers"] = workers.worker_cpu  # the children, not a stage
    if workers.side is not None:
        stage("build_checked", _build_checked, kernels, graph.checked, tinfo, where)
    payload = graph_meta.pop("params_payload")

    manifest = _manifest(proto, tinfo, graph_meta, payload, model)
    manifest["precision"] = precision
    if ranges:
        manifest["dims"] = ranges
    meta = {"manifest": manifest, "graph": graph_meta, "memory_plan": plan.to_dict()}
    report = {
        "kernels": len(graph_meta["calls"]),
        "onnx_nodes_folded": onnx_folded,
        # outputs that are constants: computed at compile time, by no kernel
        "constant_outputs": [o["name"] for o in graph_meta["outputs"]
                             if graph_meta["tensors"][o["tensor"]]["storage"] == "param"],
        "distinct_kernels": len(graph.prim_funcs),
        # one-row kernels with a padded-tile variant the runtime runs for several rows
        "row_variants": row_variants,
        "checked_kernels": len(graph.checked),  # fused kernels with a checked variant
        "passes": [r.to_dict() for r in ctx.reports],
        "memory": {"arena_bytes": plan.arena_bytes, "lower_bound_bytes": plan.lower_bound_bytes,
                   "no_reuse_bytes": plan.no_reuse_bytes, "params_bytes": len(payload),
                   "algorithm": plan.algorithm, "memory_reuse": memory_reuse,
                   "inplace_outputs": sum(len(c.get("inplace", [])) for c in graph_meta["calls"])},
        # concats by placement (compiler/lowering/graph.py place_concats): no kernel, the
        # bytes a concat kernel would copy per run; and the marked ones kept as kernels, why
        "concats": {"placed": len(graph.concats.get("placed", [])),
                    "bytes_not_copied": sum(p["bytes"] for p in graph.concats.get("placed", [])),
                    "kernels": graph.concats.get("kernels", [])},
        # key/value caches appended in place (passes/seq_major_cache.py, graph.py
        # place_kv_caches): {input, output, nodes} each, and the marked ones kept copying,
        # why (caches the pass refused: its report, "kept copying: <why>")
        "kv_caches": {"placed": graph.kv_caches.get("placed", []),
                      "kept": graph.kv_caches.get("kept", [])},
        "compile_seconds": round(time.perf_counter() - t0, 3),
        "stages": stage.seconds,
        "stages_cpu": stage.cpu_seconds,
        "build_groups": build_groups,  # kernels built per worker process
        "target": tinfo.to_dict(),
        "layout": {**layout_report, **_layout_outcome(ctx)},
        "schedules": _count(rules.values()),
        **_tuning_report(database, graph.prim_funcs, tinfo, rules),
        "kernel_table": kernel_table(graph_meta, rules, at_opt),
        "dims": ranges,
    }
    report["warnings"] = load_warnings + [w for w in [generic_warning(report["kernel_table"],
                                                                      where)] if w]
    report["warnings"] += [
        f"dim {d['name']!r} has no declared range: default {d['min']}..{d['max']} (arena "
        f"planned for {d['max']}); declare it with --dim {d['name']}=MIN..MAX[:OPT]"
        for d in ranges if not d["declared"]]
    report["warnings"] += [
        f"dim {d['name']!r} compiled for {d['min']}..{d['max']}, not up to "
        f"{d['narrowed']['max']}: {d['narrowed']['why']} (run() refuses larger values)"
        for d in ranges if "narrowed" in d]
    cm = CompiledModel(kernels, meta, payload, report, toolchain=tinfo.toolchain)

    def rebuild(p, other_target):
        return compile_static(model, other_target or tinfo, opt_level=opt_level,
                              disabled_passes=disabled_passes, required_passes=required_passes,
                              pass_config=pass_config_in,
                              layout=layout, memory_reuse=memory_reuse, dims=dims,
                              precision=p, precision_check=False)

    runnable = (tinfo.is_cpu and tinfo.toolchain is None
                and not runtime.cpu_features.missing_features(tinfo.features, tinfo.arch))
    report["precision"] = stage("precision_check", precisions.error_entry, cm, precision,
                                rebuild, runnable, precision_check)
    slow = precisions.speed_warning(precision, tinfo)
    if slow:
        report["warnings"].append(slow)
    err = report["precision"]["max_rel_error"]
    if err is not None and err > precisions.WARN_ABOVE:
        report["warnings"].append(
            f"precision {precision}: max relative error {err:.3g} against the fp32 build "
            f"({report['precision']['error_source']}) is above {precisions.WARN_ABOVE}")
    report["compile_seconds"] = round(time.perf_counter() - t0, 3)
    log.info("compiled %s: %d kernel calls in %.1fs", where, report["kernels"],
             report["compile_seconds"])
    return cm


def _loop_decision(model, graph, ranges: list, rows_config, ctx_args: dict,
                   where: str) -> dict | None:
    """The range entry of the dim to compile as a batch loop (``lowering/batch_loop.py``),
    or None.  A dim's opt above 1 pads symbolic matmul rows into register tiles, which
    mixes samples in the kernels' iteration space: then the analysis reads a front half
    built with every dim at opt 1 (or its min, when above 1)."""
    loop = loop_dim(graph, ranges)
    if loop is None and any(d["opt"] != 1 for d in ranges) and worth_looping(graph, ranges):
        one = {d["name"]: (d["min"], d["max"], max(d["min"], 1)) for d in ranges}
        ctx = passes.PassContext(config=_one_row_dims(one, rows_config), **ctx_args)
        _, _, at_one = _front(model, ctx, _Stages(where), [], one)
        found = loop_dim(at_one, resolve_ranges(at_one.dim_names, one, where,
                                                at_one.dim_caps))
        loop = next((d for d in ranges if found and d["name"] == found["name"]), None)
    return loop


def _loop_dims(loop: dict, ranges: list) -> dict | None:
    """``dims=`` of the one-sample build: the other dims the caller declared."""
    rest = {d["name"]: (d["min"], d["max"], d["opt"]) for d in ranges
            if d["name"] != loop["name"] and d["declared"]}
    return rest or None


def _compile_batch_loop(model, proto, graph, loop: dict, ranges: list, t0: float,
                        **kwargs) -> CompiledModel:
    """The model compiled with the dim ``loop`` fixed to 1, for the runtime to run once per
    sample (``lowering/batch_loop.py``, ``runtime/batch_loop.py``): its manifest's inputs
    and outputs that lead with the dim say so, ``manifest["batch_loop"]`` names them, and
    the dim's range joins ``manifest["dims"]`` (the range a run is checked against)."""
    name = loop["name"]
    if not loop["declared"]:  # the build is per sample: timing and FLOPs default to one
        loop = {**loop, "opt": 1}
    cm = compile_static(fix_dim(proto, name, 1), batch_loop=False,
                        dims=_loop_dims(loop, ranges), **kwargs)
    looped = {n for n, t in graph.inputs + graph.outputs
              if graph.tensors[t].shape[:1] == [name]}
    manifest, report = cm.meta["manifest"], cm.report
    for io in manifest["inputs"] + manifest["outputs"]:
        if io["name"] in looped:
            io["shape"] = [name] + list(io["shape"][1:])
    manifest["batch_loop"] = {
        "dim": name,
        "inputs": [io["name"] for io in manifest["inputs"] if io["name"] in looped],
        "outputs": [io["name"] for io in manifest["outputs"] if io["name"] in looped]}
    manifest["dims"] = [loop] + list(manifest.get("dims", ()))
    manifest["model"]["sha256"] = _model_sha256(model)
    report["batch_loop"] = {**loop, **manifest["batch_loop"],
                            "why": "every kernel over it is separable by sample; the "
                                   "kernel table's FLOPs are per sample"}
    report["dims"] = [loop] + list(report.get("dims") or ())
    if not loop["declared"]:
        report["warnings"].append(
            f"dim {name!r} has no declared range: default {loop['min']}..{loop['max']}; "
            f"declare it with --dim {name}=MIN..MAX[:OPT]")
    report["compile_seconds"] = round(time.perf_counter() - t0, 3)
    log.info("compiled %s with dim %r as a loop over one sample", model_label(model), name)
    return cm


def _choose_layout(layout: str, tinfo, pass_config, disabled) -> tuple:
    """(pass config with convert_layout's layout and block set, and pack_matmul_weights'
    rows (``_matmul_tiles``), the report's layout entry).

    ``auto`` is NCHW[b]c on CPU targets (b = fp32 lanes: the conv kernels' vector) and
    NCHW on CUDA (whose conv kernels are TVM's dlight rules over NCHW).  Options the user
    set for convert_layout in ``pass_config`` win over ``layout``."""
    if layout not in ("auto", *passes.convert_layout.LAYOUTS):
        raise CompileError(f"layout {layout!r} is not one of auto, "
                           f"{', '.join(passes.convert_layout.LAYOUTS)}")
    block = tinfo.lanes_fp32
    if layout == "auto":
        chosen = "NCHWc" if tinfo.is_cpu else "NCHW"
        why = (f"auto on a CPU target: NCHW{block}c, {block} = fp32 lanes of {tinfo.cpu}, "
               "so conv kernels load and store whole vectors of channels" if tinfo.is_cpu
               else "auto on CUDA: NCHW, the layout of the GPU conv schedules")
    else:
        chosen, why = layout, "requested"
    config = {k: dict(v) for k, v in (pass_config or {}).items()}
    opts = config.setdefault("convert_layout", {})
    opts.setdefault("layout", chosen)
    opts.setdefault("block", block)
    # QDQ convs go integer only where convert_layout will block them (whole output blocks)
    qdq = config.setdefault("qdq_conv_integer", {})
    qdq.setdefault("layout", opts["layout"] if "convert_layout" not in set(disabled)
                   else "NCHW")
    qdq.setdefault("block", opts["block"])
    # and conv activations take no lookup tables where convert_layout blocks them
    config.setdefault("qdq_lookup_table", {}).setdefault("layout", qdq["layout"])
    if "convert_layout" in set(disabled):
        why = "convert_layout disabled: the model's NCHW"
    entry = {"requested": layout, "chosen": opts["layout"] if "convert_layout" not in
             set(disabled) else "NCHW", "block": opts["block"], "why": why}
    return _kv_caches(tinfo, _int8_dot(tinfo, _conv_tiles(tinfo, _matmul_tiles(
        tinfo, config)))), entry


def _kv_caches(tinfo, pass_config) -> dict:
    """pass_config with seq_major_cache off (``cpu`` False) on non-CPU targets: the GPU
    runtime (runtime/device.py) has no permuted inputs or offsets that are expressions;
    and widen_half off there (GPUs compute float16 natively)."""
    if tinfo.is_cpu:
        return pass_config
    config = {k: dict(v) for k, v in (pass_config or {}).items()}
    config.setdefault("seq_major_cache", {}).setdefault("cpu", False)
    config.setdefault("widen_half", {}).setdefault("enabled", False)
    return config


def _int8_dot(tinfo, pass_config) -> dict:
    """pass_config with pack_int_matmul's and pack_int_conv's ``u8_dot`` set to the
    target's u8 x s8 dot (``targets.int8_dot``: vpdpbusd on VNNI, vpmaddubsw on AVX2 /
    AVX-512BW; "" elsewhere), so u8 activations by s8 weights are packed by fours for it
    (passes/int8_quads.py), and pack_int_matmul's ``panel`` to the target's register tile;
    options the user set win (``exact`` keeps vpmaddwd)."""
    if not tinfo.is_cpu:
        return pass_config
    from schedules.cpu import common

    kind = targets.int8_dot(tinfo.arch, tinfo.features) or ""
    config = {k: dict(v) for k, v in (pass_config or {}).items()}
    for name in ("pack_int_matmul", "pack_int_conv"):
        config.setdefault(name, {}).setdefault("u8_dot", kind)
    # integer matmul panels four int32 vectors wide where 32 vector registers hold a 6 x 4
    # tile (AVX-512: 64 columns), else two (AVX2: 16): each k step then loads 4 weight
    # vectors and 6 broadcasts for 24 dots, against 1 and 10 for 10 with one-vector
    # panels.  QDQ ViT-B's MLP matmuls (197 x 768 x 3072, vpdpbusd), one thread, paired:
    # 64 / 16 columns 0.78; dynamic-int8 BERT's 0.85; 32 columns measured like 64
    target = tinfo.tvm_target()
    vectors = 4 if common.vector_registers(target) >= 32 else 2
    config["pack_int_matmul"].setdefault("panel", vectors * common.lanes_fp32(target))
    return config


def _min_max(ranges: list) -> dict:
    """{dim: (min, max)} of ``resolve_ranges``' list."""
    return {d["name"]: (d["min"], d["max"]) for d in ranges}


def _padded_rows(pass_config) -> tuple:
    """(the rows pack_matmul_weights pads a matmul to: the target's full register tile,
    its ``rows`` option set by ``_matmul_tiles``; whether some kernels are one-row: its one-
    row dims are set) for compiler/lowering/row_variants.py."""
    opts = (pass_config or {}).get("pack_matmul_weights", {})
    return int(opts.get("rows", 1)), bool(opts.get("one_row_dims"))


def _one_row_dims(dims, pass_config) -> dict:
    """pass_config with pack_matmul_weights' ``one_row_dims``: the dims declared with opt 1
    (``dims={"seq": (1, 128, 1)}``, a decoder compiled for its one-token steps), whose
    matmuls against constant weights then compute one row per row, not a padded register
    tile; options the user set win."""
    one = tuple(sorted(n for n, r in (dims or {}).items()  # opt 1, or the range 1..1
                       if (len(tuple(r)) == 3 and int(tuple(r)[2]) == 1)
                       or (len(tuple(r)) == 2 and int(tuple(r)[1]) == 1)))
    if not one:
        return pass_config
    config = {k: dict(v) for k, v in (pass_config or {}).items()}
    config.setdefault("pack_matmul_weights", {}).setdefault("one_row_dims", one)
    return config


def _matmul_tiles(tinfo, pass_config) -> dict:
    """pass_config with pack_matmul_weights' ``panel`` and ``rows`` set to the register tile
    cpu.matmul_packed makes on this target: panels two fp32 vectors wide (16 columns on
    AVX2, 32 on AVX-512, 8 on NEON) and as many rows as the accumulator budget leaves (6 on
    AVX2's 16 registers, 12 on AVX-512's 32), so M is padded to whole tiles where its
    divisors would make thin ones; options the user set win.

    Two vectors, not four: each k step loads ``nr`` weights for ``mr x nr / lanes`` FMAs,
    so the taller tile halves the weight bytes per FMA (the K x nr panel streams from L2).
    Zen 3, single thread, onnxc kernel / onnxruntime: 4-vector 3 x 32 tiles vs 6 x 16
    (scripts/kernel_grid.py shapes): Whisper MLP 1500x512x2048 2.08 -> 1.06, LLaMA MLP
    77x1024x2816 1.86 -> 0.89, ViT 577x768x3072 1.19 -> 0.95."""
    if not tinfo.is_cpu:
        return pass_config
    from schedules.cpu import common

    config = {k: dict(v) for k, v in (pass_config or {}).items()}
    opts = config.setdefault("pack_matmul_weights", {})
    target = tinfo.tvm_target()
    lanes = common.lanes_fp32(target)
    opts.setdefault("panel", 2 * lanes)
    panel = int(opts["panel"])
    vectors = -(-panel // lanes)
    opts.setdefault("rows", max(1, common.acc_budget(target, "matmul") // vectors))
    return config


def _conv_tiles(tinfo, pass_config) -> dict:
    """pass_config with pack_conv_weights' and pack_conv_transpose's channel ``blocks`` (two
    fp32 vectors first: 16 channels on AVX2, 32 on AVX-512), the target's ``lanes`` and the
    ``accumulators`` of cpu.conv2d_packed's register tile (12 on 16 vector registers, 20
    on 32), from which the pass pads 1-D output widths to whole tiles; options the user
    set win.

    Two-vector blocks, as for matmul panels: a 4-vector block on AVX2 leaves tiles of 3
    pixels and streams twice the weight bytes per FMA.  Zen 3, single thread, wav2vec2's
    feature-encoder conv (512 -> 512, k 3, s 2, 1599 outputs): 32-channel blocks with
    3-pixel tiles 25-32 GFLOP/s; 16-channel blocks, 6-pixel tiles over 1602 padded
    columns, taps outside the channel loop: 54-63 GFLOP/s."""
    if not tinfo.is_cpu:
        return pass_config
    from schedules.cpu import common

    config = {k: dict(v) for k, v in (pass_config or {}).items()}
    opts = config.setdefault("pack_conv_weights", {})
    target = tinfo.tvm_target()
    lanes = common.lanes_fp32(target)
    # the same channel counts pack as with the pass's default blocks (whole 16-channel
    # multiples), two vectors preferred
    blocks = passes.PackConvWeights.options["blocks"]
    opts.setdefault("blocks", tuple(sorted(blocks, key=lambda b: b != 2 * lanes)))
    opts.setdefault("lanes", lanes)
    opts.setdefault("accumulators", common.acc_budget(target))
    # transposed convs: the same two-vector blocks first.  Zen 3 (AVX2), single thread,
    # kernel / onnxruntime, 32-channel blocks (4 vectors: 1-vector register tiles, each
    # tile streaming a 128 KB weight block from L2) -> 16: U-Net k2 s2 1.25 -> 1.02,
    # DCGAN k4 s2 p1 1.14 -> 0.79, HiFi-GAN-like 1-D k4 s2 p1 1.55 -> 1.31
    transposed = passes.PackConvTranspose.options["blocks"]
    config.setdefault("pack_conv_transpose", {}).setdefault(
        "blocks", tuple(sorted(transposed, key=lambda b: b != 2 * lanes)))
    # the transposed convs those blocks leave (no block divides their channels) are the
    # ones conv_transpose_as_conv rewrites
    config.setdefault("conv_transpose_as_conv", {}).setdefault(
        "blocks", config["pack_conv_transpose"]["blocks"])
    return config


def _layout_outcome(ctx) -> dict:
    """How many convs convert_layout converted and the activation transforms it left."""
    rep = next((r for r in ctx.reports if r.name == "convert_layout"), None)
    if rep is None or rep.skipped:
        return {"convs_converted": 0}
    kept = [k for k in rep.rewrites if k.startswith("kept NCHW")]
    if kept:  # an op whose blocked layout TVM gets wrong: the whole graph stays NCHW
        return {"chosen": "NCHW", "why": f"{kept[0]} (node {', '.join(rep.nodes) or '?'})",
                "convs_converted": 0}
    conv = sum(v for k, v in rep.rewrites.items() if k.startswith("conv2d NCHW =>"))
    return {"convs_converted": conv,
            "activation_transforms": rep.rewrites.get("activation layout_transforms", 0)}


class _Stages:
    """Runs compile stages: times each, routes TVM's native log lines through logging
    (``compiler/native_log.py``), and turns a failure inside TVM into a CompileError naming
    the stage instead of a bare traceback."""

    def __init__(self, where: str):
        self.where, self.seconds, self.cpu_seconds = where, {}, {}

    def __call__(self, name, fn, *args):
        stage_log.debug("stage %s", name)
        s, c = time.perf_counter(), time.process_time()
        try:
            with routed():
                result = fn(*args)
        except (CompileError, targets.TargetError, passes.PassConfigError):
            raise
        except Exception as e:  # TVM's own checks
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise CompileError(f"{self.where}: {name} failed ({type(e).__name__}): "
                               f"{lines[-1] if lines else 'no message'}") from e
        self.seconds[name] = round(time.perf_counter() - s, 3)
        # this process's CPU time (its threads, not the build workers): on a loaded host
        # the wall seconds above measure the load as much as the stage
        self.cpu_seconds[name] = round(time.process_time() - c, 3)
        return result


def model_label(model) -> str:
    """How errors name the model: its path, else its graph name (escaped if it is not
    UTF-8: the loader refuses such a model, and its message must still be text)."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    return text(getattr(getattr(model, "graph", None), "name", "")) or "model"


def _front(model, ctx, stage: _Stages, warnings: list | None = None, dims=None):
    """load -> fold ONNX shape arithmetic -> import -> graph passes -> lower -> extract.

    Returns (checked proto, ONNX nodes folded, KernelGraph with unscheduled kernels); the
    loader's warnings go to ``warnings`` (else to the log).  An input's ``-1`` dim (named by
    the loader) stays symbolic only when ``dims`` gives it a range, else it is refused and
    the model compiles per shape (``frontend/lenient.py`` says why).  The declared ranges
    bound the dims wherever shapes are reasoned about (``shape_arith.declared_ranges``).
    """
    with declared_ranges(dims) as caps:
        proto, onnx_folded, graph = _front_in_ranges(model, ctx, stage, warnings, dims)
    graph.dim_caps = dict(caps)
    return proto, onnx_folded, graph


def _front_in_ranges(model, ctx, stage: _Stages, warnings: list | None, dims):
    lenient_dims: list = []
    proto = stage("load", load_model, model, warnings, lenient_dims)
    per_shape = {d for d in lenient_dims if d not in (dims or {})}
    # the loader's proto is the compile's own: folded in place, not copied
    proto, onnx_folded = stage("fold_onnx", fold_onnx_constants, proto, True)
    ctx.node_names = [n.name or f"#{i}" for i, n in enumerate(proto.graph.node)]  # for reports
    signature = input_signature(proto, stage.where, symbolic=True, per_shape=per_shape)
    output_names = [o.name for o in proto.graph.output]
    # CPU targets: RNN / GRU / LSTM layers as one recurrence kernel (converters/rnn.py),
    # TopK and CumSum as selection and scan kernels (schedules/cpu/topk.py, scan.py)
    with cpu_kernels(ctx.config.get("pack_conv_weights", {}).get("lanes")):
        imported = stage("import", import_onnx, proto, stage.where, None, None, True,
                         per_shape)
    mod = stage("graph_passes", ctx.run, graph_passes(), imported)
    layouts = binding_layouts(mod)  # before lowering: conv / transform attrs say it
    try:
        mod, groups, members, fused = stage("lower", _lower, mod, ctx, dims)
    except CompileError as e:
        if not (dims and _converted(ctx)):
            raise
        # a symbolic image's blocked graph that TVM fails to lower (FuseTIR on shape
        # expressions it cannot equate): the graph passes again, convs kept NCHW
        why = str(e).split(": ", 1)[-1]
        ctx.reports.clear()
        ctx.config = {**ctx.config, "convert_layout": {
            **ctx.config.get("convert_layout", {}), "layout": "NCHW"}}
        mod = stage("graph_passes", ctx.run, graph_passes(), imported)
        layouts = binding_layouts(mod)
        mod, groups, members, fused = stage("lower", _lower, mod, ctx, dims)
        message = f"the blocked layout failed to lower over symbolic dims ({why}): NCHW kept"
        if warnings is not None:
            warnings.append(message)
        else:
            log.warning("%s: %s", stage.where, message)
    nodes = [(n.name or f"#{i}", n.op_type) for i, n in enumerate(proto.graph.node)]
    graph = stage("extract", extract, mod, [s["name"] for s in signature], output_names,
                  stage.where, groups, nodes)
    for t in graph.tensors:
        t.layout = layouts.get(t.name)
    graph.onnx_outputs = [list(n.output) for n in proto.graph.node]
    if not graph.dim_names:  # a symbolic kernel's temporaries have no static shape
        stage("checked_variants", attach_checked, graph, fused, members, layouts)
    return proto, onnx_folded, graph


def _converted(ctx) -> bool:
    """Whether convert_layout rewrote the graph in this context's pass run."""
    return any(r.name == "convert_layout" and r.changed for r in ctx.reports)


def _lower(mod, ctx, dims=None):
    """Run the lowering list; returns (module, {fused kernel name: [ONNX node indices]},
    {fused call: (function, pre-fusion name per binding)}, the fused functions' steps).
    ``dims``: the declared ranges, whose opt values symbolic conv widths are tiled for."""
    import tvm

    groups, members, fused = {}, {}, {}
    # the CPU conv tile (compile_static's _conv_tiles) for the NCHW[b]c conv legalization
    tiles = ctx.config.get("pack_conv_weights", {})
    opt = {name: int(tuple(r)[-1]) for name, r in (dims or {}).items()}
    padding = (legalize_conv_nchwc.register_tiles(tiles["lanes"], tiles["accumulators"], opt)
               if "lanes" in tiles and "accumulators" in tiles else contextlib.nullcontext())
    with tvm.transform.PassContext(opt_level=3), padding:
        for p in lowering():
            before = mod
            mod = p(mod)
            if p is FUSE:
                mod, groups = name_fused_calls(before, mod, members)
                fused = fused_steps(mod)  # for the checked variants (lowering/checked.py)
    ctx.dump("lowered", mod)
    return mod, groups, members, fused


def _kernel_module(prim_funcs: dict):
    import tvm

    return tvm.IRModule({name: f.with_attr("global_symbol", name)
                         for name, f in prim_funcs.items()})


def _schedule(prim_funcs: dict, tinfo, database=None):
    return _schedule_module(_kernel_module(prim_funcs), tinfo, database)


def _schedule_module(mod, tinfo, database=None):
    """(scheduled module, {kernel: rule}) for the kernels of ``mod``."""
    if tinfo.is_cuda:  # GPU kernels: dlight GPU rules (schedules/cuda), no tuning records yet
        from schedules.cuda import apply_schedules as apply_gpu_schedules

        return apply_gpu_schedules(mod, tinfo)
    return schedules.apply_schedules(mod, tinfo, database)


def _start_build(prim_funcs: dict, tinfo, database, checked: dict):
    """The parallel build plan: kernels for a CPU target built here (no cross toolchain)
    are split over worker processes, each scheduling its share, and the checked variants
    (if any) built in one more; others stay in one piece (``plan.side``: the checked
    variants for ``_build_checked``)."""
    mod = _kernel_module(prim_funcs)
    side = (_checked_module(checked), _checked_target(tinfo),
            "the checked kernel variants") if checked else None
    if not (tinfo.is_cpu and tinfo.toolchain is None):
        return parallel_build.Plan(mod, tinfo.tvm_target(), side=side)
    return parallel_build.start(mod, tinfo.tvm_target(),
                                prepare=lambda group: _schedule_module(group, tinfo, database),
                                side=side)


def _build(step, mod, tinfo, where: str):
    """``step(mod)``: a build plan's ``build_local`` (this process's group) or ``finish``
    ((built kernels, {kernel: rule} of the workers' kernels, kernels per build group)); a
    failure is a CompileError naming the target."""
    try:
        return step(mod)
    except Exception as e:
        lines = str(e).strip().splitlines()
        raise CompileError(f"{where}: building kernels for {tinfo.name} failed: "
                           f"{lines[-1] if lines else type(e).__name__}") from e


def _build_checked(kernels, checked: dict, tinfo, where: str) -> None:
    """Build the checked variants (compiler/lowering/checked.py) into ``kernels``.

    They run only when a NaN check fires or ``onnxc debug`` localises a divergence, so
    they are built unscheduled and at LLVM -O0, as a module imported by the kernels' own
    (one .so all the same): on the cnn zoo model 0.26 s, against 0.7 s in the kernels'
    build at -O3."""
    import tvm

    try:
        lib = parallel_build.compile_kernels(_checked_module(checked), _checked_target(tinfo))
    except Exception as e:
        lines = str(e).strip().splitlines()
        raise CompileError(f"{where}: building the checked kernel variants for {tinfo.name} "
                           f"failed: {lines[-1] if lines else type(e).__name__}") from e
    kernels.mod.import_module(lib.mod)


def _checked_module(checked: dict):
    import tvm

    return tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in checked.items()})


def _checked_target(tinfo):
    """The kernels' target at LLVM -O0 (the checked variants: ``_build_checked``)."""
    import tvm

    spec = {k: v for k, v in dict(tinfo.tvm_target().export()).items() if k != "tag"}
    return tvm.target.Target({**spec, "opt-level": 0})


def _count(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _model_sha256(model) -> str:
    """sha256 of the serialized ONNX model as given: the file's bytes for a path (external
    data files are not included: ``params_sha256`` covers the weights), else the proto's
    serialization."""
    if isinstance(model, onnx.ModelProto):
        return hashlib.sha256(model.SerializeToString()).hexdigest()
    h = hashlib.sha256()
    with open(model, "rb") as f:  # read moments ago by the loader
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest(proto: onnx.ModelProto, tinfo, graph_meta: dict, payload: bytes,
              model) -> dict:
    import tvm

    narrow = io_types(proto)  # bfloat16, float8, int4...: the runtime views their codes

    def sig(items):
        return [{"name": it["name"], "shape": graph_meta["tensors"][it["tensor"]]["shape"],
                 "dtype": graph_meta["tensors"][it["tensor"]]["dtype"],
                 **({"elem_type": narrow[it["name"]].name,
                     "ml_dtype": narrow[it["name"]].ml_dtype} if it["name"] in narrow else {})}
                for it in items]

    return {
        "format_version": runtime.FORMAT_VERSION,
        "onnxc_version": __version__,
        "tvm_version": tvm.__version__,
        "target": tinfo.to_dict(),
        "inputs": sig(graph_meta["inputs"]),
        "outputs": sig(graph_meta["outputs"]),
        "params_sha256": hashlib.sha256(payload).hexdigest(),
        "index_bounds": index_bounds(proto),
        "model": {"graph_name": proto.graph.name, "producer": proto.producer_name,
                  "opsets": {o.domain or "ai.onnx": o.version for o in proto.opset_import},
                  "sha256": _model_sha256(model)},
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "built_by": f"{_user()}@{socket.gethostname()}",
        "built_on": platform.platform(),
    }


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return str(os.getuid())


# -- tuning hooks (compiler/tools/tune.py, schedules/database.py) ------------------------------


def lower_to_kernels(model, target="host", *, opt_level: int = 3, disabled_passes=(),
                     required_passes=(), pass_config=None, layout: str = "auto", dump_ir=None,
                     **_build_only):
    """compile_static()'s stages up to the kernels, without scheduling or building.

    Returns (graph, prim_funcs): the :class:`compiler.graph.KernelGraph` (``graph.calls``
    in execution order) and its unscheduled kernels {symbol: PrimFunc}.  Tuning jobs
    extract their tasks here, so they tune exactly the kernels compile_static() builds.  Keywords
    that only affect scheduling, building or memory (tuning_db, memory_reuse) are
    accepted and ignored, so callers can pass compile_static()'s keywords as they are.
    """
    _, _, graph = _front_only(model, target, opt_level, disabled_passes, required_passes,
                              pass_config, layout, dump_ir, **_build_only)
    return graph, graph.prim_funcs


def schedule_kernels(model, target="host", *, tuning_db=None, **front_kwargs):
    """compile_static()'s stages up to and including scheduling, without building.

    Returns (scheduled IRModule {symbol: PrimFunc}, {symbol: rule}, pass reports as dicts):
    exactly what compile_static() hands to ``tvm.compile``, so tools can fingerprint the scheduled
    TIR (``scripts/schedule_fingerprint.py``) without the cost of a build.  Keywords are
    those of :func:`lower_to_kernels`.
    """
    tinfo, ctx, graph = _front_only(model, target, **front_kwargs)
    mod, rules = _schedule(graph.prim_funcs, tinfo, _open_tuning_db(tuning_db))
    return mod, rules, [r.to_dict() for r in ctx.reports]


def _front_only(model, target, opt_level: int = 3, disabled_passes=(), required_passes=(),
                pass_config=None, layout: str = "auto", dump_ir=None, **_build_only):
    """(TargetInfo, PassContext, KernelGraph): the front half of compile_static() on its own
    (of the one-sample build where compile_static() would loop over a batch dim)."""
    pass_config_arg = pass_config
    tinfo = targets.resolve(target)  # the same refusals as compile_static()
    pass_config, _ = _choose_layout(layout, tinfo, pass_config, disabled_passes)
    rows_config = pass_config
    pass_config = _one_row_dims(_build_only.get("dims"), pass_config)
    ctx = passes.PassContext(opt_level=opt_level, disabled=disabled_passes,
                             required=required_passes, config=pass_config, dump_ir=dump_ir)
    dims = _build_only.get("dims")
    proto, _, graph = _front(model, ctx, _Stages(model_label(model)), dims=dims)
    ranges = resolve_ranges(graph.dim_names, dims, model_label(model), graph.dim_caps)
    if ranges and _build_only.get("batch_loop", True) and tinfo.is_cpu:
        loop = _loop_decision(model, graph, ranges, rows_config,
                              dict(opt_level=opt_level, disabled=disabled_passes,
                                   required=required_passes), model_label(model))
        if loop is not None:  # tune and fingerprint the kernels the build will have
            return _front_only(fix_dim(proto, loop["name"], 1), target, opt_level,
                               disabled_passes, required_passes, pass_config_arg, layout,
                               dump_ir, **{**_build_only, "batch_loop": False,
                                           "dims": _loop_dims(loop, ranges)})
    if ranges:  # the rules read each dim's opt, as in compile_static()
        graph.prim_funcs = annotate_dim_opt(graph.prim_funcs,
                                            {d["name"]: d["opt"] for d in ranges},
                                            _min_max(ranges))
    return tinfo, ctx, graph


def _open_tuning_db(tuning_db):
    from schedules.database import DatabaseError, TuningDatabase

    if tuning_db is None or isinstance(tuning_db, TuningDatabase):
        return tuning_db
    try:
        return TuningDatabase(tuning_db)
    except DatabaseError as e:
        raise CompileError(str(e)) from None


def _tuning_report(database, prim_funcs: dict, tinfo, rules: dict) -> dict:
    """The report's tuned_kernels / untuned_kernels / tuning entries.

    A kernel is tuned when a database record decided its schedule: the tuned trace, or
    our default rule where tuning did not beat it (the record keeps the default).
    """
    if database is None:
        return {"tuned_kernels": 0, "untuned_kernels": len(prim_funcs), "tuning": None}
    matched = {name: database.lookup(f, tinfo) for name, f in prim_funcs.items()}
    tuned_schedule = sum(r == "tuned" for r in rules.values())
    default_kept = sum(1 for r in matched.values() if r and r["winner"] == "default")
    return {
        "tuned_kernels": tuned_schedule + default_kept,
        "untuned_kernels": len(prim_funcs) - tuned_schedule - default_kept,
        "tuning": {
            "database": database.path,
            "target_file": os.path.basename(database.file_for(tinfo)),
            "records_for_target": len(database.records(tinfo)),
            "tuned_schedule": tuned_schedule,
            "default_kept": default_kept,
            "no_record": sum(1 for r in matched.values() if r is None),
            "replay_failed": sum(1 for n, r in matched.items()
                                 if r and r["winner"] == "tuned" and rules.get(n) != "tuned"),
            "warnings": list(database.warnings),
        },
    }
