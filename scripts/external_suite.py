"""Run another project's ONNX test suite through onnxc, compared with onnxruntime.

Written for Apache TVM's Relax frontend tests (``tests/python/relax/test_frontend_onnx.py``):
each test builds a small model with ``onnx.helper`` and calls ``check_correctness`` (TVM
against onnxruntime) or ``from_onnx`` (then checks TVM's IR).  This file is both the driver
and a pytest plugin that swaps those helpers in the test module:

* ``check_correctness`` / ``run_in_tvm``: the model is compiled by ``compiler.compile`` (the
  fed shapes as ``input_shapes``), run by its session, and every output compared with
  onnxruntime's (the test's rtol/atol when it passes them, else 1e-5/1e-5; integer and
  bool outputs exactly; dtype and shape must match);
* ``from_onnx`` (the tests of TVM's IR): the same numerical check on the model (kind
  ``ir``; symbolic dims fed as ``SYM_DIM``), then TVM's own ``from_onnx`` so the test goes on.

Each check is one case, classified PASS, WRONG (numbers, shape or dtype differ), REFUSED
(a ``CompileError``: judge by its message whether it is clear), CRASH (any other exception,
a signal, or a timeout) or SKIP (onnxruntime rejects the model or its inputs).  The driver
runs the tests in a child pytest, resumes after the test of a check that killed it or ran
past ``--timeout`` seconds, and appends JSON lines to ``--log``.

A second mode, ``models``, runs a folder of ``.onnx`` files (written for onnxruntime's own
``onnxruntime/test/testdata``): each model is fed seeded random inputs built from its
declared types and shapes (every symbolic or unnamed dim fed as ``SYM_DIM``; floats normal,
integers in ``[0, SYM_DIM)``, bools random), run by onnxruntime first (SKIP when it refuses
the model or the feeds), then compiled by ``compiler.compile(path)`` and run by its session.
Outputs are compared as ``onnxc bench`` compares them (``compiler.tools.bench.match_for``:
fp32 rtol 1e-4 with an absolute part scaled by max |ref|, fp16 and quantized models looser;
integers, bools and strings exactly).  One worker process runs the models in turn; a model
that kills it or runs past ``--timeout`` seconds is a CRASH and a fresh worker goes on.

    python scripts/external_suite.py run /work/suite/test_frontend_onnx.py --log L.jsonl [-k EXPR]
    python scripts/external_suite.py models /work/ortsuite/models --log L.jsonl [--timeout 120]
    python scripts/external_suite.py summary L.jsonl [--list CLASS...]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback

SYM_DIM = 3  # the value every symbolic input dimension is fed as
DEFAULT_RTOL, DEFAULT_ATOL = 1e-5, 1e-5
CLASSES = ("PASS", "WRONG", "REFUSED", "CRASH", "SKIP")

# --------------------------------------------------------------------------- plugin

_state = {"test": None, "idx": 0, "seen": set(), "log": None}


def _emit(rec: dict) -> None:
    rec["t"] = time.time()
    with open(_state["log"], "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _feeds(model, inputs, module):
    """TVM's generate_random_inputs, with symbolic dims fed as SYM_DIM."""
    from onnx import helper

    feeds = {}
    for vi in model.graph.input:
        if inputs is not None and inputs.get(vi.name) is not None:
            feeds[vi.name] = inputs[vi.name]
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else SYM_DIM for d in tt.shape.dim]
        feeds[vi.name] = module.generate_random_value(shape, tt.elem_type)
    del helper
    return feeds


