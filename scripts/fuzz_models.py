#!/usr/bin/env python3
"""Fuzz onnxc with broken ONNX models: every case must end ok or in a documented error.

Generates ``N`` cases, deterministically from ``--seed``: mutations of small zoo models
(scripts/zoo.py) and of small hand-made graphs -- truncated files, byte flips, random
protobufs, random attribute values and types, random shapes (0, negative, 2^40), wrong
dtypes, removed initializers, node cycles, dangling inputs, duplicated names, random
opsets, changed op types, strings that are not UTF-8 (a bit flipped inside a string of the
file, or a name, attribute value, doc_string, producer or metadata entry set to such bytes
through the protobuf API).  Each case goes through four stages in a crash-isolated worker
process with a timeout: ``compile`` (``compiler.compile(model)``), ``export`` (the ``.so``),
``load`` (``runtime.load``) and ``run`` (a DynamicModel goes from compile to its session's
run), and is counted as one of

* ``ok``                the model compiled and ran;
* ``clean:<Type>``      a documented error: ``compiler.CompileError`` (``ModelError``,
                        ``UnsupportedError``) or a ``ValueError`` raised by onnxc itself;
* ``crash``             the worker died of a signal (segfault, abort);
* ``hang``              the case ran past ``--timeout`` seconds;
* ``unclean:<Type>``    any other exception (a bare TVM error, KeyError, AssertionError,
                        a ValueError raised inside TVM or numpy...).

With ``--isolate`` each case compiles through ``compiler.compile(..., isolate=True,
timeout=...)`` (compiler/isolate.py, as ``onnxc compile`` does), and two more outcomes
count what isolation contained: ``isolated-crash:<SIGNAL>`` (the compile process died of
a signal; the user got a ``CompileCrashError``) and ``isolated-hang`` (it ran past the
compile timeout and was killed: ``CompileTimeoutError``).  They are still TVM/onnxc bugs,
so they are listed with the crashes and make the exit status 1.  Each isolated compile
starts a fresh interpreter (about a second more per case).

The summary counts the outcomes, then per stage how many cases reached it and how many
passed it or ended there (clean, unclean, crash, hang).  Crashes, hangs and unclean errors
are printed grouped by their (type, message) with the stage they happened in.  Exit
status 1 when there is any.

    python scripts/fuzz_models.py -n 1000 --jobs 2
    python scripts/fuzz_models.py -n 60 --seed 1 --json out.json
    python scripts/fuzz_models.py -n 1000 --jobs 2 --isolate
    python scripts/fuzz_models.py -n 400 --isolate --conformance-ops Loop,Scan,If,DFT,Resize
    python scripts/fuzz_models.py -n 50 --mutations utf8_flip,utf8_field
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

HUGE = 2 ** 40


# --------------------------------------------------------------------------- #
# Base models
# --------------------------------------------------------------------------- #

def _hand_made():
    """Small graphs covering many op kinds (each a few nodes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    F = TensorProto.FLOAT

    def model(name, nodes, inputs, outputs, inits=(), opset=17):
        g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m

    def vi(name, shape, t=F):
        return helper.make_tensor_value_info(name, t, shape)

    def init(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    out = {}
    out["add_relu"] = model("add_relu", [
        helper.make_node("Add", ["x", "b"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu")],
        [vi("x", [2, 3])], [vi("y", [2, 3])], [init("b", rng.standard_normal(3).astype("f4"))])
    out["matmul"] = model("matmul", [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", [2, 4])], [vi("y", [2, 5])], [init("w", rng.standard_normal((4, 5)).astype("f4"))])
    out["conv"] = model("conv", [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("MaxPool", ["c"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])],
        [vi("x", [1, 2, 6, 6])], [vi("y", [1, 4, 3, 3])],
        [init("w", rng.standard_normal((4, 2, 3, 3)).astype("f4")),
         init("b", rng.standard_normal(4).astype("f4"))])
    out["reshape_transpose"] = model("reshape_transpose", [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["y"], name="transpose", perm=[1, 0])],
        [vi("x", [2, 3, 4])], [vi("y", [12, 2])], [init("shape", np.array([2, 12], "i8"))])
    out["concat_slice"] = model("concat_slice", [
        helper.make_node("Concat", ["x", "z"], ["c"], name="concat", axis=1),
        helper.make_node("Slice", ["c", "st", "en", "ax"], ["y"], name="slice")],
        [vi("x", [2, 3]), vi("z", [2, 2])], [vi("y", [2, 3])],
        [init("st", np.array([1], "i8")), init("en", np.array([4], "i8")),
         init("ax", np.array([1], "i8"))])
    out["gather_softmax"] = model("gather_softmax", [
        helper.make_node("Gather", ["table", "idx"], ["g"], name="gather", axis=0),
        helper.make_node("Softmax", ["g"], ["y"], name="softmax", axis=-1)],
        [vi("idx", [3], TensorProto.INT64)], [vi("y", [3, 4])],
        [init("table", rng.standard_normal((5, 4)).astype("f4"))])
    out["reduce_cast"] = model("reduce_cast", [
        helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[1], keepdims=0),
        helper.make_node("Cast", ["m"], ["y"], name="cast", to=TensorProto.INT32)],
        [vi("x", [3, 4])], [vi("y", [3], TensorProto.INT32)], opset=13)
    out["symbolic"] = model("symbolic", [
        helper.make_node("Mul", ["x", "x"], ["y"], name="square")],
        [vi("x", ["n", 4])], [vi("y", ["n", 4])])
    out["gemm_split"] = model("gemm_split", [
        helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="gemm", transB=1),
        helper.make_node("Split", ["g"], ["y1", "y2"], name="split", axis=1)],
        [vi("x", [2, 3])], [vi("y1", [2, 2]), vi("y2", [2, 2])],
        [init("w", rng.standard_normal((4, 3)).astype("f4")),
         init("b", rng.standard_normal(4).astype("f4"))])
    out["where_expand"] = model("where_expand", [
        helper.make_node("Greater", ["x", "zero"], ["c"], name="greater"),
        helper.make_node("Where", ["c", "x", "zero"], ["w"], name="where"),
        helper.make_node("Expand", ["w", "shp"], ["y"], name="expand")],
        [vi("x", [1, 3])], [vi("y", [2, 3])],
        [init("zero", np.zeros((), "f4")), init("shp", np.array([2, 3], "i8"))])
    for m in out.values():
        onnx.checker.check_model(m)
    return out


def conformance_bases(ops) -> dict:
    """The ONNX backend node tests' models (tensor cases) whose node list uses any of ``ops``:
    mutating those reaches converters the zoo models do not use (control flow, narrow types,
    signal ops, ...)."""
    from onnx.backend.test.case.node import collect_testcases

    want = set(ops)
    out = {}
    for case in collect_testcases(None):
        used = {n.op_type for n in case.model.graph.node}
        if used & want and case.model.graph.input:
            out[f"onnx.{case.name}"] = case.model
    if not out:
        raise SystemExit(f"no ONNX backend test uses any of {sorted(want)}")
    return out


def base_models():
    import zoo

    models = dict(_hand_made())
    models["zoo.mlp"] = zoo.build("mlp", batch=1)
    models["zoo.cnn"] = zoo.build("cnn", image=8)
    models["zoo.transformer"] = zoo.build("transformer", seq=4, hidden=16, heads=2, ffn=32)
    models["zoo.dwsep"] = zoo.build("dwsep", channels=8, image=8, expand=2)
    return models


# --------------------------------------------------------------------------- #
# Mutations: each takes (rng, ModelProto copy) and returns (what, bytes|ModelProto)
# --------------------------------------------------------------------------- #

_INTS = [0, 1, -1, 2, 3, -7, 64, 2 ** 31 - 1, -2 ** 31, HUGE, -HUGE, 2 ** 62]
_DIMS = [0, 1, 2, 3, 7, -1, -5, HUGE, 2 ** 31, 2 ** 62]
_OPSETS = [-3, 0, 1, 5, 6, 7, 9, 11, 13, 16, 17, 19, 21, 22, 23, 30, 2 ** 31 - 1, 2 ** 62]
_OPS = ["Add", "Relu", "MatMul", "Conv", "Reshape", "Transpose", "Concat", "Gather", "Softmax",
        "ReduceSum", "Cast", "Split", "Where", "Expand", "Slice", "Gemm", "Identity", "Loop",
        "If", "NonZero", "TopK", "Resize", "Pad", "Tile", "BatchNormalization", "LSTM",
        "NotAnOp", "Einsum", "ConstantOfShape", "Range", "Unsqueeze", "Squeeze", "Flatten"]


def m_truncate(rng, m):
    data = m.SerializeToString()
    cut = rng.randrange(0, len(data))
    return f"truncate to {cut} of {len(data)} bytes", data[:cut]


def m_byte_flips(rng, m):
    data = bytearray(m.SerializeToString())
    k = rng.choice([1, 2, 4, 16, 64])
    # bias towards the graph structure (the first bytes hold nodes, names, attributes)
    limit = min(len(data), rng.choice([256, 2048, len(data)]))
    for _ in range(k):
        i = rng.randrange(limit)
        data[i] ^= 1 << rng.randrange(8)
    return f"{k} bit flips in the first {limit} bytes", bytes(data)


def m_random_bytes(rng, m):
    n = rng.choice([0, 1, 8, 100, 5000])
    return f"{n} random bytes", bytes(rng.randrange(256) for _ in range(n))


def m_random_protobuf(rng, m):
    """Valid protobuf wire format with random field numbers / types / contents."""
    out = bytearray()
    for _ in range(rng.randrange(1, 12)):
        field = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 14, 20, rng.randrange(1, 1000)])
        wt = rng.choice([0, 1, 2, 5])
        key = (field << 3) | wt
        out += _varint(key)
        if wt == 0:
            out += _varint(rng.choice(_INTS) & (2 ** 64 - 1))
        elif wt == 1:
            out += bytes(rng.randrange(256) for _ in range(8))
        elif wt == 5:
            out += bytes(rng.randrange(256) for _ in range(4))
        else:
            payload = (m.graph.node[rng.randrange(len(m.graph.node))].SerializeToString()
                       if rng.random() < 0.5 else bytes(rng.randrange(256)
                                                        for _ in range(rng.randrange(20))))
            out += _varint(len(payload)) + payload
    return "random protobuf fields", bytes(out)


def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def m_attribute(rng, m):
    from onnx import AttributeProto, helper

    nodes = [n for n in m.graph.node if n.attribute] or list(m.graph.node)
    node = rng.choice(nodes)
    if node.attribute and rng.random() < 0.8:
        a = rng.choice(list(node.attribute))
        choice = rng.randrange(5)
        if choice == 0:  # same type, random value
            if a.type == AttributeProto.INT:
                a.i = rng.choice(_INTS)
            elif a.type == AttributeProto.INTS:
                del a.ints[:]
                a.ints.extend(rng.choice(_INTS) for _ in range(rng.randrange(0, 6)))
            elif a.type == AttributeProto.FLOAT:
                a.f = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30])
            else:
                a.i = rng.choice(_INTS)
            return f"node {node.name!r} attribute {a.name} random value", m
        if choice == 1:  # wrong attribute type
            new = rng.choice([helper.make_attribute(a.name, 1.5),
                              helper.make_attribute(a.name, "text"),
                              helper.make_attribute(a.name, [1.0, 2.0]),
                              helper.make_attribute(a.name, 3),
                              helper.make_attribute(a.name, [3, 4])])
            a.CopyFrom(new)
            return f"node {node.name!r} attribute {a.name} wrong type", m
        if choice == 2:  # type field lies about the value
            a.type = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 0, 11, 13])
            return f"node {node.name!r} attribute {a.name} type field {a.type}", m
        if choice == 3:
            node.attribute.remove(a)
            return f"node {node.name!r} attribute {a.name} removed", m
        node.attribute.append(helper.make_attribute(a.name, 1))  # duplicated attribute
        return f"node {node.name!r} attribute {a.name} duplicated", m
    name = rng.choice(["axis", "perm", "kernel_shape", "pads", "strides", "to", "group",
                       "dilations", "keepdims", "bogus"])
    val = rng.choice([rng.choice(_INTS), [rng.choice(_INTS) for _ in range(rng.randrange(1, 5))],
                      0.5, "s"])
    node.attribute.append(helper.make_attribute(name, val))
    return f"node {node.name!r} new attribute {name}={val!r}", m


