"""Fold shape arithmetic in the ONNX graph before import, where shapes are static.

Exported models (PyTorch's TorchScript exporter above all) compute reshape targets,
attention masks and position ids at run time from ``Shape``, ``Gather``, ``Concat``,
``ConstantOfShape``, ``Equal``, ``Where``, ``Expand``...  With static input shapes all of
that is known at compile time.  This step evaluates, in graph order, every node whose
inputs are all known (initializers, ``Constant`` outputs, ``Shape``/``Size`` of tensors
whose shape inference gave static shapes) with ``onnx.reference``, and replaces it by an
initializer.  Converters then see constants where they need them, and no kernel
recomputes constants on every run.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Results above this many elements are left to the Relax constant folder (weights).
MAX_ELEMENTS = 1 << 20
# Fold rounds, each after shape inference on the previous round's result (each stage of
# EnCodec's encoder pads by an amount computed from the previous stage's length: 4 rounds
# left its later Pads dynamic); a round that folds nothing ends the loop
MAX_ROUNDS = 64
# Ops whose result is not a function of their inputs, that hold subgraphs, or that the
# reference gets wrong.
_NEVER = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
          "Bernoulli", "Multinomial", "If", "Loop", "Scan", "SequenceConstruct",
          "SequenceEmpty", "Optional",
          # onnx.reference's answer is wrong (sorted=0); the converter computes it
          "Unique",
          # constants our converters compute (tested against onnxruntime): folding them
          # here would leave onnx.reference to grade its own answer
          "BlackmanWindow", "HammingWindow", "HannWindow", "MelWeightMatrix"}


def static_shapes(model: onnx.ModelProto) -> dict:
    """{tensor name: static shape} of the inputs, value_info and outputs whose dims are known."""
    shapes = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(
                d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [d.dim_value for d in tt.shape.dim]
    return shapes


def _shape_of(node, shape: list) -> np.ndarray:
    rank = len(shape)
    start = next((a.i for a in node.attribute if a.name == "start"), 0)
    end = next((a.i for a in node.attribute if a.name == "end"), rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return np.array(shape[start:end], dtype=np.int64)


def evaluate(node, values: list, opsets) -> list | None:
    """``node``'s outputs computed by onnx's reference from ``values``, or None if it fails."""
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(f"i{k}", helper.np_dtype_to_tensor_dtype(v.dtype),
                                            list(v.shape)) if v is not None else None
              for k, v in enumerate(values)]
    names = [f"i{k}" if v is not None else "" for k, v in enumerate(values)]
    outs = [f"o{k}" for k in range(len(node.output))]
    n = helper.make_node(node.op_type, names, outs, domain=node.domain)
    n.attribute.extend(node.attribute)
    g = helper.make_graph([n], "fold", [i for i in inputs if i is not None],
                          [helper.make_empty_tensor_value_info(o) for o in outs])
    m = helper.make_model(g, opset_imports=opsets)
    feeds = {f"i{k}": v for k, v in enumerate(values) if v is not None}
    try:
        return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]
    except Exception:  # the reference cannot evaluate it: leave the node to the importer
        return None


def opset_ids(domain_opsets: dict) -> list:
    """The importer's ``{domain: opset}`` as the model's ``opset_import`` entries."""
    return [helper.make_opsetid("" if d == "ai.onnx" else d, v) for d, v in domain_opsets.items()]


def fold_node(node, values: list, opsets) -> list | None:
    """The outputs of ``node`` evaluated on ``values`` (numpy arrays, None for an omitted
    input) by onnx's reference, or None when it is not to be folded: another domain (but
    com.microsoft's scalar Q / DQ, ``_fold_qdq``), an op in ``_NEVER``, one the reference
    cannot evaluate, or a result that is missing an output, holds objects or exceeds
    MAX_ELEMENTS."""
    if node.op_type in _QDQ and node.domain in ("", "ai.onnx", "com.microsoft"):
        folded = _fold_qdq(node, values)
        if folded is not None or node.op_type == "DequantizeLinear" or \
                node.domain == "com.microsoft":
            return folded
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER:
        return None
    result = evaluate(node, values, opsets)
    if result is None or len(result) < len(node.output) or any(
            r.dtype == object or r.size > MAX_ELEMENTS for r in result):
        return None
    return result


# Dequantize of a constant: folded only to a scalar (a quantized Pad value or Clip bound:
# onnxruntime's quantizer wraps them in Q -> DQ, and the converters need them constant),
# never a weight, whose 8-bit integers qdq_conv_integer / qdq_matmul_integer must still
# see (onnx.reference folded those from opset 19 on).  Scalars are evaluated here:
# onnx.reference has no QuantizeLinear / DequantizeLinear before opset 19, so such a Pad
# value stayed a DQ and its conversion failed.  Larger quantizes go to the reference.
_QDQ = {"QuantizeLinear", "DequantizeLinear"}
_INTS = {"int8", "uint8", "int16", "uint16", "int32"}


def _fold_qdq(node, values: list) -> list | None:
    x, scale, zero = (list(values) + [None, None])[:3]
    if x is None or scale is None or x.size != 1 or scale.size != 1 or (
            zero is not None and zero.size != 1):
        return None
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "DequantizeLinear":
        if str(x.dtype) not in _INTS or scale.dtype not in (np.float32, np.float64):
            return None
        z = 0 if zero is None else int(zero.reshape(()))
        # x's shape, not a scalar's: a [1] or [1, 1, 1, 1] tensor keeps its rank
        return [np.asarray((int(x.reshape(())) - z) * scale.reshape(()),
                           dtype=scale.dtype).reshape(x.shape)]
    out = np.dtype(zero.dtype) if zero is not None else np.dtype(np.uint8)
    if "output_dtype" in attrs and attrs["output_dtype"].i:
        out = onnx.helper.tensor_dtype_to_np_dtype(attrs["output_dtype"].i)
    if str(out) not in _INTS or not np.issubdtype(x.dtype, np.floating):
        return None
    z = 0 if zero is None else int(zero.reshape(()))
    q = np.rint(x.reshape(()) / scale.reshape(()).astype(x.dtype)) + z  # in x's float type
    info = np.iinfo(out)
    return [np.asarray(np.clip(q, info.min, info.max), dtype=out).reshape(x.shape)]


def _inputs_with_subgraphs(node) -> set:
    """The tensor names ``node`` reads, those its If/Loop/Scan bodies read from the outer
    scope included (a folded constant they use must stay an initializer)."""
    names = set(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            names |= {o.name for o in g.output}  # a branch may return an outer tensor as is
            for n in g.node:
                names |= _inputs_with_subgraphs(n)
    return names


def fold_constants(model: onnx.ModelProto, in_place: bool = False
                   ) -> tuple[onnx.ModelProto, int]:
    """Return (model with foldable nodes replaced by initializers, nodes folded).

    Folding can make a tensor's shape static that shape inference could not give before
    (``Pad`` whose pads were computed from a bound input): while a ``Shape``/``Size`` is
    left whose input has no static shape, shapes are inferred again on the folded model
    and it is folded again (at most ``MAX_ROUNDS`` rounds).

    ``in_place``: ``model`` is the caller's to give up (the driver's, from the loader):
    it is folded as it is instead of copied first (each copy of GPT-2's 500 MB of weights
    cost about 1.2 CPU s); else ``model`` is left as it was."""
    total, owned = 0, in_place
    for _ in range(MAX_ROUNDS):
        model, folded = _fold_round(model, owned)
        owned = owned or folded > 0  # folding copied it
        total += folded
        if not folded or not _unknown_shape_reads(model):
            break
        reinferred = _reinfer_shapes(model, owned)
        if reinferred is None:
            break
        model = reinferred
    return model, total


def _unknown_shape_reads(model: onnx.ModelProto) -> set:
    """Inputs of ``Shape``/``Size`` nodes whose shapes are not static."""
    shapes = static_shapes(model)
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    return {n.input[0] for n in model.graph.node if n.op_type in ("Shape", "Size")
            and n.domain in ("", "ai.onnx") and n.input[0] not in shapes}


def _reinfer_shapes(model: onnx.ModelProto, owned: bool = False) -> onnx.ModelProto | None:
    """The model with shapes inferred afresh (stale intermediate shapes dropped), if that
    gives any ``Shape``/``Size`` input a static shape it lacked; else None (``model`` as
    it was).  ``owned``: the result may be ``model`` itself, its inferred fields replaced."""
    from onnx import shape_inference

    from .loader import with_initializers, without_large_initializers

    before = _unknown_shape_reads(model)
    light, large = without_large_initializers(model)  # as the loader infers: no weights
    m = onnx.ModelProto()
    m.CopyFrom(light)
    del m.graph.value_info[:]
    try:
        inferred = shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # the loader's strict inference passed; a failure here is not fatal
        return None
    # the stand-in inputs have the large initializers' shapes: the same reads are unknown
    if not _unknown_shape_reads(inferred) < before:
        return None
    return with_initializers(inferred, model, large, reuse_model=owned)


class _Constants(dict):
    """{tensor name: numpy value} of what is known; an initializer is converted when a fold
    first reads it (converting every one up front copied GPT-2's 500 MB of weights)."""

    def __init__(self, initializers):
        super().__init__()
        self._protos = {t.name: t for t in initializers}

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or name in self._protos

    def __missing__(self, name):
        value = self[name] = numpy_helper.to_array(self._protos[name])
        return value

    def get(self, name, default=None):
        return self[name] if name in self else default


def _fold_round(model: onnx.ModelProto, in_place: bool = False
                ) -> tuple[onnx.ModelProto, int]:
    """One pass over the graph in order: fold every node whose inputs are known; the
    folded model is a copy, or ``model`` itself if ``in_place``."""
    graph = model.graph
    known = _Constants(graph.initializer)
    shapes = static_shapes(model)
    opsets = list(model.opset_import)
    kept, folded, gone = [], 0, []
    for k, node in enumerate(graph.node):
        result = None
        default = node.domain in ("", "ai.onnx")
        if default and node.op_type == "Shape" and node.input[0] in shapes:
            result = [_shape_of(node, shapes[node.input[0]])]
        elif default and node.op_type == "Size" and node.input[0] in shapes:
            result = [np.array(int(np.prod(shapes[node.input[0]])), dtype=np.int64)]
        elif all(not i or i in known for i in node.input):
            result = fold_node(node, [known.get(i) if i else None for i in node.input], opsets)
        if result is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, result):
            if name:
                known[name] = value
        folded += 1
        gone.append(k)
    if not folded:
        return model, 0
    used = {i for n in kept for i in _inputs_with_subgraphs(n)} | {o.name for o in graph.output}
    inits = {t.name for t in graph.initializer}
    if in_place:
        out = model
        for k in reversed(gone):
            del out.graph.node[k]
    else:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        del out.graph.node[:]
        out.graph.node.extend(kept)
    for name in sorted(used - inits):
        if name in known:
            out.graph.initializer.append(numpy_helper.from_array(known[name], name))
    return out, folded