def _compare(ours, ref, rtol, atol, where="output"):
    """None when ``ours`` matches ``ref``, else a one-line reason."""
    import numpy as np

    if isinstance(ref, list):
        if not isinstance(ours, list) or len(ours) != len(ref):
            return f"{where}: sequence of {len(ref)} expected, got {type(ours).__name__}"
        for i, (a, b) in enumerate(zip(ours, ref)):
            why = _compare(a, b, rtol, atol, f"{where}[{i}]")
            if why:
                return why
        return None
    ours = np.asarray(ours)
    if ours.shape != ref.shape:
        return f"{where}: shape {list(ours.shape)} != onnxruntime {list(ref.shape)}"
    if ours.dtype != ref.dtype:
        return f"{where}: dtype {ours.dtype} != onnxruntime {ref.dtype}"
    if ref.dtype.kind in "iub" or ref.dtype.kind in "OSU":
        bad = ours != ref
        if np.any(bad):
            return (f"{where}: {int(bad.sum())}/{bad.size} elements differ (exact dtype "
                    f"{ref.dtype}); first ours={ours[bad][0]!r} ref={ref[bad][0]!r}")
        return None
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if np.any(nan_a != nan_b):
        return f"{where}: NaN in {int(nan_a.sum())} (ref {int(nan_b.sum())}) elements"
    ok = ~nan_a
    a, b = a[ok], b[ok]
    same_inf = (a == b)  # inf == inf
    err = np.where(same_inf, 0.0, np.abs(a - b))
    bad = err > atol + rtol * np.abs(b)
    if np.any(bad):
        rel = err / np.maximum(np.abs(b), 1e-30)
        return (f"{where}: {int(bad.sum())}/{bad.size} elements beyond rtol={rtol} "
                f"atol={atol}; max abs err {err.max():.3g}, max rel err {rel[bad].max():.3g}")
    return None