def m_shapes(rng, m):
    inits = {t.name for t in m.graph.initializer}
    choice = rng.randrange(4)
    if choice < 2:
        vis = [v for v in m.graph.input if v.name not in inits] or list(m.graph.input)
        if choice == 1 and m.graph.output:
            vis = list(m.graph.output)
        vi = rng.choice(vis)
        dims = vi.type.tensor_type.shape.dim
        if choice == 0 and rng.random() < 0.7:  # let shape inference carry the new dims
            for k, o in enumerate(m.graph.output):
                for j, od in enumerate(o.type.tensor_type.shape.dim):
                    od.Clear()
                    od.dim_param = f"out{k}_{j}"
            del m.graph.value_info[:]
        if dims and rng.random() < 0.8:
            d = rng.choice(list(dims))
            d.Clear()
            if rng.random() < 0.85:
                d.dim_value = rng.choice(_DIMS)
            else:
                d.dim_param = rng.choice(["n", "", "batch"])
            return f"{vi.name!r} dim -> {d.dim_value or d.dim_param!r}", m
        # change the rank
        if dims and rng.random() < 0.5:
            vi.type.tensor_type.shape.dim.pop()
        else:
            vi.type.tensor_type.shape.dim.add().dim_value = rng.choice(_DIMS)
        return f"{vi.name!r} rank changed", m
    if not m.graph.initializer:
        return m_attribute(rng, m)
    t = rng.choice(list(m.graph.initializer))
    if choice == 2:  # dims lie about the data
        if t.dims and rng.random() < 0.7:
            t.dims[rng.randrange(len(t.dims))] = rng.choice(_DIMS)
        else:
            t.dims.append(rng.choice(_DIMS))
        return f"initializer {t.name!r} dims -> {list(t.dims)}", m
    # data length mismatch
    if t.raw_data:
        t.raw_data = t.raw_data[:rng.randrange(len(t.raw_data) + 1)]
    else:
        for f in (t.float_data, t.int64_data, t.int32_data):
            if len(f):
                f.pop()
    return f"initializer {t.name!r} data shortened", m


