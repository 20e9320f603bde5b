"""Shared fixtures: the model zoo (scripts/zoo.py), compiled once per test session."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import zoo  # noqa: E402

# fp32 tolerances against onnxruntime (the foundation issue's contract)
RTOL, ATOL = 1e-4, 1e-5

# The small zoo models the default test tier compiles.
SMALL = {"mlp": {}, "cnn": {}, "dwsep": {}, "transformer": {}}


def pytest_addoption(parser):
    from tests.hosts import HOSTS

    parser.addoption("--fake-host", choices=sorted(HOSTS), default=None,
                     help="compile as this fabricated host would (tests/hosts.py) and never "
                          "run compiled code: each test is checked up to its first run, "
                          "then skipped")


@pytest.fixture(autouse=True)
def _fabricated_host(request, monkeypatch, tmp_path_factory):
    """--fake-host: every test sees that host's CPU and flags, compile-only."""
    name = request.config.getoption("--fake-host")
    if name:
        from tests.hosts import compile_only, fake_host

        fake_host(monkeypatch, name, tmp_path_factory.mktemp("host"))
        compile_only(monkeypatch)


@functools.lru_cache(maxsize=None)
def zoo_model(name: str, **kw):
    return zoo.build(name, **kw)


@functools.lru_cache(maxsize=None)
def compiled(name: str, memory_reuse: bool = True):
    import compiler

    return compiler.compile(zoo_model(name), target="host", memory_reuse=memory_reuse)


def ort_run(model, feeds: dict) -> list:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(actual: list, expected: list, rtol=RTOL, atol=ATOL):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


@pytest.fixture(scope="session")
def cnn_so(tmp_path_factory):
    """examples/cnn.onnx compiled and exported once."""
    path = tmp_path_factory.mktemp("art") / "cnn.so"
    compiled("cnn").export(str(path))
    return path
