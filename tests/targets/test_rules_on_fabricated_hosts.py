"""The rule, layout and structure assertions the suite makes on code compiled for target
``host`` hold on every host the suite runs on (issue #17 item 5), checked on any machine.

Each test below compiles for ``host`` and asserts which schedule rule took a kernel (or the
layout, block or packing) before comparing numbers with onnxruntime; the rules decide from
the target's lanes and registers, so those assertions are host-dependent.  Here each is
called under a fabricated Zen 3 (AVX2), Zen 5 (AVX-512) and Sapphire Rapids (AVX-512 FP16,
AMX) (tests/hosts.py), compile-only: schedules' ``check_against_ort`` checks the rule and
skips the numbers, any other run of compiled code ends the test (``CompileOnly``), so the
assertions it makes on what was compiled are checked as that host would compute them.
The default tier calls the first case of each test; ``-m slow`` runs these tests' whole
files, every case, with ``--fake-host``.
"""

from __future__ import annotations

import importlib
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts import HOSTS, CompileOnly, compile_only, fake_host

REPO = Path(__file__).resolve().parents[2]

# tests that compile for "host" (check_against_ort, compile_run, compiler.compile) and
# assert a rule name, layout or block on the result before running it
HOST_TESTS = {
    "tests.schedules.test_conv2d": ["test_numerics_conv_bias_relu_add"],
    "tests.schedules.test_conv2d_nchwc": ["test_numerics_conv_bias_relu_residual"],
    "tests.schedules.test_conv2d_nhwc": ["test_numerics"],
    "tests.schedules.test_conv2d_packed": ["test_numerics_conv_bias_relu_add",
                                           "test_numerics_conv1d_conv3d",
                                           "test_numerics_grouped",
                                           "test_numerics_chunked_and_padded"],
    "tests.schedules.test_arg_reduction": ["test_numerics_against_onnxruntime",
                                           "test_nans_as_onnxruntime"],
    "tests.schedules.test_depthwise_pool": ["test_depthwise_numerics", "test_pool_numerics"],
    "tests.schedules.test_reduce_broadcast": ["test_numerics_squeeze_excitation"],
    "tests.schedules.test_elementwise": ["test_swish_against_onnxruntime"],
    "tests.schedules.test_inner_reduction": [
        "test_numerics_against_onnxruntime",
        "test_numerics_rms_norm_and_undivided_row_left_to_other_rules"],
    "tests.schedules.test_matmul": ["test_numerics_matmul_add",
                                    "test_numerics_attention_scores_vs_ort"],
    "tests.schedules.test_matmul_packed": ["test_numerics_matmul_add"],
    # the host's assembly: vpdpwssd, not vpmaddwd, on Zen 5 (failed there before)
    "tests.schedules.test_matmul_int8": ["test_host_assembly_has_vpmaddwd_and_result_is_exact"],
    "tests.schedules.test_pool_strided": ["test_numerics_against_onnxruntime"],
    "tests.schedules.test_row_reduction": ["test_numerics_softmax", "test_numerics_layer_norm"],
    "tests.schedules.test_tiled_reduction": ["test_numerics_reductions",
                                             "test_numerics_depthwise_conv1d"],
    "tests.schedules.test_transpose": ["test_numerics_against_onnxruntime"],
    "tests.schedules.test_upsample": ["test_numerics_resize_nearest_against_onnxruntime"],
    "tests.passes.test_pack_matmul_weights": ["test_columns_padded_to_whole_panels",
                                              "test_panel_option_and_disable"],
    "tests.passes.test_pack_conv_weights": ["test_options_min_taps_and_blocks",
                                            "test_leaves_depthwise_and_unblocked_channels_alone"],
    "tests.passes.test_pack_conv_transpose": ["test_rewrites_names_node_and_schedules",
                                              "test_blocks_two_vectors_of_the_target"],
    "tests.passes.test_pack_int_matmul": ["test_dynamic_quantized_matmul_matches_ort"],
    "tests.passes.test_qdq_matmul_integer": [
        "test_qdq_matmul_matches_ort_and_requantizes_in_the_kernel"],
    "tests.passes.test_fold_transpose_matmul": ["test_numerics_against_onnxruntime"],
    "tests.compiler.lowering.test_kernel_table": ["test_kernel_table_rows"],
    "tests.compiler.frontend.converters.test_microsoft": [
        "test_skip_layer_norm_all_outputs_reach_layer_norm_kernel"],
}


