"""The ``onnxc`` command line (DESIGN.md): compile, run, memplan, ops.

Exit status: 0 success, 1 a user-facing error (message on stderr, no traceback unless
``--verbose``), 2 bad arguments (argparse).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


class UsageError(Exception):
    """A user mistake the CLI reports with exit status 1."""


def _add_compile(sub):
    p = sub.add_parser("compile", help="compile an ONNX model into one .so")
    p.add_argument("model", help="the .onnx file")
    p.add_argument("-o", "--output", required=True, help="the .so to write")
    p.add_argument("--target", default="host", help="host, x86, x86-avx2, x86-avx512, arm, "
                   "arm-dotprod, arm-i8mm, arm-sve, cuda, cuda:sm_XX or a TVM target JSON dict "
                   "(default: host)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(4))
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME")
    p.add_argument("--layout", default="auto", choices=["auto", "NCHW", "NHWC", "NCHWc"])
    p.add_argument("--tuning-db", default=None, metavar="DIR")
    p.add_argument("--no-memory-reuse", action="store_true",
                   help="give every tensor its own buffer (for comparison)")
    p.add_argument("--dump-ir", default=None, metavar="DIR",
                   help="write the IR after each pass as DIR/NNN_<pass>.txt")
    p.add_argument("--report", default=None, metavar="REPORT.json")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=MIN..MAX[:OPT]",
                   type=_dim_arg,
                   help="range of a symbolic input dimension (dim_param): one artifact serves "
                        "every value in it, the arena is planned for MAX, OPT (default MAX) is "
                        "what the report's FLOPs assume; undeclared dims get 1..128")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "bf16-emulated"],
                   help="bf16: constant-weight matmuls with bf16 operands and fp32 "
                        "accumulation (needs AVX512-BF16); bf16-emulated: the same numbers "
                        "in fp32 code on any target; the report gives the max relative error "
                        "against the fp32 build")
    p.add_argument("--no-precision-check", action="store_true",
                   help="with --precision bf16: skip the error measurement (the extra fp32 "
                        "build it needs)")
    p.add_argument("--no-batch-loop", action="store_true",
                   help="keep a CNN's dynamic batch symbolic instead of compiling one sample "
                        "and running it once per sample (the default where every kernel "
                        "is separable by sample)")
    p.add_argument("--no-isolate", action="store_true",
                   help="compile in this process instead of a child process (a crash inside "
                        "TVM then kills onnxc itself; useful under a debugger)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="kill the compile process after SECONDS and fail (not with "
                        "--no-isolate)")
    p.set_defaults(func=cmd_compile)


def _add_run(sub):
    p = sub.add_parser("run", help="run a compiled .so")
    p.add_argument("artifact", help="the .so written by `onnxc compile`")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--random-inputs", action="store_true",
                   help="feed seeded random data to every input not given with --input")
    p.add_argument("--output-dir", default=None, metavar="DIR",
                   help="save each output as DIR/<name>.npy")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run N times and print latency statistics")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None, metavar="TRACE.json",
                   help="time every kernel call; write a Chrome trace and print a summary")
    p.add_argument("--check-nan", action="store_true",
                   help="check every kernel's outputs for NaN/Inf; name the first offender")
    p.add_argument("--allow-untrusted-location", action="store_true",
                   help="load the artifact even from a location other users can write "
                        "(loading a .so runs its code; see docs/security.md)")
    p.set_defaults(func=cmd_run)


def _add_memplan(sub):
    p = sub.add_parser("memplan", help="print a compiled model's memory plan")
    p.add_argument("artifact")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="also draw the plan (offset over time); needs matplotlib")
    p.set_defaults(func=cmd_memplan)


def _add_bench(sub):
    p = sub.add_parser("bench", help="compile a model and time it, next to onnxruntime")
    p.add_argument("model")
    p.add_argument("--target", default="host")
    p.add_argument("--tuning-db", default=None, metavar="DIR")
    p.add_argument("--compare", choices=["onnxruntime", "none"], default="onnxruntime")
    p.add_argument("--rounds", type=int, default=5, help="alternating worker processes per engine")
    p.add_argument("--runs", type=int, default=20, help="timed runs per worker")
    p.add_argument("--dim", action="append", default=[], type=_dim_arg,
                   metavar="NAME=MIN..MAX[:OPT]",
                   help="range of a symbolic input dimension, as for compile; the benchmark "
                        "feeds it at OPT (default MAX; undeclared dims get 1..128)")
    p.set_defaults(func=cmd_bench)


def _add_inspect(sub):
    p = sub.add_parser("inspect", help="list the ops a model uses and whether each is supported")
    p.add_argument("model")
    p.add_argument("--target", default="host")
    p.set_defaults(func=cmd_inspect)


def _add_debug(sub):
    p = sub.add_parser("debug", help="find the first tensor where onnxc and a reference differ")
    p.add_argument("model")
    p.add_argument("--compare", choices=["onnxruntime", "reference"], default="onnxruntime")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME")
    p.add_argument("--target", default="host")
    p.add_argument("--layout", default="auto", choices=["auto", "NCHW", "NHWC", "NCHWc"],
                   help="compile in this activation layout; tensors are compared after "
                        "mapping back to the ONNX layout")
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_debug)


def _add_ops(sub):
    p = sub.add_parser("ops", help="list the supported ONNX operators")
    p.add_argument("--target", default="host")
    p.set_defaults(func=cmd_ops)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnxc", description="ONNX model compiler on TVM")
    parser.add_argument("--verbose", "-v", action="count", default=0,
                        help="log progress, and show tracebacks on errors; twice (-vv) also "
                             "debug records, among them TVM's own log lines (onnxc.tvm)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_compile, _add_run, _add_bench, _add_inspect, _add_debug, _add_memplan,
                _add_ops, _add_tune):
        add(sub)
    return parser


def cmd_compile(args) -> int:
    import compiler

    kwargs = dict(target=args.target, opt_level=args.opt_level,
                  disabled_passes=args.disable_pass, layout=args.layout,
                  tuning_db=args.tuning_db, memory_reuse=not args.no_memory_reuse,
                  dump_ir=args.dump_ir, dims=_parse_dims(args.dim), precision=args.precision,
                  precision_check=not args.no_precision_check,
                  batch_loop=not args.no_batch_loop)
    if args.timeout is not None and (args.no_isolate or args.timeout <= 0):
        raise UsageError("--timeout needs a positive number of seconds and an isolated "
                         "compile (not --no-isolate)")
    if args.no_isolate:
        cm = compiler.compile(args.model, **kwargs)
        cm.export(args.output)
        r = cm.report
    else:  # a crash inside TVM/LLVM kills the child only (compiler/isolate.py)
        from compiler.api import compile_to_file

        r = compile_to_file(args.model, args.output, timeout=args.timeout, **kwargs)
    mem = r["memory"]
    print(f"wrote {args.output}: {r['kernels']} kernel calls ({r['distinct_kernels']} kernels), "
          f"arena {_mib(mem['arena_bytes'])} (lower bound {_mib(mem['lower_bound_bytes'])}, "
          f"no reuse {_mib(mem['no_reuse_bytes'])}), params {_mib(mem['params_bytes'])}, "
          f"target {r['target']['name']} ({r['target']['cpu']}), {r['compile_seconds']:.1f}s")
    if r.get("tuning"):
        print(_tuning_line(r))
    if r.get("batch_loop"):
        loop = r["batch_loop"]
        print(f"dim {loop['dim']!r} ({loop['min']}..{loop['max']}) runs as a loop over a "
              f"one-sample build (inputs {', '.join(loop['inputs'])}); --no-batch-loop keeps "
              "it symbolic")
    for w in r.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(r, f, indent=2)
    return 0


def _dim_arg(text: str) -> tuple:
    """argparse type of --dim: a malformed range is a bad argument (exit 2)."""
    import argparse

    from compiler.lowering.symbolic import parse_dim_option

    try:
        return parse_dim_option(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parse_dims(items) -> dict | None:
    dims = {}
    for name, rng in items:
        if name in dims:
            raise UsageError(f"--dim {name} given twice")
        dims[name] = rng
    return dims or None


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _parse_inputs(items) -> dict:
    import numpy as np

    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {item!r}: expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise UsageError(f"--input {name}: no such file {path!r}") from None
        except (ValueError, OSError) as e:
            raise UsageError(f"--input {name}: {path!r} is not a readable .npy file ({e})") \
                from None
    return feeds


def cmd_run(args) -> int:
    import numpy as np

    import runtime

    from .tools.bench import index_limits, random_feeds

    if args.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {args.repeat}")
    if not args.allow_untrusted_location:
        check_trusted_location(args.artifact)
    options = runtime.SessionOptions(enable_profiling=bool(args.profile),
                                     check_nan=args.check_nan)
    sess = runtime.load(args.artifact, options)
    feeds = _parse_inputs(args.input)
    opt = {d["name"]: d["opt"] for d in getattr(sess, "dims", ())}  # symbolic dims: at OPT
    missing = [inp for inp in sess.get_inputs() if inp.name not in feeds]
    if missing and not args.random_inputs:
        inp = missing[0]
        raise UsageError(f"input {inp.name!r} ({inp.type}, shape {inp.shape}) is not given: "
                         f"pass --input {inp.name}=FILE.npy or --random-inputs")
    limits = index_limits(getattr(sess, "manifest", {}).get("index_bounds", ()))
    feeds.update(random_feeds([(i.name, [opt.get(d, d) for d in i.shape], i.dtype)
                               for i in missing], seed=args.seed, bounds=limits))
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    for meta, out in zip(sess.get_outputs(), outs):
        print(f"{meta.name}: {out.dtype}{list(out.shape)} {_summary(out)}")
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            np.save(os.path.join(args.output_dir, f"{_safe(meta.name)}.npy"), out)
    if args.profile:
        import shutil

        shutil.move(sess.end_profiling(), args.profile)
        print(sess.profile_summary())
        print(f"trace written to {args.profile}")
    times.sort()
    print(f"latency: median {times[len(times) // 2] * 1e3:.3f} ms, min {times[0] * 1e3:.3f} ms "
          f"over {len(times)} run(s)")
    return 0


def check_trusted_location(path: str) -> None:
    """Refuse (UsageError) an artifact other users could have written or swapped.

    Loading a .so runs its code.  Refused, after resolving symlinks: a file writable by
    everyone; a file in a directory writable by everyone without the sticky bit (anyone
    could replace it); a file in a sticky world-writable directory such as /tmp that is
    owned by another user (anyone could have put it there).  See docs/security.md.
    """
    import stat

    real = os.path.realpath(path)
    try:
        st = os.stat(real)
        dst = os.stat(os.path.dirname(real) or ".")
    except OSError:
        return  # missing file: runtime.load says so
    hint = ("; move it somewhere only you can write, or pass --allow-untrusted-location if "
            "you trust its contents (loading a .so runs its code)")
    if st.st_mode & stat.S_IWOTH:
        raise UsageError(f"refusing to load {path}: the file is writable by every user{hint}")
    if dst.st_mode & stat.S_IWOTH:
        where = os.path.dirname(real)
        if not dst.st_mode & stat.S_ISVTX:
            raise UsageError(f"refusing to load {path}: its directory {where} is writable by "
                             f"every user (and has no sticky bit), so anyone could have "
                             f"replaced it{hint}")
        if st.st_uid not in (os.getuid(), 0):
            raise UsageError(f"refusing to load {path}: it lies in the shared directory "
                             f"{where} and belongs to another user (uid {st.st_uid}){hint}")


def _summary(a) -> str:
    import numpy as np

    if a.size == 0:
        return "(empty)"
    if np.issubdtype(a.dtype, np.number):
        f = a.astype(np.float64)
        return (f"min {f.min():.6g} max {f.max():.6g} mean {f.mean():.6g} "
                f"std {f.std():.6g}")
    return f"{np.count_nonzero(a)} true of {a.size}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def cmd_bench(args) -> int:
    import tempfile

    import compiler
    from compiler.tools.bench import match_for, measure

    if args.rounds < 1 or args.runs < 1:
        raise UsageError("--rounds and --runs must be >= 1")
    cm = compiler.compile(args.model, target=args.target, tuning_db=args.tuning_db,
                          dims=_parse_dims(args.dim))
    if cm.report.get("dynamic"):  # no one artifact to time: its export says why
        from compiler.errors import CompileError

        hint = "" if args.dim else "; declare its symbolic dims with --dim NAME=MIN..MAX[:OPT]"
        raise CompileError(f"cannot benchmark {args.model}: {cm.report['why']}{hint}")
    print(f"compiled {args.model} for {cm.report['target']['name']} "
          f"({cm.report['target']['cpu']}): {cm.report['kernels']} kernel calls in "
          f"{cm.report['compile_seconds']:.1f}s")
    manifest = cm.meta["manifest"]
    opt = {d["name"]: d["opt"] for d in manifest.get("dims", ())}  # symbolic dims: at OPT
    shapes = {i["name"]: [int(opt.get(d, d)) for d in i["shape"]] for i in manifest["inputs"]}
    if opt:
        print("symbolic dims timed at " + ", ".join(f"{k}={v}" for k, v in opt.items())
              + " (OPT; set with --dim NAME=MIN..MAX:OPT)")
    if cm.report.get("tuning"):
        print(_tuning_line(cm.report))
    with tempfile.TemporaryDirectory(prefix="onnxc-") as tmp:
        so = cm.export(os.path.join(tmp, "model.so"))
        match = match_for(args.model)
        r = measure(args.model, so, rounds=args.rounds, runs=args.runs,
                    compare=args.compare == "onnxruntime", shapes=shapes, match=match)
    for meta, out in zip(cm.meta["manifest"]["outputs"], r["onnxc_outputs"]):
        print(f"output {meta['name']}: {out.dtype}{list(out.shape)} {_summary(out)}")
    print(f"onnxc       median {r['onnxc']['median_ms']:9.3f} ms  "
          f"(min {r['onnxc']['min_ms']:.3f}, {r['onnxc']['samples']} runs)")
    print(_rate_line(cm.report, r["onnxc"]["median_ms"]))
    if args.compare == "onnxruntime":
        o = r["onnxruntime"]
        print(f"onnxruntime median {o['median_ms']:9.3f} ms  (min {o['min_ms']:.3f}, "
              f"{o['samples']} runs)")
        verdict = "match" if r["allclose"] else "DIFFER"
        print(f"onnxc / onnxruntime latency: {r['ratio']:.2f}x; outputs {verdict} "
              f"(max abs diff {max(r['max_abs_diff'], default=0):.3g}, rtol {match['rtol']:g} "
              f"of each element, {match['scale_tol']:g} of the largest)")
        return 0 if r["allclose"] else 1
    return 0


def _rate_line(report: dict, median_ms: float) -> str:
    """The model's FLOPs per run, the GFLOP/s onnxc reached and that against the nominal
    fp32 peak of the cores it ran on; then the heaviest fallback share, if any."""
    from runtime.cpu_features import nominal_peak_gflops

    from .lowering.kernel_table import generic_share

    table = report.get("kernel_table", [])
    flops = sum(row["flops"] for row in table) * int(report.get("batch_loop", {}).get("opt", 1))
    gfs = flops / (median_ms * 1e6) if median_ms > 0 else 0.0
    t = report["target"]
    peak = nominal_peak_gflops(t.get("lanes_fp32", 0), int(t.get("cores", 1)))
    line = f"onnxc       {flops / 1e9:.3f} GFLOP per run, {gfs:.1f} GFLOP/s"
    if peak:
        line += f" = {gfs / peak:.1%} of the nominal fp32 peak ({peak:.0f} GFLOP/s)"
    share, _ = generic_share(table)
    if share > 0:
        line += f"; {share:.0%} of the FLOPs in fallback kernels"
    return line


def cmd_debug(args) -> int:
    """Exit 0 when every observable tensor matches, 1 at the first divergence."""
    from compiler.tools.bench import random_feeds
    from compiler.tools.debug import find_divergence
    from compiler.frontend.importer import input_signature
    from compiler.frontend.loader import load_model

    feeds = _parse_inputs(args.input)
    sig = input_signature(load_model(args.model), args.model,
                          {k: list(v.shape) for k, v in feeds.items()})
    feeds.update(random_feeds([(s["name"], s["shape"], s["dtype"]) for s in sig
                               if s["name"] not in feeds], seed=args.seed))
    r = find_divergence(args.model, feeds, compare=args.compare, target=args.target,
                        disabled_passes=args.disable_pass, rtol=args.rtol, atol=args.atol,
                        layout=args.layout)
    print(f"compared {len(r['checked'])} observable tensors of {r['nodes']} nodes with "
          f"{r['compare']} (rtol {args.rtol}, atol {args.atol}; layout "
          f"{r['layout'].get('chosen')}, mapped back to the ONNX layout)"
          + (f", passes disabled: {', '.join(r['disabled_passes'])}" if r["disabled_passes"]
             else ""))
    if r["unmappable"]:
        print(f"  {len(r['unmappable'])} tensors not compared: their layout cannot be mapped "
              f"back (first: {r['unmappable'][0]['tensor']!r} in "
              f"{r['unmappable'][0]['layout']}, shape {r['unmappable'][0]['shape']})")
    f = r["first"]
    if f is None:
        print("no divergence")
        return 0
    print(f"first divergence: tensor {f['tensor']!r} = output of node {f['node']!r} ({f['op']})")
    print(f"  {f['why']}")
    if f.get("kernel_output"):
        o = f["kernel_output"]
        print(f"  inside kernel {f['kernel']} (ONNX nodes: {', '.join(f['kernel_nodes'])}), "
              f"found by its checked variant; the kernel's output {o['tensor']!r} (node "
              f"{o['node']!r}) diverges as a result: {o['why']}")
    else:
        print(f"  computed by kernel {f['kernel']} (ONNX nodes: "
              f"{', '.join(f['kernel_nodes'])})")
    if f["passes"]:
        print(f"  rewritten by: {', '.join(f['passes'])}; confirm with "
              + " ".join(f"--disable-pass {p}" for p in f["passes"]))
    else:
        print("  no graph pass rewrote these nodes")
    return 1


def cmd_memplan(args) -> int:
    import runtime
    from runtime.artifact import read_artifact

    meta, _, _ = read_artifact(args.artifact)
    plan = runtime.MemoryPlan.from_dict(meta["memory_plan"])
    graph = meta["graph"]
    names = ["" for _ in plan.offsets]
    for t in graph["tensors"]:
        if t["storage"] == "arena":
            names[t["index"]] = (names[t["index"]] + "," if names[t["index"]] else "") + t["name"]
    print(plan.format(names=names))
    if args.png:
        _draw_plan(plan, names, args.png)
        print(f"drawn to {args.png}")
    return 0


def _draw_plan(plan, names, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--png needs matplotlib: pip install 'onnxc[plot]'") from None
    fig, ax = plt.subplots(figsize=(10, 6))
    for i, off in enumerate(plan.offsets):
        size = plan.sizes[i]
        if size:
            ax.broken_barh([(plan.first_uses[i], plan.last_uses[i] - plan.first_uses[i] + 1)],
                           (off / 2**20, size / 2**20), alpha=0.7, edgecolor="black", linewidth=0.4)
    ax.axhline(plan.lower_bound_bytes / 2**20, color="red", ls="--", label="lower bound")
    ax.set_xlabel("step")
    ax.set_ylabel("arena offset (MiB)")
    ax.set_title(f"arena {plan.arena_bytes / 2**20:.2f} MiB, lower bound "
                 f"{plan.lower_bound_bytes / 2**20:.2f} MiB, no reuse "
                 f"{plan.no_reuse_bytes / 2**20:.2f} MiB ({plan.algorithm})")
    ax.legend()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd_inspect(args) -> int:
    """Every node's op, domain, opset and status; exit 1 if any is unsupported."""
    import targets
    from compiler.frontend.loader import load_model
    from compiler.frontend.registry import REGISTRY

    arch = targets.resolve(args.target).arch
    model = load_model(args.model)
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    bad = {p["node"]: p["why"] for p in REGISTRY.check(model, arch)}
    print(f"{'node':<36} {'op':<22} {'domain':<12} {'opset':>5}  status")
    for i, node in enumerate(model.graph.node):
        name = node.name or f"#{i} ({node.op_type})"
        domain = node.domain or "ai.onnx"
        if name in bad:
            status = f"UNSUPPORTED: {bad[name]}"
        else:
            entry = REGISTRY.lookup(domain, node.op_type, opsets[domain])
            status = f"supported ({entry.implementation})"
        print(f"{name:<36} {node.op_type:<22} {domain:<12} {opsets.get(domain, '?'):>5}  {status}")
    n = len(model.graph.node)
    print(f"{n - len(bad)} of {n} nodes supported for target {args.target}")
    return 1 if bad else 0


