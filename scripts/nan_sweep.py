"""NaN / Inf / -0.0 / denormal sweep: every registered op against onnxruntime (issue #17).

For every ``(domain, op)`` of the operator registry, the ONNX backend node test cases of that
op (single-node models, not the ``*_expanded`` function bodies; see
``scripts/onnx_conformance.py``) are taken with their inputs, and the floating-point inputs
are replaced by arrays of the same shape that mix NaN, +Inf, -Inf, -0.0, +0.0, denormals and
ordinary values (:func:`special_like`).  Two variants per case: only the first float input
replaced (``first``) and, when there are more, every float input replaced (``all``).

Each variant runs on onnxruntime (the reference: a variant onnxruntime refuses is skipped)
and on onnxc (``compiler.compile(model, target="host")``: scheduled kernels), and the
outputs are compared element-wise (:func:`compare`): NaN exactly where onnxruntime has NaN,
infinities equal, other values within ``rtol=1e-3, atol=1e-5``, integers and booleans
exactly, and the sign of every zero that both give (``-0.0`` versus ``+0.0``) unless the op
is in :data:`ZERO_SIGN_FREE`.

Usage::

    python scripts/nan_sweep.py                 # every op, a table of the ops that differ
    python scripts/nan_sweep.py --ops ReduceMax,MaxPool --verbose

``tests/compiler/test_nan_every_op.py`` runs a representative subset by default and the
whole sweep under ``-m slow``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RTOL, ATOL = 1e-3, 1e-5
FLOATS = (np.float16, np.float32, np.float64)

# Ops where the sign of a zero result is an artefact of summation order or of an
# intermediate rounding in onnxruntime's kernel, not a semantic (a sum of +x and -x is +0.0
# whichever way; a product chain may round a denormal to -0.0 or +0.0 depending on order).
ZERO_SIGN_FREE = frozenset({
    "RotaryEmbedding",  # x * cos - y * sin: +0.0 or -0.0 by which product rounds to zero
})

# Cases of an op taken per op (the backend suite has up to ~40 per op; these cover the
# attribute forms without making the sweep slow).
CASES_PER_OP = 2


def special_like(a: np.ndarray, seed: int) -> np.ndarray:
    """An array shaped and typed as ``a``: ordinary values with about a third of the
    elements replaced by NaN, +-Inf, -0.0, +0.0 and (positive and negative) denormals, at
    seeded random positions (so some rows hold no NaN and some start with one)."""
    dtype = a.dtype.type
    rng = np.random.default_rng(seed)
    tiny = np.finfo(dtype).tiny
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny / 4, -tiny / 4,
                         tiny / 1024 if dtype is not np.float16 else tiny / 8],
                        dtype=np.float64)
    out = (rng.standard_normal(a.shape) * 2.0)
    mask = rng.random(a.shape) < 0.35
    pick = rng.integers(0, len(specials), size=a.shape)
    out = np.where(mask, specials[pick], out)
    if out.size:  # the very first element NaN: the position onnxruntime's folds keep
        out.flat[0] = np.nan
    with np.errstate(all="ignore"):
        return out.astype(dtype)


# --------------------------------------------------------------------------- #
# Cases: (domain, op) -> single-node models with float inputs, from the backend suite
# --------------------------------------------------------------------------- #

def _node_op(model):
    nodes = list(model.graph.node)
    if len(nodes) != 1:
        return None
    domain = nodes[0].domain if nodes[0].domain not in ("", "ai.onnx") else "ai.onnx"
    return domain, nodes[0].op_type


def _float_inputs(feeds: dict) -> list[str]:
    return [k for k, v in feeds.items()
            if isinstance(v, np.ndarray) and v.dtype.type in FLOATS and v.size]


@functools.lru_cache(maxsize=None)
def backend_cases() -> dict:
    """{(domain, op): [(case name, model, feeds)]} of single-node tensor cases with at
    least one float input, ``CASES_PER_OP`` per op, in the suite's order (cached)."""
    from onnx_conformance import all_cases, classify, prepare

    import onnx

    out = defaultdict(list)
    for name, case in sorted(all_cases().items()):
        if name.endswith("_expanded") or "_expanded_" in name:
            continue
        key = _node_op(case.model)
        if key is None or classify(case) is not None:
            continue
        if len(out[key]) >= CASES_PER_OP:
            continue
        task = prepare(case)
        if not task["data"]:
            continue
        feeds = task["data"][0][0]
        if not _float_inputs(feeds):
            continue
        model = onnx.ModelProto()
        model.ParseFromString(task["model"])
        out[key].append((name, model, feeds))
    return dict(out)


