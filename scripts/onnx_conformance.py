#!/usr/bin/env python3
"""Run the official ONNX backend node tests through onnxc (and optionally onnxruntime).

The cases come from the installed ``onnx`` package
(``onnx.backend.test.case.node.collect_testcases``): one single-node model (or its
function-expanded ``*_expanded`` form) with input and expected output data each.

Every case is compiled with ``compiler.compile(model, target="host")`` and run with
``.session().run(None, feeds)`` in a worker process, so that a segfault or an abort in
TVM or in a kernel takes down only that worker: the case counts as a ``crash`` and the
worker is replaced.  A case that runs longer than ``--timeout`` seconds is killed and
counts as a ``timeout``.

Outcomes of a case:

* ``pass``        every output matches (shape, dtype, values at rtol 1e-3 / atol 1e-5;
                  NaN positions must agree; integers, bools and strings exactly); the
                  record's ``computed_by`` says ``folding`` when every output was a
                  constant computed at compile time (no kernel ran on the data), and the
                  summary counts those passes separately;
* ``mismatch``    it compiled and ran, but an output is wrong (values, shape or dtype):
                  a silently wrong result, the worst outcome;
* ``unsupported`` an exception that says the model uses something not supported
                  (``UnsupportedError``, ``NotImplementedError``, TVM's
                  ``OpNotImplemented``, or a message with "unsupported",
                  "not [yet|currently] supported", "does not support", "not [yet]
                  implemented", "not available" or "only ... supported");
* ``error``       any other exception (a model that fails ``onnx.checker`` lands here);
* ``crash``       the worker died (signal) while on the case;
* ``timeout``     the case ran longer than ``--timeout``.

Cases not counted in the pass rate: ``skipped_non_tensor`` (a sequence, map or
optional input or output) and ``training`` (ops of the ``ai.onnx.preview.training``
domain).  pass rate = pass / (pass + mismatch + unsupported + error + crash + timeout).

Usage::

    python scripts/onnx_conformance.py --jobs 2 --json /tmp/conf.json --compare-ort
    python scripts/onnx_conformance.py -k test_conv --list-mismatches

From Python (the tests do this)::

    sys.path.insert(0, "<repo>/scripts")
    from onnx_conformance import run_cases
    records = run_cases(["test_add", "test_relu"], jobs=2, timeout=60)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict
from multiprocessing.connection import wait as mp_wait

RTOL, ATOL = 1e-3, 1e-5
TRAINING_DOMAINS = ("ai.onnx.preview.training",)
TENSOR_OUTCOMES = ("pass", "mismatch", "unsupported", "error", "crash", "timeout")
OTHER_OUTCOMES = ("skipped_non_tensor", "training")
_UNSUPPORTED_RE = re.compile(
    r"unsupported|not (yet |currently )?supported|does not support|not (yet )?implemented"
    r"|not available|\bonly\b.*\bsupported\b", re.I)
_UNSUPPORTED_TYPES = ("UnsupportedError", "NotImplementedError", "OpNotImplemented")


# --------------------------------------------------------------------------- #
# Test cases (parent side)
# --------------------------------------------------------------------------- #

_CASES = None


def all_cases() -> dict:
    """{name: onnx TestCase} of every node test case of the installed onnx (cached)."""
    global _CASES
    if _CASES is None:
        import onnx.backend.test.case.node as node_cases

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import numpy as np

            with np.errstate(all="ignore"):
                cases = node_cases.collect_testcases(None)
        _CASES = {c.name: c for c in cases}
    return _CASES


def select(names_or_filter=None, limit: int | None = None) -> list:
    """Case names: all (None), those containing a substring (str), or the given list."""
    cases = all_cases()
    if names_or_filter is None:
        names = list(cases)
    elif isinstance(names_or_filter, str):
        names = [n for n in cases if names_or_filter in n]
    else:
        names = list(names_or_filter)
        unknown = [n for n in names if n not in cases]
        if unknown:
            raise KeyError(f"unknown ONNX node test case(s): {unknown}")
    return names[:limit] if limit is not None else names


def _op_info(model) -> tuple[list, int | None]:
    ops = sorted({(n.domain + "::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
                  for n in model.graph.node})
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return ops, opset


def classify(case) -> str | None:
    """'training', 'skipped_non_tensor' or None (a tensor case that runs)."""
    import numpy as np
    import onnx

    model = case.model
    if any(o.domain in TRAINING_DOMAINS for o in model.opset_import):
        return "training"
    g = model.graph
    for vi in list(g.input) + list(g.output):
        if vi.type.WhichOneof("value") != "tensor_type":
            return "skipped_non_tensor"
    for inputs, outputs in case.data_sets:
        for a in list(inputs) + list(outputs):
            if not isinstance(a, (np.ndarray, np.generic, onnx.TensorProto)):
                return "skipped_non_tensor"
    return None


def _to_array(a):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if isinstance(a, onnx.TensorProto):
        return numpy_helper.to_array(a)
    return np.asarray(a)


def prepare(case) -> dict:
    """The picklable task a worker runs: model bytes, feeds and expected outputs."""
    g = case.model.graph
    inits = {i.name for i in g.initializer}
    input_names = [vi.name for vi in g.input if vi.name not in inits]
    data = []
    for inputs, outputs in case.data_sets:
        feeds = {n: _to_array(a) for n, a in zip(input_names, inputs)}
        data.append((feeds, [_to_array(a) for a in outputs]))
    return {"name": case.name, "model": case.model.SerializeToString(), "data": data,
            "graph_name": g.name}


# --------------------------------------------------------------------------- #
# Comparison and error classification (worker side, importable)
# --------------------------------------------------------------------------- #

def compare(actual: list, expected: list, rtol: float = RTOL, atol: float = ATOL):
    """(True, "") or (False, what differs first)."""
    import numpy as np

    if len(actual) != len(expected):
        return False, f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        if a.dtype != e.dtype:
            return False, f"output {i}: dtype {a.dtype}, expected {e.dtype}"
        if a.shape != e.shape:
            return False, f"output {i}: shape {list(a.shape)}, expected {list(e.shape)}"
        if a.size == 0:
            continue
        kind, name = e.dtype.kind, e.dtype.name
        if kind in "biuUSO" or (kind == "V" and "int" in name):
            if kind == "V":  # ml_dtypes int4/uint4/int2...
                a, e = a.astype(np.int64), e.astype(np.int64)
            bad = a != e
            if bad.any():
                idx = tuple(int(x) for x in np.argwhere(bad)[0])
                return False, (f"output {i}: {int(bad.sum())}/{e.size} elements differ "
                               f"(exact compare), first at {list(idx)}: {a[idx]!r} vs "
                               f"expected {e[idx]!r}")
            continue
        if kind not in "fc":  # ml_dtypes floats (bfloat16, float8*, float4)
            a, e = a.astype(np.float32), e.astype(np.float32)
        with np.errstate(all="ignore"):
            ok = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            bad = ~ok
            idx = tuple(int(x) for x in np.argwhere(bad)[0])
            with np.errstate(all="ignore"):
                diff = np.abs(a.astype(np.complex128 if kind == "c" else np.float64)
                              - e.astype(np.complex128 if kind == "c" else np.float64))
            finite = diff[np.isfinite(diff)]
            maxabs = float(finite.max()) if finite.size else float("nan")
            return False, (f"output {i}: {int(bad.sum())}/{e.size} elements differ, "
                           f"max abs diff {maxabs:.3g}, first at {list(idx)}: "
                           f"{a[idx]!r} vs expected {e[idx]!r}")
    return True, ""


def _first_line(text: str) -> str:
    """The first line of an error; a list of nodes that follows a line ending in ':' (onnxc's
    "N node(s) cannot be converted:") is appended, identical entries counted once."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Traceback"):
        return lines[-1].strip()
    first = lines[0].strip()
    if first.endswith(":") and len(lines) > 1:
        rest = Counter(re.sub(r"^node '[^']*': ", "", ln.strip()) for ln in lines[1:]
                       if not ln.strip().startswith("run `"))
        first += " " + ", ".join(k if n == 1 else f"{k} (x{n})" for k, n in rest.items())
    return first[:400]