def _check(model, inputs, *, rtol, atol, kind, module):
    """One case: onnxc against onnxruntime on ``model``; returns onnxc's outputs or None."""
    import numpy as np
    import onnxruntime

    import compiler
    from compiler.errors import CompileError

    rtol = DEFAULT_RTOL if rtol is None else rtol
    atol = DEFAULT_ATOL if atol is None else atol
    blob = model.SerializeToString()
    key = hashlib.sha1(blob + repr(sorted((k, np.asarray(v).tobytes()) for k, v in
                                          (inputs or {}).items())).encode()).hexdigest()
    if key in _state["seen"]:
        return None
    _state["seen"].add(key)
    _state["idx"] += 1
    ops = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node})
    opset = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    rec = {"ev": "case", "test": _state["test"], "idx": _state["idx"], "kind": kind,
           "ops": ops, "opset": opset}
    _emit({"ev": "begin", "test": _state["test"], "idx": _state["idx"]})
    t0 = time.time()

    def done(cls, detail="", **kw):
        rec.update(cls=cls, detail=detail, seconds=round(time.time() - t0, 2), **kw)
        _emit(rec)

    feeds = _feeds(model, inputs, module)
    try:
        sess = onnxruntime.InferenceSession(blob, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
    except Exception as e:  # onnxruntime rejects the model or its feeds
        done("SKIP", f"onnxruntime: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return None
    inits = {i.name for i in model.graph.initializer}
    shapes = {k: list(np.shape(v)) for k, v in feeds.items() if k not in inits}
    stage = "compile"
    try:
        cm = compiler.compile(model, target="host", input_shapes=shapes)
        stage = "run"
        ours = cm.session().run(None, feeds)
    except CompileError as e:
        done("REFUSED", f"{stage}: {type(e).__name__}: {str(e)[:600]}")
        return None
    except Exception as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        done("CRASH", f"{stage}: {type(e).__name__}: {str(e)[:600]}",
             where="".join(tb[-4:])[-1500:])
        return None
    if len(ours) != len(ref):
        done("WRONG", f"{len(ours)} outputs, onnxruntime {len(ref)}")
        return ours
    for i, (a, b) in enumerate(zip(ours, ref)):
        if b is None:
            continue
        why = _compare(a, b, rtol, atol, f"output {i} ({sess.get_outputs()[i].name})")
        if why:
            done("WRONG", why)
            return ours
    done("PASS")
    return ours


def _patch(module) -> None:
    if getattr(module, "_onnxc_patched", False):
        return
    module._onnxc_patched = True
    real_from_onnx = module.from_onnx

    def check_correctness(model, inputs=None, ir_version=8, opset=14, rtol=None, atol=None,
                          check_dtypes=False):
        if ir_version is not None:
            model.ir_version = ir_version
        if opset is not None:
            model.opset_import[0].version = opset
        _check(model, inputs, rtol=rtol, atol=atol, kind="cc", module=module)

    def run_in_tvm(model, inputs=None, ir_version=8, opset=14):
        import pytest
        import tvm

        if ir_version is not None:
            model.ir_version = ir_version
        if opset is not None:
            for imp in model.opset_import:
                if imp.domain in ("", "ai.onnx"):
                    imp.version = opset
                    break
        ours = _check(model, inputs, rtol=None, atol=None, kind="rit", module=module)
        if ours is None:
            pytest.skip("onnxc did not run this model")
        outs = [tvm.runtime.tensor(o) for o in ours]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def from_onnx(model, *args, **kwargs):
        import onnx

        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.ir_version = 8  # as check_correctness: onnxruntime reads IR 8
        opset = kwargs.get("opset")
        if opset is not None:
            for imp in m.opset_import:
                if imp.domain in ("", "ai.onnx"):
                    imp.version = opset
        try:
            _check(m, None, rtol=None, atol=None, kind="ir", module=module)
        except Exception as e:  # the harness itself must not change the test's outcome
            _emit({"ev": "harness-error", "test": _state["test"], "error": repr(e)})
        return real_from_onnx(model, *args, **kwargs)

    module.check_correctness = check_correctness
    module.run_in_tvm = run_in_tvm
    module.from_onnx = from_onnx


def pytest_collection_modifyitems(config, items):
    ids_file = os.environ.get("ONNXC_SUITE_IDS")
    if ids_file:
        wanted = set(open(ids_file).read().split("\n"))
        keep = [it for it in items if it.nodeid in wanted]
        config.hook.pytest_deselected(items=[it for it in items if it.nodeid not in wanted])
        items[:] = keep
    for it in items:
        _patch(it.module)


def pytest_runtest_setup(item):
    import compiler  # noqa: F401  (imported before the first case's clock starts)

    _state.update(test=item.nodeid, idx=0, seen=set(), log=os.environ["ONNXC_SUITE_LOG"])
    _emit({"ev": "test-begin", "test": item.nodeid})


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _emit({"ev": "test-end", "test": report.nodeid, "outcome": report.outcome})


# --------------------------------------------------------------------------- driver

def _collect(test_file, kexpr) -> list:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           test_file]
    if kexpr:
        cmd += ["-k", kexpr]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.abspath(test_file))).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def _read(log) -> list:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(args) -> None:
    test_file = os.path.abspath(args.test_file)
    ids = _collect(test_file, args.k)
    done_tests = {r["test"] for r in _read(args.log) if r["ev"] in ("test-end", "killed")}
    todo = [i for i in ids if i not in done_tests]
    print(f"{len(ids)} tests, {len(todo)} to run", flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ONNXC_SUITE_LOG=os.path.abspath(args.log),
               PYTHONPATH=os.pathsep.join([here, os.path.dirname(here),
                                           os.environ.get("PYTHONPATH", "")]))
    ids_file = os.path.abspath(args.log) + ".ids"
    while todo:
        with open(ids_file, "w") as f:
            f.write("\n".join(todo))
        env["ONNXC_SUITE_IDS"] = ids_file
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "external_suite", "-p",
               "no:cacheprovider", "-rN", test_file]
        start = len(_read(args.log))
        with open(os.path.abspath(args.log) + ".out", "a") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=os.path.dirname(test_file), start_new_session=True)
            last, n = time.time(), start
            while proc.poll() is None:
                time.sleep(1)
                recs = _read(args.log)
                if len(recs) != n:
                    last, n = time.time(), len(recs)
                elif time.time() - last > args.timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
        recs = _read(args.log)[start:]
        ended = {r["test"] for r in recs if r["ev"] == "test-end"}
        begun = [r["test"] for r in recs if r["ev"] == "test-begin"]
        if proc.returncode != 0 and begun and begun[-1] not in ended:
            victim = begun[-1]
            open_case = [r for r in recs if r["ev"] in ("begin", "case") and r["test"] == victim]
            why = (f"timeout: no progress for {args.timeout}s" if proc.returncode == -9
                   else f"process died: returncode {proc.returncode}")
            if open_case and open_case[-1]["ev"] == "begin":
                _append(args.log, {"ev": "case", "test": victim, "idx": open_case[-1]["idx"],
                                   "kind": "?", "cls": "CRASH", "detail": why, "ops": []})
            _append(args.log, {"ev": "killed", "test": victim, "why": why})
            ended.add(victim)
        finished = ended | {r["test"] for r in _read(args.log) if r["ev"] == "killed"}
        if not any(t in finished for t in todo):
            print("no progress; stopping", flush=True)
            break
        todo = [t for t in todo if t not in finished]
        print(f"{len(todo)} tests left", flush=True)
    summary(argparse.Namespace(log=args.log, list=["WRONG", "CRASH", "REFUSED"]))