def registered_ops() -> list[tuple[str, str]]:
    import compiler  # noqa: F401 - registers the converters
    from compiler.frontend.registry import REGISTRY

    return sorted({(e.domain, e.op_type) for e in REGISTRY.table()})


def variants(name: str, feeds: dict) -> list[tuple[str, dict]]:
    """(variant name, feeds) with the first / every float input made special."""
    floats = _float_inputs(feeds)
    seed = zlib.crc32(name.encode())
    first = dict(feeds)
    first[floats[0]] = special_like(feeds[floats[0]], seed)
    out = [("first", first)]
    if len(floats) > 1:
        every = dict(feeds)
        for i, k in enumerate(floats):
            every[k] = special_like(feeds[k], seed + 1 + i)
        out.append(("all", every))
    return out


# --------------------------------------------------------------------------- #
# Running and comparing
# --------------------------------------------------------------------------- #

def ort_outputs(model, feeds: dict) -> list:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def onnxc_session(model):
    import compiler

    return compiler.compile(model, target="host").session()


def compare(got: list, expected: list, zero_sign: bool = True) -> str:
    """'' when ``got`` matches onnxruntime's ``expected``, else what differs first."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, onnxruntime {len(expected)}"
    for i, (a, e) in enumerate(zip(got, expected)):
        a, e = np.asarray(a), np.asarray(e)
        if a.dtype != e.dtype or a.shape != e.shape:
            return f"output {i}: {a.dtype}{list(a.shape)}, onnxruntime {e.dtype}{list(e.shape)}"
        if e.dtype.kind != "f":
            bad = a != e
            if bad.any():
                j = tuple(int(x) for x in np.argwhere(bad)[0])
                return (f"output {i}: {int(bad.sum())}/{e.size} differ, first at {list(j)}: "
                        f"{a[j]!r} vs {e[j]!r}")
            continue
        nan_a, nan_e = np.isnan(a), np.isnan(e)
        if (nan_a != nan_e).any():
            j = tuple(int(x) for x in np.argwhere(nan_a != nan_e)[0])
            return (f"output {i}: NaN at {int((nan_a & ~nan_e).sum())} positions onnxruntime "
                    f"has none, missing at {int((nan_e & ~nan_a).sum())}; first at {list(j)}: "
                    f"{a[j]!r} vs {e[j]!r}")
        with np.errstate(all="ignore"):
            ok = nan_e | np.isclose(a.astype(np.float64), e.astype(np.float64), rtol=RTOL,
                                    atol=ATOL)
        if not ok.all():
            j = tuple(int(x) for x in np.argwhere(~ok)[0])
            return (f"output {i}: {int((~ok).sum())}/{e.size} values differ, first at "
                    f"{list(j)}: {a[j]!r} vs {e[j]!r}")
        if zero_sign:
            zero = (a == 0) & (e == 0)
            bad = zero & (np.signbit(a) != np.signbit(e))
            if bad.any():
                j = tuple(int(x) for x in np.argwhere(bad)[0])
                return (f"output {i}: sign of zero differs at {int(bad.sum())} positions, "
                        f"first at {list(j)}: {a[j]!r} vs {e[j]!r}")
    return ""


def run_case(op: str, name: str, model, feeds: dict) -> list[dict]:
    """One record per variant: outcome 'match', 'differ', 'onnxc_error', 'ort_refuses', or
    one record 'plain_differs' when onnxc and onnxruntime already differ on the case's own
    inputs (not a NaN question: conformance is scripts/onnx_conformance.py's)."""
    base = {"op": op, "case": name}
    try:
        with np.errstate(all="ignore"):
            reference = ort_outputs(model, feeds)
    except Exception as e:  # noqa: BLE001 - the reference refuses the case itself
        return [dict(base, variant="plain", outcome="ort_refuses",
                     detail=str(e).splitlines()[0][:120])]
    try:
        sess = onnxc_session(model)
        with np.errstate(all="ignore"):
            plain = compare(sess.run(None, feeds), reference, zero_sign=False)
    except Exception as e:  # noqa: BLE001
        return [dict(base, variant="plain", outcome="onnxc_error",
                     detail=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")]
    if plain:
        return [dict(base, variant="plain", outcome="plain_differs", detail=plain)]
    recs = []
    for vname, vfeeds in variants(name, feeds):
        rec = dict(base, variant=vname)
        try:
            with np.errstate(all="ignore"):
                expected = ort_outputs(model, vfeeds)
        except Exception as e:  # noqa: BLE001 - the reference refuses: nothing to compare
            rec.update(outcome="ort_refuses", detail=str(e).splitlines()[0][:120])
            recs.append(rec)
            continue
        try:
            got = sess.run(None, vfeeds)
        except Exception as e:  # noqa: BLE001
            rec.update(outcome="onnxc_error",
                       detail=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            recs.append(rec)
            continue
        detail = compare(got, expected, zero_sign=op not in ZERO_SIGN_FREE)
        rec.update(outcome="differ" if detail else "match", detail=detail)
        recs.append(rec)
    return recs


def sweep(ops=None, verbose: bool = False) -> list[dict]:
    """Records of every variant of every case of ``ops`` (default: the whole registry)."""
    cases = backend_cases()
    keys = registered_ops()
    if ops is not None:
        keys = [k for k in keys if k[1] in ops or f"{k[0]}::{k[1]}" in ops]
    recs = []
    for key in keys:
        label = key[1] if key[0] == "ai.onnx" else f"{key[0]}::{key[1]}"
        if key not in cases:
            recs.append({"op": label, "case": None, "variant": None, "outcome": "no_case"})
            continue
        for name, model, feeds in cases[key]:
            t0 = time.perf_counter()
            for r in run_case(label, name, model, feeds):
                r["seconds"] = round(time.perf_counter() - t0, 2)
                recs.append(r)
                if verbose:
                    print(f"{r['outcome']:12} {name}[{r['variant']}] {r.get('detail', '')}",
                          file=sys.stderr, flush=True)
    return recs


def differing_ops(recs: list[dict]) -> dict:
    """{op: [records that differ]} (onnxc errors count as differences)."""
    out = defaultdict(list)
    for r in recs:
        if r["outcome"] in ("differ", "onnxc_error"):
            out[r["op"]].append(r)
    return dict(out)


def table(recs: list[dict]) -> str:
    """A text table of the ops that differ, then the counts."""
    diff = differing_ops(recs)
    lines = [f"{'op':28} {'case[variant]':52} what differs"]
    for op in sorted(diff):
        for r in diff[op]:
            lines.append(f"{op:28} {r['case'] + '[' + r['variant'] + ']':52} {r['detail']}")
    compared = {r["op"] for r in recs if r["outcome"] in ("match", "differ", "onnxc_error")}
    no_case = sorted(r["op"] for r in recs if r["outcome"] == "no_case")
    plain = sorted({r["op"] for r in recs if r["outcome"] == "plain_differs"} - compared)
    refused = sorted({r["op"] for r in recs if r["outcome"] == "ort_refuses"} - compared)
    lines.append(f"{len(diff)} of {len(compared)} compared ops differ; "
                 f"{len(refused)} ops only onnxruntime refuses ({', '.join(refused)}); "
                 f"{len(plain)} ops differ on plain inputs already ({', '.join(plain)}); "
                 f"{len(no_case)} ops without a backend case with float inputs")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", help="comma-separated op names (default: every registered op)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    ops = set(args.ops.split(",")) if args.ops else None
    t0 = time.time()
    recs = sweep(ops, verbose=args.verbose)
    print(table(recs))
    print(f"{time.time() - t0:.0f} s")
    return 1 if differing_ops(recs) else 0


if __name__ == "__main__":
    sys.exit(main())