def normalize_message(text: str, graph_name: str = "") -> str:
    """An error's first line with what varies from case to case taken out: the model name
    (the case's graph name), node names and Relax binding names."""
    msg = _first_line(text)
    if graph_name:
        msg = msg.replace(graph_name, "<model>")
    msg = re.sub(r"^(<model>|model): ", "", msg)  # onnxc's "<where>: " prefix
    msg = re.sub(r"^\d+ node\(s\) (use operators onnxc does not support|cannot be converted): ",
                 "cannot convert: ", msg)
    msg = re.sub(r"\bnode '[^']*' \(", "(", msg)  # node '#32' (Div, ...) -> (Div, ...)
    msg = re.sub(r"binding '[^']*'", "binding '_'", msg)  # lv, lv8, gv...
    return msg


def group_key(rec: dict, width: int = 80) -> str:
    """What errors are grouped by: type and message without opsets and the default domain,
    first ``width`` characters."""
    msg = rec.get("message", "")
    msg = re.sub(r", supported opsets: [^)]*", "", msg)
    msg = re.sub(r",? (model )?opset \d+(?=[,)])", "", msg)
    msg = re.sub(r"opset \d+ is outside", "opset N is outside", msg)
    msg = re.sub(r", domain ai\.onnx(?=[,)])", "", msg)
    msg = re.sub(r"\(domain ai\.onnx(?=[,)])", "(", msg)
    msg = re.sub(r" \(x\d+\)", "", msg)
    msg = re.sub(r"\(, ", "(", msg).replace(" ()", "")
    return f"{rec.get('error_type', '')}: {msg}"[:width]


