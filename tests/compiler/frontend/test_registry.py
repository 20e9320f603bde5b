"""compiler/frontend/registry.py: opset ranges, explicit overrides (a second converter for
covered opsets without override=True is refused), previous(), and the registry onnxc
itself builds."""

from __future__ import annotations

import pytest

import compiler  # noqa: F401  (registers onnxc's converters)
from compiler.frontend.registry import (REGISTRY, OpEntry, OperatorRegistry, RegistrationError,
                                        previous, register_op)


def _conv(tag):
    def convert(bb, inputs, attrs, ctx):
        return tag
    return convert


def test_a_second_converter_for_covered_opsets_needs_override():
    reg = OperatorRegistry()
    register_op("com.acme", "Op", since=1, registry=reg)(_conv("v1"))
    with pytest.raises(RegistrationError, match=r"com.acme:Op \(opsets 3\+\) is already "
                                                r"registered \(custom 1\+\): pass override=True"):
        register_op("com.acme", "Op", since=3, registry=reg)(_conv("v3"))
    assert len(reg.versions("com.acme", "Op")) == 1  # the refused one is not kept


def test_disjoint_opset_ranges_need_no_override():
    reg = OperatorRegistry()
    reg.add(OpEntry("com.acme", "Op", 1, 3, _conv("v1")))
    reg.add(OpEntry("com.acme", "Op", 4, None, _conv("v4")))
    assert reg.lookup("com.acme", "Op", 3).converter(None, [], {}, None) == "v1"
    assert reg.lookup("com.acme", "Op", 4).converter(None, [], {}, None) == "v4"
    assert reg.lookup("com.acme", "Op", 4).replaces is None


def test_override_records_and_delegates_to_what_it_replaces():
    reg = OperatorRegistry()
    old, new = _conv("old"), _conv("new")
    reg.add(OpEntry("", "Op", 1, None, old, implementation="tvm"))
    entry = reg.add(OpEntry("ai.onnx", "Op", 5, None, new), override=True)
    assert entry.replaces.converter is old
    assert reg.previous(new) is old
    assert reg.lookup("", "Op", 7) is entry and reg.lookup("", "Op", 4).converter is old


def test_override_of_nothing_is_refused():
    reg = OperatorRegistry()
    with pytest.raises(RegistrationError, match="override=True, but no registered converter"):
        reg.add(OpEntry("com.acme", "Op", 1, None, _conv("x")), override=True)


def test_previous_of_a_converter_that_replaced_nothing_raises():
    reg = OperatorRegistry()
    conv = _conv("x")
    reg.add(OpEntry("com.acme", "Op", 1, None, conv))
    with pytest.raises(KeyError):
        reg.previous(conv)


def test_every_onnxc_override_is_declared():
    """In the registry onnxc builds, an entry replaces another exactly when their opsets
    overlap (which add() enforces), and what it replaces was registered before it."""
    for (domain, op), versions in REGISTRY.entries.items():
        for i, e in enumerate(versions):
            earlier = [p for p in versions[:i] if p.overlaps(e)]
            assert (e.replaces is not None) == bool(earlier), (domain, op, e.opsets())
            if e.replaces is not None:
                assert e.replaces is earlier[-1]


def test_resize_chain_is_explicit():
    """Resize 11+: exact, over the scales guard, over the antialias refusal, over TVM's."""
    exact = REGISTRY.lookup("", "Resize", 19)
    chain = []
    e = exact
    while e is not None:
        chain.append((e.implementation, e.opsets()))
        e = e.replaces
    assert chain == [("onnxc", "11+"), ("onnxc", "10+"), ("onnxc", "10+"), ("tvm", "1+")]
    assert previous(exact.converter) is exact.replaces.converter