def _append(log, rec) -> None:
    rec["t"] = time.time()
    with open(log, "a") as f:
        f.write(json.dumps(rec) + "\n")


def summary(args) -> None:
    cases = {}
    for r in _read(args.log):
        if r["ev"] == "case":
            cases[(r["test"], r["idx"])] = r  # the last record of a case wins (reruns)
    counts = collections.Counter((r["kind"], r["cls"]) for r in cases.values())
    kinds = sorted({k for k, _ in counts})
    print("kind  " + " ".join(f"{c:>8}" for c in CLASSES))
    for k in kinds:
        print(f"{k:5} " + " ".join(f"{counts[(k, c)]:8d}" for c in CLASSES))
    print("all   " + " ".join(f"{sum(counts[(k, c)] for k in kinds):8d}" for c in CLASSES))
    for cls in args.list or []:
        rows = [r for r in cases.values() if r["cls"] == cls]
        if rows:
            print(f"\n== {cls} ({len(rows)})")
        for r in sorted(rows, key=lambda r: (r["test"], r["idx"])):
            print(f"{r['test']}#{r['idx']} [{r['kind']}] {','.join(r['ops'])} "
                  f"opset={r.get('opset')}: {r['detail'][:400]}")



# --------------------------------------------------------------------------- models mode

def _model_feeds(model, seed: int = 0):
    """Seeded random feeds for the graph inputs that are not initializers, or a string
    saying why none can be made (a non-tensor input)."""
    import numpy as np
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            return f"input {vi.name!r} is a {vi.type.WhichOneof('value')}, not a tensor"
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else SYM_DIM
                 for d in tt.shape.dim]  # some models declare an unknown dim as -1
        if tt.elem_type == 8:  # STRING
            feeds[vi.name] = rng.choice(np.array(["a", "bc", "Def"], dtype=object), size=shape)
            continue
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        except Exception:  # noqa: BLE001 - float8, int4, ...: nothing numpy can feed
            return f"input {vi.name!r} has element type {tt.elem_type} that numpy cannot feed"
        if dtype.kind == "f":
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif dtype.kind in "iu":
            feeds[vi.name] = rng.integers(0, SYM_DIM, size=shape).astype(dtype)
        else:
            return f"input {vi.name!r} has numpy dtype {dtype} (not fed)"
    return feeds