def describe_error(e: BaseException, graph_name: str = "") -> dict:
    """{outcome, error_type, message, cause, traceback} of an exception."""
    msg = normalize_message(str(e), graph_name) or type(e).__name__
    cause = e.__cause__ or e.__context__
    cause_text = ""
    if cause is not None:
        cause_lines = [ln for ln in str(cause).strip().splitlines() if ln.strip()]
        cause_text = f"{type(cause).__name__}: {cause_lines[-1].strip() if cause_lines else ''}"
        cause_text = cause_text[:400]
    names = {type(e).__name__} | ({type(cause).__name__} if cause is not None else set())
    unsupported = bool(names & set(_UNSUPPORTED_TYPES)) or bool(_UNSUPPORTED_RE.search(msg))
    error_type = type(e).__name__
    if cause is not None and e.__cause__ is cause:  # e.g. CompileError(KeyError)
        error_type += f"({type(cause).__name__})"
    return {"outcome": "unsupported" if unsupported else "error",
            "error_type": error_type, "message": msg, "cause": cause_text,
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__,
                                                            limit=-4))[-1500:]}


def _run_engine(engine: str, task: dict) -> dict:
    """Run one case on ``engine`` ('onnxc' or 'ort'); a result record."""
    t0 = time.perf_counter()
    stage = "compile"
    try:
        import onnx

        model = onnx.ModelProto()
        model.ParseFromString(task["model"])
        if engine == "onnxc":
            import compiler

            compiled = compiler.compile(model, target="host")
            sess = compiled.session()
        else:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            so.log_severity_level = 3
            sess = ort.InferenceSession(task["model"], so, providers=["CPUExecutionProvider"])
        stage = "run"
        for feeds, expected in task["data"]:
            actual = sess.run(None, feeds)
            stage = "compare"
            ok, detail = compare(actual, expected)
            if not ok:
                return {"outcome": "mismatch", "stage": "compare", "message": detail,
                        "seconds": round(time.perf_counter() - t0, 3)}
            stage = "run"
        rec = {"outcome": "pass", "seconds": round(time.perf_counter() - t0, 3)}
        if engine == "onnxc":
            rec["computed_by"] = computed_by(compiled, sess, len(model.graph.output))
        return rec
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        rec = describe_error(e, task.get("graph_name", ""))
        rec.update(stage=stage, seconds=round(time.perf_counter() - t0, 3))
        return rec


def computed_by(compiled, sess, n_outputs: int) -> str:
    """``"kernels"``, or ``"folding"`` when every output of every compiled variant was a
    constant: computed at compile time (onnx.reference folding the graph, a converter's
    numpy), by no kernel of ours.  A pass of that kind says nothing about our kernels."""
    reports = getattr(sess, "reports", None)  # a specialising session: one per variant
    if reports is None:
        reports = [compiled.report]
    if reports and all(len(r.get("constant_outputs", ())) == n_outputs for r in reports):
        return "folding"
    return "kernels"


