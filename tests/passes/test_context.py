"""PassContext: opt level, disabled/required passes, options, IR dumps, reports."""

from __future__ import annotations

import pytest

import compiler
import passes
from passes.context import GraphPass, PassContext, PassReport
from tests.conftest import assert_close, ort_run, zoo, zoo_model


class _Counting(GraphPass):
    name = "counting"
    opt_level = 2
    options = {"tag": "x"}

    def rewrite(self, mod, report, options):
        report.rewrites["seen"] = 1
        report.nodes.append(options["tag"])
        return mod


class _Mod:
    def script(self, show_meta=False):
        return "module"


def test_runs_and_reports():
    ctx = PassContext(config={"counting": {"tag": "y"}})
    ctx.run([_Counting()], _Mod())
    (r,) = ctx.reports
    assert r.changed and r.rewrites == {"seen": 1} and r.nodes == ["y"] and not r.skipped


def test_opt_level_disabled_required():
    for ctx, skipped in [(PassContext(opt_level=1), "opt level 1 < 2"),
                         (PassContext(disabled=["counting"]), "disabled"),
                         (PassContext(opt_level=0, required=["counting"]), "")]:
        ctx.run([_Counting()], _Mod())
        assert ctx.reports[0].skipped == skipped


@pytest.mark.parametrize("kw, message", [
    (dict(disabled=["nope"]), "unknown pass 'nope'"),
    (dict(config={"counting": {"bad": 1}}), "has no option"),
])
def test_typos_are_errors(kw, message):
    with pytest.raises(passes.PassConfigError, match=message):
        PassContext(**kw).validate([_Counting()])


def test_required_and_disabled_conflict():
    with pytest.raises(passes.PassConfigError, match="both required and disabled"):
        PassContext(disabled=["a"], required=["a"])


def test_opt_level_range():
    with pytest.raises(passes.PassConfigError, match="0..3"):
        PassContext(opt_level=7)


def test_dump_ir(tmp_path):
    ctx = PassContext(dump_ir=str(tmp_path))
    ctx.run([_Counting()], _Mod())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000_import.txt", "001_counting.txt"]


def test_report_to_dict():
    r = PassReport("p", rewrites={"a => b": 2}, nodes=["n1"])
    d = r.to_dict()
    assert d["name"] == "p" and d["rewrites"] == {"a => b": 2} and d["nodes"] == ["n1"]


def test_disabling_every_pass_still_correct():
    model = zoo_model("cnn")
    feeds = zoo.random_inputs(model, seed=7)
    from compiler.pipeline import graph_passes

    cm = compiler.compile(model, disabled_passes=[p.name for p in graph_passes()])
    assert all(p["skipped"] == "disabled" for p in cm.report["passes"])
    assert_close(cm.session().run(None, feeds), ort_run(model, feeds))