def cmd_ops(args) -> int:
    """The operator registry as a table."""
    import targets
    from compiler.frontend.registry import REGISTRY

    arch = targets.resolve(args.target).arch
    rows = [e for e in REGISTRY.table() if arch in e.targets]
    print(f"{'op':<30} {'domain':<16} {'since':>5}  {'targets':<24} implementation")
    for e in rows:
        print(f"{e.op_type:<30} {e.domain:<16} {e.opsets():>5}  {','.join(e.targets):<24} "
              f"{e.implementation}")
    print(f"{len(rows)} operators for target {args.target} ({arch})")
    return 0


# -- onnxc tune (compiler/tools/tune.py) -------------------------------------------------------


def _add_tune(sub):
    p = sub.add_parser("tune", help="tune a model's kernels into a tuning database "
                       "(MetaSchedule + XGBoost; resumable)")
    p.add_argument("model")
    p.add_argument("--target", default="host")
    p.add_argument("--db", required=True, metavar="DIR",
                   help="the tuning database directory (created if missing; tasks it already "
                        "has are skipped, so rerunning resumes)")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="measured candidates over all tasks (default: 32 per task, or no "
                        "limit with --time-budget)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="wall-clock budget, shared among tasks by expected gain")
    p.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT",
                   help="measure on the RPC servers registered at this TVM RPC tracker")
    p.add_argument("--rpc-key", default=None, metavar="KEY")
    p.add_argument("--opt-level", type=int, default=3, choices=range(4),
                   help="as for compile: the graph passes decide which kernels exist")
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    from compiler.tools.tune import tune

    if args.rpc_tracker and not args.rpc_key:
        raise UsageError("--rpc-tracker needs --rpc-key (the key the RPC servers registered)")
    if args.rpc_key and not args.rpc_tracker:
        raise UsageError("--rpc-key needs --rpc-tracker HOST:PORT")
    s = tune(args.model, args.target, args.db, trials=args.trials, time_budget=args.time_budget,
             rpc_tracker=args.rpc_tracker, rpc_key=args.rpc_key, opt_level=args.opt_level,
             disabled_passes=args.disable_pass)
    print(f"{s['tasks']} tasks: {s['already_done']} already in the database, {s['tuned']} "
          f"tuned, {s['default_kept']} kept the default schedule, {s['not_started']} not "
          f"started (budget), {s.get('skipped', 0)} skipped; {s['trials']} trials "
          f"({s['valid_trials']} valid"
          + (f", {s['resumed_trials']} saved by an interrupted job" if s.get("resumed_trials")
             else "")
          + f") in {s.get('seconds', 0):.0f}s, measured with "
          f"{s['measured_with'] or '-'}; records in {os.path.join(s['database'], s['target_file'])}")
    check = s.get("model_check") or {}
    if check.get("demoted"):
        print(f"in-model check demoted {len(check['demoted'])} tuned kernel(s) that were slower "
              f"inside the model: {', '.join(check['demoted'])}")
    if "tuned_ms" in check:
        print(f"in-model kernel time per run: untuned {check['untuned_ms']:.3f} ms, tuned "
              f"{check['tuned_ms']:.3f} ms")
    elif check.get("skipped"):
        print(f"in-model check skipped: {check['skipped']}")
    return 0


def _tuning_line(r: dict) -> str:
    t = r["tuning"]
    line = (f"tuning db {t['database']}: {r['tuned_kernels']} of {r['distinct_kernels']} kernels "
            f"tuned ({t['tuned_schedule']} tuned schedules, {t['default_kept']} default kept), "
            f"{t['no_record']} without a record")
    if t["replay_failed"]:
        line += f", {t['replay_failed']} records that did not apply"
    return line


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    levels = {0: logging.WARNING, 1: logging.INFO}
    logging.basicConfig(level=levels.get(args.verbose, logging.DEBUG),
                        format="%(name)s: %(message)s")
    import passes
    import runtime
    import targets
    from compiler.errors import CompileError
    from schedules.tuning import TuningError

    user_errors = (UsageError, CompileError, runtime.ArtifactError, runtime.NonFiniteError,
                   targets.TargetError, TuningError,
                   passes.PassConfigError, ValueError, OSError)
    try:
        return args.func(args)
    except user_errors as e:
        if args.verbose:
            raise
        print(f"onnxc {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"onnxc {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