def _injected_fault(name: str) -> None:
    """Harness self-test: ONNX_CONFORMANCE_FAULT="case:segv|abort|hang[,case:...]"."""
    for item in filter(None, os.environ.get("ONNX_CONFORMANCE_FAULT", "").split(",")):
        case, _, kind = item.partition(":")
        if case == name:
            if kind == "segv":
                import ctypes

                ctypes.string_at(0)
            elif kind == "abort":
                os.abort()
            elif kind == "hang":
                time.sleep(1e6)


def _worker_main(conn, log_path: str, compare_ort: bool) -> None:
    """A worker: receives tasks, sends ('onnxc', rec) [, ('ort', rec)], ('done', None)."""
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    warnings.simplefilter("ignore")
    import numpy as np

    np.seterr(all="ignore")
    import compiler  # noqa: F401 - import TVM once, before the first case's clock starts

    if compare_ort:
        import onnxruntime  # noqa: F401
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        print(f"=== {task['name']}", flush=True)
        _injected_fault(task["name"])
        conn.send(("onnxc", _run_engine("onnxc", task)))
        if compare_ort:
            conn.send(("ort", _run_engine("ort", task)))
        conn.send(("done", None))


# --------------------------------------------------------------------------- #
# Worker pool (parent side): a worker that dies or times out is replaced
# --------------------------------------------------------------------------- #

