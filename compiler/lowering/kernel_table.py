"""The report's ``kernel_table``: per kernel call, the rule that scheduled it, its ONNX
nodes, FLOPs, bytes moved and share of the model's FLOPs; and the warning when kernels
that only the fallback scheduled hold a large share of the FLOPs."""

from __future__ import annotations

import numpy as np

# rules that schedule a kernel from its loop structure alone (no register tile)
GENERIC_RULES = ("fallback", "none")
# the share of the model's FLOPs in generically scheduled kernels above which compile warns
WARN_SHARE = 0.05


def kernel_table(graph_meta: dict, rules: dict, binding: dict | None = None) -> list:
    """One row per kernel call, in execution order: ``kernel``, ``rule`` (a rule name,
    ``tuned``, ``fallback``), ``nodes``, ``ops``, ``flops``, ``bytes`` (every argument's
    size: what the call reads and writes at least once) and ``flops_share``.  Symbolic
    shapes are evaluated at ``binding`` ({dim: value}, the dims' ``opt``)."""
    from runtime.dims import ShapeExpr

    tensors = [{**t, "shape": ShapeExpr(t["shape"], binding or {})(binding or {})}
               for t in graph_meta["tensors"]]
    calls = graph_meta["calls"]
    total = sum(c.get("flops", 0) for c in calls) or 0
    rows = []
    for c in calls:
        nbytes = sum(int(np.prod(tensors[t]["shape"], dtype=np.int64))
                     * np.dtype(tensors[t]["dtype"]).itemsize for t in c["args"])
        flops = int(c.get("flops", 0))
        rows.append({"kernel": c["kernel"], "rule": rules.get(c["kernel"], "none"),
                     "nodes": list(c.get("nodes", [])), "ops": c.get("ops", ""),
                     "flops": flops, "bytes": int(nbytes),
                     "flops_share": round(flops / total, 4) if total else 0.0})
    return rows


def generic_share(table: list) -> tuple:
    """(share of the model's FLOPs in kernels no specific rule took, those rows)."""
    rows = [r for r in table if r["rule"] in GENERIC_RULES and r["flops"]]
    return sum(r["flops_share"] for r in rows), rows


def generic_warning(table: list, where: str) -> str | None:
    """One warning line when fallback kernels hold more than ``WARN_SHARE`` of the FLOPs,
    naming the heaviest and suggesting ``onnxc tune`` (the report's ``warnings``; the CLI
    prints it), else None."""
    share, rows = generic_share(table)
    if share <= WARN_SHARE:
        return None
    rows = sorted(rows, key=lambda r: -r["flops"])
    names = ", ".join(f"{r['kernel']} ({'+'.join(r['nodes'][:2]) or r['ops']}: "
                      f"{r['flops_share']:.0%})" for r in rows[:3])
    msg = (f"{where}: {share:.0%} of the FLOPs are in kernels only the generic fallback "
           f"scheduled ({names}{', ...' if len(rows) > 3 else ''}); they may run far below "
           f"the machine's peak: `onnxc tune` can search schedules for them")
    return msg