def _compare_scaled(ours, ref, tol: dict, where: str):
    """None when ``ours`` matches ``ref`` under ``bench.outputs_match``'s rule, else why."""
    import numpy as np

    if isinstance(ref, list):
        if not isinstance(ours, list) or len(ours) != len(ref):
            return f"{where}: sequence of {len(ref)} expected, got {type(ours).__name__}"
        for i, (a, b) in enumerate(zip(ours, ref)):
            why = _compare_scaled(a, b, tol, f"{where}[{i}]")
            if why:
                return why
        return None
    if isinstance(ref, dict) or not isinstance(ref, np.ndarray):
        ref = np.asarray(ref)
    ours = np.asarray(ours)
    if ours.shape != ref.shape:
        return f"{where}: shape {list(ours.shape)} != onnxruntime {list(ref.shape)}"
    if ours.dtype != ref.dtype:
        return f"{where}: dtype {ours.dtype} != onnxruntime {ref.dtype}"
    if ref.dtype.kind not in "fc":
        return _compare(ours, ref, 0.0, 0.0, where)
    b = ref.astype(np.float64)
    finite = np.isfinite(b)
    scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
    atol = max(tol.get("atol", 1e-5), tol["scale_tol"] * scale)
    return _compare(ours, ref, tol["rtol"], atol, where)