class _Worker:
    def __init__(self, ctx, log_dir: str, idx: int, compare_ort: bool):
        self.log_path = os.path.join(log_dir, f"worker{idx}.log")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, self.log_path, compare_ort),
                                daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task = None  # name of the case in progress
        self.phase = None  # 'onnxc' or 'ort': the engine running now ('exit': both done)
        self.started = 0.0
        self.log_offset = 0

    def log_tail(self, lines: int = 25) -> str:
        """What the worker printed since the case began (TVM prints the newest frame first)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        keep = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("=== ")]
        return "\n".join(keep[:lines])[:3000]

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def _death(exitcode) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def run_cases(names_or_filter=None, jobs: int = 2, timeout: float = 60.0, *,
              compare_ort: bool = False, limit: int | None = None,
              progress: bool = False) -> list[dict]:
    """Run ONNX node test cases; one record (a dict) per case, in case order.

    names_or_filter : None (every case), a substring of the case names, or a list of names.
    Each record has ``name``, ``outcome`` (see the module doc), ``ops``, ``opset`` and,
    depending on the outcome, ``stage``, ``error_type``, ``message``, ``cause``,
    ``seconds``; with ``compare_ort`` also ``ort`` (onnxruntime's record of the case).
    """
    cases = all_cases()
    names = select(names_or_filter, limit)
    records: dict = {}
    queue = []
    for name in names:
        case = cases[name]
        ops, opset = _op_info(case.model)
        rec = {"name": name, "ops": ops, "opset": opset}
        records[name] = rec
        kind = classify(case)
        if kind is not None:
            rec["outcome"] = kind
            continue
        try:
            queue.append(prepare(case))
        except Exception as e:  # noqa: BLE001
            rec.update(describe_error(e, case.model.graph.name), stage="prepare")
            if compare_ort:
                rec["ort"] = {"outcome": "error", "message": rec["message"]}
    queue.reverse()  # pop() from the end, in case order

    total = len(queue)
    done = 0
    t_start = time.time()
    last_report = t_start
    ctx = mp.get_context("spawn")
    jobs = max(1, min(jobs, total)) if total else 0
    with tempfile.TemporaryDirectory(prefix="onnx_conformance_") as log_dir:
        workers = [_Worker(ctx, log_dir, i, compare_ort) for i in range(jobs)]
        spawned = jobs

        def finish(w, outcome_rec):
            nonlocal done
            rec = records[w.task]
            if w.phase == "onnxc":
                rec.update(outcome_rec)
                if compare_ort:  # ORT never ran for this case
                    rec["ort"] = {"outcome": "not_run"}
            elif w.phase == "ort":
                rec["ort"] = outcome_rec
            w.task = w.phase = None
            done += 1

        try:
            while queue or any(w.task for w in workers):
                # dispatch
                for w in workers:
                    if w.ready and w.task is None and queue:
                        task = queue.pop()
                        try:
                            w.log_offset = os.path.getsize(w.log_path)
                        except OSError:
                            w.log_offset = 0
                        w.task, w.phase, w.started = task["name"], "onnxc", time.monotonic()
                        w.conn.send(task)
                # wait for a message, a death, or the nearest deadline
                now = time.monotonic()
                deadlines = [w.started + timeout - now for w in workers if w.task]
                wait_s = max(0.05, min(deadlines)) if deadlines else 1.0
                ready = mp_wait([w.conn for w in workers] + [w.proc.sentinel for w in workers],
                                timeout=min(wait_s, 5.0))
                replace = []
                for i, w in enumerate(workers):
                    dead = False
                    try:
                        while w.conn.poll():
                            kind, payload = w.conn.recv()
                            if kind == "ready":
                                w.ready = True
                            elif kind == "onnxc":
                                records[w.task].update(payload)
                                w.phase = "ort" if compare_ort else "exit"
                                w.started = time.monotonic()
                            elif kind == "ort":
                                records[w.task]["ort"] = payload
                            elif kind == "done":
                                w.task = w.phase = None
                                done += 1
                    except (EOFError, OSError):
                        dead = True
                    if w.proc.sentinel in ready or dead or not w.proc.is_alive():
                        if w.proc.is_alive():
                            continue  # a message arrived; the sentinel did not fire
                        w.proc.join(1)
                        why = _death(w.proc.exitcode)
                        if w.task:
                            finish(w, {"outcome": "crash", "stage": w.phase,
                                       "message": f"worker {why}",
                                       "log": w.log_tail(),
                                       "seconds": round(time.monotonic() - w.started, 3)})
                        elif not w.ready:
                            raise RuntimeError(f"a conformance worker failed to start ({why}):"
                                               f"\n{w.log_tail(40)}")
                        replace.append(i)
                    elif w.task and time.monotonic() - w.started > timeout:
                        finish(w, {"outcome": "timeout", "stage": w.phase,
                                   "message": f"no result after {timeout:g} s",
                                   "seconds": round(time.monotonic() - w.started, 3)})
                        replace.append(i)
                for i in replace:
                    workers[i].kill()
                    workers[i] = _Worker(ctx, log_dir, spawned, compare_ort)
                    spawned += 1
                if progress and (time.time() - last_report > 15 or done == total):
                    last_report = time.time()
                    c = Counter(r.get("outcome") for r in records.values())
                    print(f"[{done}/{total} {time.time() - t_start:.0f}s] "
                          + " ".join(f"{k}={c[k]}" for k in TENSOR_OUTCOMES if c[k]),
                          file=sys.stderr, flush=True)
        finally:
            for w in workers:
                try:
                    if w.proc.is_alive() and w.task is None and w.ready:
                        w.conn.send(None)
                        w.proc.join(5)
                finally:
                    w.kill()
    return [records[n] for n in names]


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #

def summarize(records: list, key=None) -> dict:
    """Counts per outcome and the pass rate over tensor cases (``key`` picks a sub-record)."""
    counts = Counter()
    for r in records:
        if r["outcome"] in OTHER_OUTCOMES:
            counts[r["outcome"]] += 1
            continue
        rr = key(r) if key else r
        counts[(rr or {}).get("outcome", "not_run")] += 1
    tensor = sum(counts[k] for k in TENSOR_OUTCOMES) + counts["not_run"]
    out = {k: counts[k] for k in TENSOR_OUTCOMES + OTHER_OUTCOMES}
    if counts["not_run"]:
        out["not_run"] = counts["not_run"]
    if not key:  # passes whose outputs no kernel computed (see ``computed_by``)
        out["pass_by_folding"] = sum(1 for r in records if r["outcome"] == "pass"
                                     and r.get("computed_by") == "folding")
    out["tensor_cases"] = tensor
    out["total_cases"] = len(records)
    out["pass_rate"] = round(counts["pass"] / tensor, 4) if tensor else 0.0
    return out


def error_groups(records: list, outcomes=("error", "unsupported"), width: int = 80) -> list:
    """[(message prefix, outcome, count, example case)] by descending count."""
    groups: dict = defaultdict(list)
    for r in records:
        if r["outcome"] in outcomes:
            groups[(group_key(r, width), r["outcome"])].append(r["name"])
    return sorted(((k[0], k[1], len(v), v[0]) for k, v in groups.items()),
                  key=lambda g: (-g[2], g[0]))


def _print_counts(title: str, s: dict) -> None:
    print(f"{title}: " + ", ".join(f"{k} {s[k]}" for k in TENSOR_OUTCOMES)
          + (f", not_run {s['not_run']}" if s.get("not_run") else ""))
    print(f"  pass rate {s['pass']}/{s['tensor_cases']} = {100 * s['pass_rate']:.1f}%   "
          f"(not counted: skipped_non_tensor {s['skipped_non_tensor']}, "
          f"training {s['training']}; {s['total_cases']} cases in all)")
    if "pass_by_folding" in s:
        print(f"  of the passes, {s['pass_by_folding']} computed by no kernel (every output "
              "a constant folded at compile time); by kernels "
              f"{s['pass'] - s['pass_by_folding']}")


def report(records: list, compare_ort: bool, list_mismatches: bool, top: int = 40) -> dict:
    s = summarize(records)
    _print_counts("onnxc", s)
    summary = {"onnxc": s}
    if compare_ort:
        so = summarize(records, key=lambda r: r.get("ort"))
        _print_counts("onnxruntime", so)
        summary["onnxruntime"] = so
        both = sum(1 for r in records if r["outcome"] == "pass"
                   and (r.get("ort") or {}).get("outcome") == "pass")
        ort_only = sum(1 for r in records if r["outcome"] in TENSOR_OUTCOMES
                       and r["outcome"] != "pass"
                       and (r.get("ort") or {}).get("outcome") == "pass")
        print(f"  both pass {both}; onnxruntime passes but onnxc does not: {ort_only}")
        summary["both_pass"], summary["ort_only_pass"] = both, ort_only

    groups = error_groups(records)
    if groups:
        print(f"\nerror / unsupported messages (first 80 chars), {len(groups)} groups:")
        print(f"{'count':>5}  {'outcome':<11}  message  [example case]")
        for text, outcome, n, example in groups[:top]:
            print(f"{n:5d}  {outcome:<11}  {text}  [{example}]")
        if len(groups) > top:
            rest = sum(g[2] for g in groups[top:])
            print(f"  ... {len(groups) - top} more groups, {rest} cases (see --json)")
    crashes = [r for r in records if r["outcome"] in ("crash", "timeout")]
    if crashes:
        print(f"\ncrashes and timeouts ({len(crashes)}):")
        for r in crashes:
            print(f"  {r['outcome']:<8} {r['name']}: {r.get('message', '')}")
    mism = [r for r in records if r["outcome"] == "mismatch"]
    if mism and list_mismatches:
        print(f"\nmismatches ({len(mism)}):")
        for r in mism:
            ort = (r.get("ort") or {}).get("outcome", "")
            print(f"  {r['name']}{f' (ort: {ort})' if ort else ''}: {r.get('message', '')}")
    elif mism:
        print(f"\n{len(mism)} mismatches (silently wrong results); --list-mismatches lists them")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", dest="filter", default=None, help="only cases whose name contains this")
    ap.add_argument("--limit", type=int, default=None, help="at most N cases")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds per case and engine (default 60)")
    ap.add_argument("--compare-ort", action="store_true",
                    help="also run onnxruntime on every case, on the same harness")
    ap.add_argument("--list-mismatches", action="store_true",
                    help="list every mismatching case with what differs")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every case's record")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)

    t0 = time.time()
    records = run_cases(args.filter, args.jobs, args.timeout, compare_ort=args.compare_ort,
                        limit=args.limit, progress=not args.quiet)
    elapsed = time.time() - t0
    if not records:
        print("no case matches", file=sys.stderr)
        return 2
    summary = report(records, args.compare_ort, args.list_mismatches)
    print(f"\n{len(records)} cases in {elapsed:.0f} s with {args.jobs} jobs")
    if args.json:
        import onnx

        out = {"onnx_version": onnx.__version__, "rtol": RTOL, "atol": ATOL,
               "timeout_s": args.timeout, "jobs": args.jobs, "seconds": round(elapsed, 1),
               "summary": summary,
               "error_groups": [{"message": t, "outcome": o, "count": n, "example": ex}
                                for t, o, n, ex in error_groups(records)],
               "cases": records}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