# host-dependent too, left to the slow tier here (3 s or more a case): the NaN
# legalizations' rules (test_fabricated_hosts checks them on every host), the NCHWc pool,
# onnxruntime-optimised BERT / GPT-2 exports (layer norms on cpu.row_reduction)
SLOW_FILES = ["tests/compiler/lowering/test_legalize_pool.py",
              "tests/compiler/lowering/test_legalize_reductions.py",
              "tests/compiler/test_ort_optimized.py",
              "tests/schedules"]


def _cases(fn) -> list[dict]:
    """The keyword sets pytest calls ``fn`` with: the product of its parametrize marks."""
    axes = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else names
        rows = [v.values if hasattr(v, "values") and hasattr(v, "marks") else v for v in values]
        rows = [r if len(names) > 1 else (r,) for r in rows]
        axes.append([dict(zip(names, r)) for r in rows])
    return [dict(kv for part in combo for kv in part.items())
            for combo in itertools.product(*axes)] or [{}]


def _host_tests():
    for module, names in HOST_TESTS.items():
        mod = importlib.import_module(module)
        for name in names:
            yield f"{module.rsplit('.', 1)[1]}::{name}", getattr(mod, name)


@pytest.mark.parametrize("host", list(HOSTS))
def test_host_rule_assertions_hold_on_every_host(host, monkeypatch, tmp_path):
    """The first case of each host-dependent test, compiled as ``host`` would, never run;
    each must compile at least once (a test that ran before asserting checks nothing)."""
    import tvm

    import compiler

    fake_host(monkeypatch, host, tmp_path)
    compile_only(monkeypatch)
    compiled, cpus = [], set()
    real_compile, real_tvm_compile = compiler.compile, tvm.compile

    def counting_compile(*args, **kwargs):
        cm = real_compile(*args, **kwargs)
        compiled.append("onnxc")
        cpus.add(cm.report["target"]["cpu"])
        return cm

    def counting_tvm_compile(*args, **kwargs):   # tests that build a kernel themselves
        compiled.append("tvm")
        return real_tvm_compile(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile", counting_compile)
    monkeypatch.setattr(tvm, "compile", counting_tvm_compile)
    checked = []
    for label, fn in _host_tests():
        kwargs = _cases(fn)[0]
        takes = fn.__code__.co_varnames[:fn.__code__.co_argcount]
        before = len(compiled)
        # the test's own monkeypatch (PackConvWeights.options, ...) ends with the test
        with pytest.MonkeyPatch.context() as own:
            fixtures = {"monkeypatch": own, "tmp_path": tmp_path}
            kwargs.update({k: v for k, v in fixtures.items() if k in takes})
            try:
                fn(**kwargs)
            except CompileOnly:
                pass
            except AssertionError as e:
                raise AssertionError(f"{label}{kwargs} on a fabricated {host}: {e}") from None
        assert len(compiled) > before, f"{label}: nothing compiled before its first run"
        checked.append(label)
    assert cpus == {HOSTS[host][0]}      # every model was compiled for the fabricated host
    assert len(checked) == sum(map(len, HOST_TESTS.values()))


@pytest.mark.slow
@pytest.mark.parametrize("host", list(HOSTS))
def test_host_test_files_pass_compile_only_on_every_host(host):
    """Every test of the files above and SLOW_FILES, under ``--fake-host``:
    no failure, and most tests either pass (fixed-target structure tests) or compiled and
    reached a run (skipped)."""
    files = sorted({str(REPO / (m.replace(".", "/") + ".py")) for m in HOST_TESTS}
                   | {str(REPO / f) for f in SLOW_FILES})
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--fake-host", host, "-W", "ignore", *files],
                         cwd=REPO, capture_output=True, text=True, timeout=3000)
    summary = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0 and "failed" not in summary and "error" not in summary, \
        out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in summary and " skipped" in summary, summary