def _check_model(path: str, rel: str) -> dict:
    """One model of the folder: the case record (cls, detail, ...)."""
    import numpy as np
    import onnx
    import onnxruntime

    import compiler
    from compiler.errors import CompileError
    from compiler.tools.bench import match_for

    rec = {"ev": "case", "test": rel, "idx": 0, "kind": "model", "ops": [], "opset": None}
    t0 = time.time()

    def done(cls, detail="", **kw):
        rec.update(cls=cls, detail=detail, seconds=round(time.time() - t0, 2), **kw)
        return rec

    try:
        model = onnx.load(path)
    except Exception as e:  # noqa: BLE001
        return done("SKIP", f"onnx.load: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    rec["ops"] = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}"
                         for n in model.graph.node})
    rec["opset"] = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    try:
        feeds = _model_feeds(model)
    except Exception as e:  # noqa: BLE001 - the harness's fault, not onnxc's
        feeds = f"{type(e).__name__}: {e}"
    if isinstance(feeds, str):
        return done("SKIP", f"harness: {feeds}")
    try:
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = 1  # its idle spinning threads would slow onnxc down
        so.inter_op_num_threads = 1
        # onnxruntime's kernels as the model states them: its fusions are no reference (the
        # fused Attention reads a 0/1 mask, the graph's Sub/Mul any value; its Reshape
        # fusion accepts a shape input that the plain Reshape refuses)
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        sess = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime rejects the model or its feeds
        return done("SKIP", f"onnxruntime: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    names = [o.name for o in sess.get_outputs()]
    del sess
    tol = match_for(model)
    stage = "compile"
    dims = None
    try:
        cm = compiler.compile(path, target="host")
        stage = "run"
        try:
            sess = cm.session()
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ != "MemoryLimitError":
                raise
            # the default range of a symbolic dim (1..128) over many dims needs more memory
            # than this host has: declare every dim's range as what the harness feeds
            dims = {d.dim_param: (1, SYM_DIM, SYM_DIM) for vi in model.graph.input
                    for d in vi.type.tensor_type.shape.dim if d.dim_param}
            stage = "compile (dims)"
            cm = compiler.compile(path, target="host", dims=dims)
            stage = "run"
            sess = cm.session()
        ours = sess.run(None, feeds)
    except CompileError as e:
        return done("REFUSED", f"{stage}: {type(e).__name__}: {str(e)[:600]}")
    except Exception as e:  # noqa: BLE001
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return done("CRASH", f"{stage}: {type(e).__name__}: {str(e)[:600]}",
                    where="".join(tb[-4:])[-1500:])
    if len(ours) != len(ref):
        return done("WRONG", f"{len(ours)} outputs, onnxruntime {len(ref)}")
    for i, (a, b) in enumerate(zip(ours, ref)):
        if b is None:
            continue
        why = _compare_scaled(a, b, tol, f"output {i} ({names[i]})")
        if why:
            return done("WRONG", why, tol=tol, dims=dims)
    return done("PASS", dims=dims)


def _models_worker(args) -> None:
    """Runs in the child: every model listed in ``args.todo``, one case record each."""
    import compiler  # noqa: F401  (imported before the first model's clock starts)

    _state["log"] = args.log
    for rel in open(args.todo).read().split("\n"):
        if not rel:
            continue
        _emit({"ev": "begin", "test": rel, "idx": 0})
        _emit(_check_model(os.path.join(args.folder, rel), rel))


def models(args) -> None:
    folder = os.path.abspath(args.folder)
    rels = sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, fs in os.walk(folder) for f in fs if f.endswith(".onnx"))
    if args.match:
        import fnmatch

        rels = [r for r in rels if any(fnmatch.fnmatch(r, m) for m in args.match)]
    log = os.path.abspath(args.log)
    done_models = {r["test"] for r in _read(log) if r["ev"] == "case"}
    todo = [r for r in rels if r not in done_models]
    print(f"{len(rels)} models, {len(todo)} to run", flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    todo_file = log + ".todo"
    while todo:
        with open(todo_file, "w") as f:
            f.write("\n".join(todo))
        cmd = [sys.executable, os.path.abspath(__file__), "_models_worker", folder,
               "--log", log, "--todo", todo_file]
        start = len(_read(log))
        with open(log + ".out", "a") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            why = None
            while proc.poll() is None:
                time.sleep(1)
                recs = _read(log)[start:]
                if recs and recs[-1]["ev"] == "begin" and \
                        time.time() - recs[-1]["t"] > args.timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    why = f"timeout: over {args.timeout}s"
                    break
        recs = _read(log)[start:]
        if recs and recs[-1]["ev"] == "begin":  # the model in flight killed the worker
            why = why or f"process died: returncode {proc.returncode}"
            _append(log, {"ev": "case", "test": recs[-1]["test"], "idx": 0, "kind": "model",
                          "cls": "CRASH", "detail": why, "ops": []})
        finished = {r["test"] for r in _read(log) if r["ev"] == "case"}
        left = [r for r in todo if r not in finished]
        if len(left) == len(todo):
            print("no progress; stopping", flush=True)
            break
        todo = left
        print(f"{len(todo)} models left", flush=True)
    summary(argparse.Namespace(log=log, list=["WRONG", "CRASH", "REFUSED"]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the test file's tests through onnxc")
    r.add_argument("test_file")
    r.add_argument("--log", required=True, help="JSON lines, appended (a rerun resumes)")
    r.add_argument("-k", help="pytest -k expression")
    r.add_argument("--timeout", type=float, default=240,
                   help="seconds without progress before the test is killed")
    m = sub.add_parser("models", help="run every .onnx file under a folder through onnxc")
    m.add_argument("folder")
    m.add_argument("--log", required=True, help="JSON lines, appended (a rerun resumes)")
    m.add_argument("--timeout", type=float, default=120,
                   help="seconds one model may take (onnxruntime, compile, run)")
    m.add_argument("--match", nargs="*", help="fnmatch patterns of the models to run")
    w = sub.add_parser("_models_worker")  # the child process of `models`
    w.add_argument("folder")
    w.add_argument("--log", required=True)
    w.add_argument("--todo", required=True)
    s = sub.add_parser("summary", help="counts per class, and the listed classes' cases")
    s.add_argument("log")
    s.add_argument("--list", nargs="*", default=["WRONG", "CRASH", "REFUSED"])
    args = p.parse_args(argv)
    {"run": run, "models": models, "_models_worker": _models_worker,
     "summary": summary}[args.cmd](args)


if __name__ == "__main__":
    main()