def m_dtype(rng, m):
    codes = list(range(0, 26)) + [99]
    choice = rng.randrange(3)
    if choice == 0 and m.graph.initializer:
        t = rng.choice(list(m.graph.initializer))
        t.data_type = rng.choice(codes)
        return f"initializer {t.name!r} data_type -> {t.data_type}", m
    vis = list(m.graph.input) + list(m.graph.output) if choice < 2 else list(m.graph.output)
    vi = rng.choice(vis)
    vi.type.tensor_type.elem_type = rng.choice(codes)
    return f"{vi.name!r} elem_type -> {vi.type.tensor_type.elem_type}", m


def m_remove_initializer(rng, m):
    if not m.graph.initializer:
        return m_dangling(rng, m)
    i = rng.randrange(len(m.graph.initializer))
    name = m.graph.initializer[i].name
    del m.graph.initializer[i]
    if rng.random() < 0.5:  # also from the inputs: then it dangles
        keep = [v for v in m.graph.input if v.name != name]
        del m.graph.input[:]
        m.graph.input.extend(keep)
    return f"initializer {name!r} removed", m


def m_cycle(rng, m):
    nodes = m.graph.node
    if len(nodes) < 2:
        n = nodes[0]
        n.input[0] = n.output[0]
        return "self loop", m
    i = rng.randrange(len(nodes) - 1)
    j = rng.randrange(i + 1, len(nodes))
    if not nodes[i].input:
        nodes[i].input.append(nodes[j].output[0])
    else:
        nodes[i].input[rng.randrange(len(nodes[i].input))] = nodes[j].output[0]
    return f"cycle: node {i} reads node {j}'s output", m


