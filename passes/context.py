"""PassContext: the one object that says which graph passes run and how, and what they did.

Opt level, disabled and required passes, per-pass options and instruments (IR dumps after
every pass, per-pass timing) live here; the CLI flags map onto it one to one
(``--opt-level``, ``--disable-pass``, ``--dump-ir``).  Every pass returns a
:class:`PassReport`; the context keeps them in order for the compile report.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

log = logging.getLogger("onnxc.passes")


class PassConfigError(ValueError):
    """A pass name or option that does not exist, or a required pass that is disabled."""


@dataclass
class PassReport:
    """What one pass did: rewrite counts and the ONNX node names it touched."""

    name: str
    changed: bool = False
    rewrites: dict = field(default_factory=dict)   # rule name -> count
    nodes: list = field(default_factory=list)      # ONNX node names touched
    seconds: float = 0.0
    skipped: str = ""                              # why it did not run, if it did not
    # the model's ONNX node names by index (PassContext.node_names), so a pass can name the
    # nodes behind the bindings it rewrote (binding tags n<k>: compiler/lowering/provenance.py)
    node_names: list = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        return {"name": self.name, "changed": self.changed, "rewrites": dict(self.rewrites),
                "nodes": list(self.nodes), "seconds": round(self.seconds, 4),
                **({"skipped": self.skipped} if self.skipped else {})}


class GraphPass:
    """Base of our Relax graph passes.

    Subclasses set ``name`` and ``opt_level`` (the lowest level at which the pass runs) and
    implement ``rewrite(mod, report, options) -> mod``, counting what they rewrite into
    ``report.rewrites`` and ``report.nodes``.
    """

    name: str = ""
    opt_level: int = 1
    options: dict = {}

    def rewrite(self, mod, report: PassReport, options: dict):
        raise NotImplementedError


class PassContext:
    """Configuration and instruments for one compilation's graph passes.

    Parameters
    ----------
    opt_level : int
        0 runs no optional pass; 3 runs all.
    disabled : iterable of str
        Pass names never to run.
    required : iterable of str
        Pass names that must run whatever the opt level.
    config : dict
        ``{pass_name: {option: value}}``, checked against each pass's ``options``.
    dump_ir : str or None
        Directory; the IR after each pass is written there as ``NNN_<pass>.txt``.
    node_names : list of str
        The model's ONNX node names by index (set by the compile driver); passes report
        the nodes they touch by these names.
    """

    def __init__(self, opt_level: int = 3, disabled=(), required=(), config=None,
                 dump_ir: str | None = None, node_names=()):
        if not 0 <= int(opt_level) <= 3:
            raise PassConfigError(f"opt level must be 0..3, got {opt_level}")
        self.opt_level = int(opt_level)
        self.disabled = set(disabled)
        self.required = set(required)
        self.config = dict(config or {})
        self.dump_ir = dump_ir
        self.node_names = list(node_names)
        self.reports: list[PassReport] = []
        self._dump_count = 0
        both = self.disabled & self.required
        if both:
            raise PassConfigError(f"pass(es) {sorted(both)} are both required and disabled")

    def validate(self, passes) -> None:
        """Refuse names that match no pass in ``passes`` (a typo must not pass silently)."""
        known = {p.name: p for p in passes}
        for name in sorted(self.disabled | self.required | set(self.config)):
            if name not in known:
                raise PassConfigError(f"unknown pass {name!r}; passes are: {', '.join(known)}")
        for name, opts in self.config.items():
            bad = set(opts) - set(known[name].options)
            if bad:
                raise PassConfigError(f"pass {name!r} has no option(s) {sorted(bad)}; its "
                                      f"options are {sorted(known[name].options) or 'none'}")

    def should_run(self, p: GraphPass) -> str:
        """'' if the pass runs, else why not."""
        if p.name in self.disabled:
            return "disabled"
        if p.name in self.required:
            return ""
        if p.opt_level > self.opt_level:
            return f"opt level {self.opt_level} < {p.opt_level}"
        return ""

    def run(self, passes, mod):
        """Run ``passes`` in order over ``mod``, recording a report for each."""
        self.validate(passes)
        self.dump("import", mod)
        for p in passes:
            report = PassReport(p.name, node_names=self.node_names)
            report.skipped = self.should_run(p)
            if not report.skipped:
                options = {**p.options, **self.config.get(p.name, {})}
                t0 = time.perf_counter()
                mod = p.rewrite(mod, report, options)
                report.seconds = time.perf_counter() - t0
                report.changed = report.changed or any(report.rewrites.values())
                self.dump(p.name, mod)
                log.info("pass %s: %s (%.3fs)", p.name, report.rewrites or "no change",
                         report.seconds)
            self.reports.append(report)
        return mod

    def dump(self, stage: str, mod) -> None:
        """Write ``mod`` as ``NNN_<stage>.txt`` under ``dump_ir`` (if set)."""
        if not self.dump_ir:
            return
        os.makedirs(self.dump_ir, exist_ok=True)
        path = os.path.join(self.dump_ir, f"{self._dump_count:03d}_{stage}.txt")
        self._dump_count += 1
        with open(path, "w") as f:
            f.write(mod.script(show_meta=False) if hasattr(mod, "script") else str(mod))