def m_dangling(rng, m):
    node = rng.choice(list(m.graph.node))
    if node.input and rng.random() < 0.7:
        k = rng.randrange(len(node.input))
        node.input[k] = rng.choice(["nowhere", "", node.output[0] if node.output else "x"])
        return f"node {node.name!r} input {k} -> {node.input[k]!r}", m
    if rng.random() < 0.5 and node.input:
        node.input.pop()
        return f"node {node.name!r} lost its last input", m
    node.input.append(rng.choice(["nowhere", ""]) if rng.random() < 0.5 else node.input[0]
                      if node.input else "nowhere")
    return f"node {node.name!r} got an extra input", m


def m_duplicate(rng, m):
    nodes = m.graph.node
    choice = rng.randrange(4)
    if choice == 0 and len(nodes) > 1:
        a, b = rng.sample(range(len(nodes)), 2)
        nodes[b].output[0] = nodes[a].output[0]
        return f"nodes {a} and {b} write the same tensor", m
    if choice == 1 and len(m.graph.initializer) > 1:
        a, b = m.graph.initializer[0], m.graph.initializer[1]
        b.name = a.name
        return "duplicated initializer name", m
    if choice == 2:
        m.graph.input.add().CopyFrom(m.graph.input[0])
        return "duplicated graph input", m
    if m.graph.output:
        m.graph.output.add().CopyFrom(m.graph.output[0])
        return "duplicated graph output", m
    return m_cycle(rng, m)


def m_opset(rng, m):
    choice = rng.randrange(4)
    if choice == 0:
        m.opset_import[0].version = rng.choice(_OPSETS)
        return f"opset -> {m.opset_import[0].version}", m
    if choice == 1:
        del m.opset_import[:]
        return "no opset_import", m
    if choice == 2:
        o = m.opset_import.add()
        o.domain = rng.choice(["", "ai.onnx", "com.microsoft", "bogus.domain", "ai.onnx.ml"])
        o.version = rng.choice(_OPSETS)
        return f"extra opset {o.domain!r} {o.version}", m
    node = rng.choice(list(m.graph.node))
    node.domain = rng.choice(["bogus.domain", "com.microsoft", "ai.onnx.ml"])
    return f"node {node.name!r} domain -> {node.domain}", m


def m_op_type(rng, m):
    node = rng.choice(list(m.graph.node))
    old = node.op_type
    node.op_type = rng.choice(_OPS)
    return f"node {node.name!r} {old} -> {node.op_type}", m


def m_ir_version(rng, m):
    m.ir_version = rng.choice([-1, 0, 1, 3, 7, 8, 9, 10, 11, 99, 2 ** 40])
    return f"ir_version -> {m.ir_version}", m


def m_outputs(rng, m):
    choice = rng.randrange(3)
    if choice == 0 and m.graph.output:
        m.graph.output[0].name = "not_produced"
        return "graph output not produced", m
    if choice == 1:
        del m.graph.output[:]
        return "no graph outputs", m
    o = m.graph.output.add()
    o.CopyFrom(m.graph.input[0])
    return "a graph input is also an output", m


def m_two(rng, m):
    a, b = rng.sample([m_attribute, m_shapes, m_dtype, m_remove_initializer, m_dangling,
                       m_op_type, m_opset, m_duplicate], 2)
    wa, m = a(rng, m)
    if not hasattr(m, "graph"):
        return wa, m
    wb, m = b(rng, m)
    return f"{wa}; {wb}", m


# -- strings that are not UTF-8 (issue #19): protobuf hands them back as bytes -----------

# byte sequences no UTF-8 decoder accepts: a lone continuation byte, a lead byte without
# its continuation, an overlong "/", an encoded surrogate, a code point past U+10FFFF
_NOT_UTF8 = [b"\x80", b"\xff", b"nan\xedodel", b"\xc3\x28", b"\xc0\xaf",
             b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok\xe2\x82"]


def _string_fields(msg, out=None):
    """Every (message, field, index or None) holding a string of ``msg``, recursively
    (string attribute values included: declared bytes, UTF-8 text by the spec)."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    out = [] if out is None else out
    for field in msg.DESCRIPTOR.fields:
        repeated = field.label == field.LABEL_REPEATED if not hasattr(field, "is_repeated") \
            else field.is_repeated
        if field.type == FD.TYPE_MESSAGE:
            for child in (getattr(msg, field.name) if repeated else
                          [getattr(msg, field.name)] if msg.HasField(field.name) else []):
                _string_fields(child, out)
        elif field.type == FD.TYPE_STRING or (msg.DESCRIPTOR.name == "AttributeProto"
                                              and field.name in ("s", "strings")):
            if repeated:
                out.extend((msg, field.name, i) for i in range(len(getattr(msg, field.name))))
            else:
                out.append((msg, field.name, None))
    return out


def set_raw(msg, field: str, raw: bytes, index=None) -> None:
    """Set string field ``field`` of ``msg`` (element ``index`` of a repeated one) to ``raw``
    through the wire format: protobuf's setters refuse bytes that are not UTF-8, its parser
    keeps them (proto2)."""
    number = msg.DESCRIPTOR.fields_by_name[field].number

    def encode(b):
        return _varint(number << 3 | 2) + _varint(len(b)) + b

    if index is None:
        msg.MergeFromString(encode(raw))
        return
    values = [v if isinstance(v, bytes) else v.encode() for v in getattr(msg, field)]
    values[index] = raw
    msg.ClearField(field)
    msg.MergeFromString(b"".join(encode(v) for v in values))


def _spoil(rng, value: bytes) -> bytes:
    """``value`` made invalid UTF-8: one byte's high bit flipped, or a bad sequence put in."""
    if value and rng.random() < 0.6:
        i = rng.randrange(len(value))
        return value[:i] + bytes([value[i] ^ 0x80]) + value[i + 1:]
    bad = rng.choice(_NOT_UTF8)
    cut = rng.randrange(len(value) + 1)
    return value[:cut] + bad + value[cut:]


def m_utf8_flip(rng, m):
    """Byte level: flip the high bit of one byte inside a string field of the serialised
    model (a length-delimited value found by its length prefix), so that it is no longer
    valid UTF-8."""
    values = set()
    for msg, field, index in _string_fields(m):
        v = getattr(msg, field) if index is None else getattr(msg, field)[index]
        v = v if isinstance(v, bytes) else v.encode()
        if v and all(b < 0x80 for b in v):  # ASCII: one high bit makes it invalid
            values.add(v)
    data = bytearray(m.SerializeToString())
    spots = []
    for v in sorted(values):
        pattern = _varint(len(v)) + v
        start = data.find(pattern)
        while start >= 0:
            spots.append((v, start + len(pattern) - len(v)))
            start = data.find(pattern, start + 1)
    if not spots:
        raise ValueError("no ASCII string field to flip")
    v, at = rng.choice(spots)
    i = rng.randrange(len(v))
    data[at + i] ^= 0x80
    return f"high bit of byte {i} of string {v.decode()!r} flipped (file offset {at + i})", \
        bytes(data)


def m_utf8_field(rng, m):
    """Structural: set one string field -- a name, input/output, attribute value,
    doc_string, producer, metadata_props entry, dim_param... -- to bytes that are not UTF-8
    through the protobuf API; or rename one tensor everywhere it is used, so that the
    encoding is the model's only defect."""
    choice = rng.randrange(4)
    if choice == 0:  # consistent rename of a graph input or initializer
        names = [vi.name for vi in m.graph.input] + [t.name for t in m.graph.initializer]
        old = rng.choice(names)
        new = _spoil(rng, old.encode())
        for msg, field, index in _string_fields(m):
            v = getattr(msg, field) if index is None else getattr(msg, field)[index]
            if v == old and (field in ("input", "output") or
                             (field == "name" and msg.DESCRIPTOR.name in
                              ("ValueInfoProto", "TensorProto"))):
                set_raw(msg, field, new, index)
        return f"tensor {old!r} renamed to {new!r} everywhere", m
    if choice == 1:  # free text: producer, doc strings, metadata
        target = rng.choice(["producer_name", "producer_version", "doc_string", "graph doc",
                             "node doc", "metadata key", "metadata value"])
        if target.startswith("metadata"):
            entry = m.metadata_props.add()
            entry.key, entry.value = "author", "someone"
            field = target.split()[1]
            set_raw(entry, field, _spoil(rng, getattr(entry, field).encode()))
            return f"metadata_props {field} not UTF-8", m
        msg = {"graph doc": m.graph, "node doc": rng.choice(list(m.graph.node))}.get(target, m)
        field = "doc_string" if target.endswith("doc") else target
        old = getattr(msg, field)
        set_raw(msg, field, _spoil(rng, (old if isinstance(old, bytes) else old.encode())
                                   or b"text"))
        return f"{target} not UTF-8", m
    fields = _string_fields(m)
    if choice == 2:  # names only
        fields = [f for f in fields if f[1] in ("name", "input", "output")]
    msg, field, index = rng.choice(fields)
    old = getattr(msg, field) if index is None else getattr(msg, field)[index]
    new = _spoil(rng, old if isinstance(old, bytes) else old.encode())
    set_raw(msg, field, new, index)
    return (f"{msg.DESCRIPTOR.name}.{field}" + ("" if index is None else f"[{index}]")
            + f" {old!r} -> {new!r}"), m


MUTATIONS = [
    (m_truncate, 2), (m_byte_flips, 3), (m_random_bytes, 1), (m_random_protobuf, 1),
    (m_attribute, 4), (m_shapes, 4), (m_dtype, 2), (m_remove_initializer, 1), (m_cycle, 1),
    (m_dangling, 2), (m_duplicate, 1), (m_opset, 2), (m_op_type, 2), (m_ir_version, 1),
    (m_outputs, 1), (m_two, 2), (m_utf8_flip, 2), (m_utf8_field, 3),
]


def generate(n: int, seed: int = 0, bases: dict | None = None, only=None):
    """Yield n cases: dict(id, base, what, kind ('bytes'|'proto'), data).  ``only``: the
    names (without ``m_``) of the mutations to draw from, else all."""
    import onnx

    bases = bases or base_models()
    names = sorted(bases)
    funcs = [f for f, w in MUTATIONS for _ in range(w) if not only or f.__name__[2:] in only]
    for i in range(n):
        rng = random.Random(f"{seed}:{i}")
        base = rng.choice(names)
        m = onnx.ModelProto()
        m.CopyFrom(bases[base])
        for _attempt in range(20):  # a mutation that cannot apply to this base: another
            fn = rng.choice(funcs)
            try:
                what, out = fn(rng, m)
                break
            except (ValueError, IndexError, TypeError):
                m.CopyFrom(bases[base])
        if isinstance(out, onnx.ModelProto):
            try:
                data, kind = out.SerializeToString(), "proto"
            except Exception as e:  # e.g. a value protobuf cannot encode
                data, kind = repr(e).encode(), "bytes"
        else:
            data, kind = out, "bytes"
        yield {"id": i, "base": base, "mutation": fn.__name__[2:], "what": what, "kind": kind,
               "data": data}


# --------------------------------------------------------------------------- #
# Worker: compile + run one case; classify the exception
# --------------------------------------------------------------------------- #

def _feeds(sess):
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else 2 for d in inp.shape]
        dtype = np.dtype(inp.dtype)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if nbytes > MAX_FEED_BYTES:
            raise _TooLarge(f"input {inp.name!r} would take {nbytes} bytes")
        if dtype.kind == "f":
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[inp.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[inp.name] = rng.integers(0, 3, size=shape).astype(dtype)
    return feeds


MAX_FEED_BYTES = 1 << 30  # the fuzzer does not feed inputs larger than this


class _TooLarge(Exception):
    """The model compiled and its session was created, but the fuzzer will not feed it."""


def _ours(exc) -> bool:
    """Was the exception raised by onnxc's own code (not inside TVM/numpy/onnx)?

    An error raised again by compiler/isolate.py carries the compile process's traceback
    as text in its ``__cause__``: its innermost frame is the one that counts."""
    remote = exc.__cause__
    if type(remote).__name__ == "RemoteTraceback":
        files = re.findall(r'File "([^"]+)", line \d+', str(remote))
        if not files:
            return False
        last = os.path.abspath(files[-1])
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        if not frames:
            return False
        last = os.path.abspath(frames[-1].filename)
    return any(last.startswith(os.path.join(REPO, p) + os.sep)
               for p in ("compiler", "runtime", "passes", "schedules", "targets"))


def classify(exc: BaseException) -> str:
    import compiler
    import runtime

    if isinstance(exc, compiler.CompileCrashError):
        return "isolated-crash"
    if isinstance(exc, compiler.CompileTimeoutError):
        return "isolated-hang"
    if isinstance(exc, (compiler.CompileError, runtime.ArtifactError,
                        runtime.MemoryLimitError)):
        return "clean"
    if isinstance(exc, ValueError) and _ours(exc):
        return "clean"
    return "unclean"


# what each case goes through, in order; a DynamicModel (symbolic shapes) has no single
# artifact: its session compiles per input shape, so it goes from compile to run
STAGES = ("compile", "export", "load", "run")


def run_case(case: dict, tmpdir: str, isolate: bool = False, compile_timeout=None,
             on_stage=None) -> dict:
    """compile -> export (the .so) -> runtime.load -> run; the result says the stage
    reached (``stage``) and its outcome.  ``on_stage(name)`` is called as each begins."""
    import onnx

    import compiler
    import runtime

    t0 = time.perf_counter()
    stage, skipped = "compile", []
    so = os.path.join(tmpdir, f"case{case['id']}.so")

    def enter(name):
        nonlocal stage
        stage = name
        if on_stage:
            on_stage(name)

    try:
        enter("compile")
        if case["kind"] == "bytes":
            path = os.path.join(tmpdir, f"case{case['id']}.onnx")
            with open(path, "wb") as f:
                f.write(case["data"])
            model = path
        else:
            model = onnx.ModelProto()
            model.ParseFromString(case["data"])
        cm = (compiler.compile(model, isolate=True, timeout=compile_timeout) if isolate
              else compiler.compile(model))
        if isinstance(cm, compiler.DynamicModel):
            skipped = ["export", "load"]
            enter("run")
            sess = cm.session()
        else:
            enter("export")
            cm.export(so)
            enter("load")
            sess = runtime.load(so)
            enter("run")
        outs = sess.run(None, _feeds(sess))
        assert all(isinstance(o, np.ndarray) for o in outs)
        return {"outcome": "ok", "stage": stage, "skipped": skipped,
                "seconds": time.perf_counter() - t0}
    except _TooLarge as e:
        return {"outcome": "ok:not-run", "stage": stage, "skipped": skipped,
                "message": str(e), "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 -- that is the point
        kind = classify(e)
        msg = str(e).strip().splitlines()
        if kind.startswith("isolated-"):
            return {"outcome": kind + (f":{e.signal}" if getattr(e, "signal", None) else ""),
                    "stage": stage, "skipped": skipped,
                    "message": msg[0][:300] if msg else "",
                    "compile_stage": getattr(e, "stage", None),
                    "traceback": getattr(e, "crash_traceback", "")[-3000:],
                    "seconds": time.perf_counter() - t0}
        return {"outcome": f"{kind}:{type(e).__module__}.{type(e).__name__}",
                "stage": stage, "skipped": skipped,
                "message": (msg[-1] if kind == "unclean" and msg else
                            (msg[0] if msg else ""))[:300],
                "traceback": traceback.format_exc()[-3000:] if kind == "unclean" else "",
                "seconds": time.perf_counter() - t0}
    finally:
        for leftover in ([os.path.join(tmpdir, f"case{case['id']}.onnx")]
                         if case["kind"] == "bytes" else []) + [so]:
            try:
                os.unlink(leftover)
            except OSError:
                pass


def _worker(conn, quiet: bool, isolate: bool = False, compile_timeout=None):
    if quiet:  # TVM and onnx write warnings to fd 2
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 2)
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    import compiler  # noqa: F401  (import once, before the first case)

    tmpdir = tempfile.mkdtemp(prefix="onnxc-fuzz-")
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        # the parent learns each stage as it begins: a crash or hang is charged to it
        conn.send(run_case(case, tmpdir, isolate, compile_timeout,
                           on_stage=lambda name: conn.send({"entered": name})))


class Worker:
    def __init__(self, quiet=True, isolate=False, compile_timeout=None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # not a daemon: an isolated compile starts a child process of its own
        self.proc = ctx.Process(target=_worker, args=(child, quiet, isolate, compile_timeout),
                                daemon=not isolate)
        self.proc.start()
        child.close()
        self.case = None
        self.started = None
        self.stage = None

    def submit(self, case):
        self.case, self.started, self.stage = case, time.monotonic(), "compile"
        self.conn.send(case)

    def kill(self):
        self.proc.kill()
        self.proc.join()


def run_all(cases, jobs: int, timeout: float, quiet: bool = True, progress=None,
            isolate: bool = False):
    """Run every case; returns a list of (case without data, result).

    ``isolate``: compile through compiler/isolate.py with a compile timeout of 80 % of
    ``timeout`` (so that the isolation, not this harness, catches a hanging compile).
    """
    results = []
    pending = list(cases)[::-1]

    def new_worker():
        return Worker(quiet, isolate, 0.8 * timeout if isolate else None)

    workers = [new_worker() for _ in range(max(1, jobs))]
    idle = list(workers)
    busy = []
    try:
        while pending or busy:
            while idle and pending:
                w = idle.pop()
                w.submit(pending.pop())
                busy.append(w)
            time.sleep(0.005)
            for w in list(busy):
                res = None
                while res is None and w.conn.poll():
                    try:
                        res = w.conn.recv()
                    except (EOFError, OSError):
                        res = None
                        break
                    if "entered" in res:  # a stage began
                        w.stage, res = res["entered"], None
                if res is None and not w.proc.is_alive():
                    code = w.proc.exitcode
                    res = {"outcome": "crash", "stage": w.stage,
                           "message": f"worker exit code {code}"
                           + (f" (signal {-code})" if code and code < 0 else ""),
                           "seconds": time.monotonic() - w.started}
                elif res is None and time.monotonic() - w.started > timeout:
                    res = {"outcome": "hang", "stage": w.stage,
                           "message": f"no answer after {timeout:.0f} s", "seconds": timeout}
                    w.kill()
                if res is None:
                    continue
                busy.remove(w)
                meta = {k: v for k, v in w.case.items() if k != "data"}
                results.append((meta, res))
                if progress:
                    progress(meta, res, len(results))
                if res["outcome"] in ("crash", "hang"):
                    w.kill()
                    workers.remove(w)
                    w = new_worker()
                    workers.append(w)
                idle.append(w)
    finally:
        for w in workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in workers:
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.kill()
    return results


def stage_counts(results) -> dict:
    """{stage: Counter(passed / clean / unclean / crash / hang / isolated / not-run /
    skipped)}: every stage a case went through passed, the one it ended in counts its
    outcome; a DynamicModel skips export and load."""
    out = {name: Counter() for name in STAGES}
    for _, r in results:
        end = r.get("stage", "compile")
        kind = r["outcome"].split(":")[0]
        kind = {"ok": "passed", "isolated-crash": "isolated", "isolated-hang": "isolated"}.get(
            kind, kind)
        if r["outcome"] == "ok:not-run":
            kind = "not-run"
        for name in STAGES[:STAGES.index(end)]:
            out[name]["skipped" if name in r.get("skipped", ()) else "passed"] += 1
        out[end][kind] += 1
    return out


def summarise(results) -> dict:
    counts = Counter(r["outcome"] for _, r in results)
    groups = defaultdict(list)
    for meta, r in results:
        o = r["outcome"]
        if o in ("crash", "hang") or o.startswith(("unclean", "isolated-")):
            key = (o, re.sub(r"\d+", "N", r.get("message", ""))[:160])
            groups[key].append((meta, r))
    return {"counts": dict(counts), "groups": groups}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=1000, help="number of cases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("--json", default=None, help="write every case's outcome here")
    p.add_argument("--show", type=int, default=3, help="examples printed per unclean group")
    p.add_argument("--verbose", action="store_true", help="one line per case; keep worker stderr")
    p.add_argument("--isolate", action="store_true",
                   help="compile each case in its own compile process (compiler/isolate.py, as "
                        "`onnxc compile` does); count crashes and hangs it contained")
    p.add_argument("--mutations", default=None, metavar="NAME,NAME",
                   help="only these mutations (names without m_: utf8_flip, utf8_field, "
                        "byte_flips, ...)")
    p.add_argument("--conformance-ops", default=None, metavar="OP,OP",
                   help="mutate the ONNX backend test models using these ops instead of the "
                        "zoo and hand-made models")
    args = p.parse_args(argv)

    t0 = time.time()
    bases = conformance_bases(args.conformance_ops.split(",")) if args.conformance_ops else None
    only = None
    if args.mutations:
        known = {f.__name__[2:] for f, _ in MUTATIONS}
        only = set(args.mutations.split(","))
        if only - known:
            p.error(f"unknown mutation(s) {sorted(only - known)}; known: {sorted(known)}")
    cases = list(generate(args.n, args.seed, bases, only))

    def progress(meta, res, k):
        if args.verbose:
            print(f"[{k}/{args.n}] #{meta['id']} {meta['base']} {meta['mutation']}: "
                  f"{meta['what']} -> {res.get('stage')}: {res['outcome']} "
                  f"{res.get('message', '')[:100]}",
                  flush=True)
        elif k % 50 == 0:
            print(f"  {k}/{args.n} cases, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    results = run_all(cases, args.jobs, args.timeout, quiet=not args.verbose, progress=progress,
                      isolate=args.isolate)
    s = summarise(results)
    bad = 0
    print(f"{args.n} cases (seed {args.seed}) in {time.time() - t0:.0f} s:")
    for outcome, c in sorted(s["counts"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {c:5d}  {outcome}")
        if outcome in ("crash", "hang") or outcome.startswith(("unclean", "isolated-")):
            bad += c
    print("by stage (cases that reached it: passed, clean error, unclean error, crash, hang):")
    for name, c in stage_counts(results).items():
        reached = sum(c.values()) - c["skipped"]
        extra = "".join(f", {c[k]} {k}" for k in ("isolated", "not-run", "skipped") if c[k])
        print(f"  {name:8s} {reached:5d}: {c['passed']} passed, {c['clean']} clean, "
              f"{c['unclean']} unclean, {c['crash']} crash, {c['hang']} hang{extra}")
    per_mut = Counter((m["mutation"], r["outcome"].split(":")[0]) for m, r in results)
    print("by mutation: " + ", ".join(f"{k[0]}/{k[1]}={v}" for k, v in sorted(per_mut.items())))
    if s["groups"]:
        print(f"\n{bad} crashes/hangs/unclean errors in {len(s['groups'])} groups:")
        for (outcome, msg), items in sorted(s["groups"].items(), key=lambda kv: -len(kv[1])):
            print(f"\n== {len(items)} x {outcome}: {msg}")
            for meta, r in items[:args.show]:
                print(f"   case #{meta['id']} ({meta['base']}, {meta['mutation']}: {meta['what']})"
                      f" at {r.get('stage', '?')}")
            tb = items[0][1].get("traceback")
            if tb:
                print("   " + "\n   ".join(tb.strip().splitlines()[-8:]))
    contained = sum(c for o, c in s["counts"].items() if o.startswith("isolated-"))
    print(f"\ncrash={s['counts'].get('crash', 0)} hang={s['counts'].get('hang', 0)} "
          f"unclean={sum(c for o, c in s['counts'].items() if o.startswith('unclean'))}"
          + (f" contained-by-isolation={contained}" if args.isolate else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**m, **r} for m, r in results], f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
