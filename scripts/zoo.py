#!/usr/bin/env python3
"""Model zoo for onnxc: reference ONNX models built directly with ``onnx.helper``.

The tests and benchmarks of onnxc need a set of realistic ONNX models without
depending on torch or on downloading files.  This module builds them from
scratch, deterministically:

* opset 17 (default domain), ``ir_version`` 8, static shapes, float32 inputs;
* weights drawn from ``numpy.random.default_rng(seed)`` (same seed, same model);
* every node has a unique, readable name (``"layer1.0.conv1"``), every
  initializer is named after its node (``"layer1.0.conv1.weight"``);
* weights are scaled so activations stay O(1) through deep nets (He-scaled
  convolutions, BatchNormalization with realistic scale/bias/mean/var, small
  scale on the last BN of each residual branch), so outputs of random inputs
  are finite and of sane magnitude;
* every model passes ``onnx.checker.check_model(model, full_check=True)``.

Use as a module::

    sys.path.insert(0, "<repo>/scripts")
    import zoo
    model = zoo.build("resnet50", blocks=(1, 1, 1, 1), image=64)
    feeds = zoo.random_inputs(model)

or from the command line::

    python scripts/zoo.py --list
    python scripts/zoo.py cnn -o examples/cnn.onnx
    python scripts/zoo.py bert -p layers=2 -p seq=64 -o /tmp/bert2.onnx
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import math
import sys
import time
from typing import Callable, Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "onnxc.zoo"


# --------------------------------------------------------------------------- #
# Graph builder
# --------------------------------------------------------------------------- #


class GraphBuilder:
    """Appends nodes and initializers to a graph under construction.

    Names are hierarchical: ``with b.scope("layer1.0"): b.conv(..., name="conv1")``
    creates the node ``layer1.0.conv1`` whose output tensor has the same name
    and whose weight is the initializer ``layer1.0.conv1.weight``.  Node names
    must be unique; reusing one raises ``ValueError`` (it is a bug in a model
    definition).  Shared constants (Clip bounds, Reshape shapes, GELU scalars)
    live outside any scope and are created once.
    """

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, TensorProto] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        self._node_names: set[str] = set()
        self._scope: list[str] = []

    # -- naming ------------------------------------------------------------ #

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        self._scope.append(str(name))
        try:
            yield
        finally:
            self._scope.pop()

    def qualify(self, name: str) -> str:
        return ".".join([*self._scope, name])

    # -- graph I/O, tensors and raw nodes ---------------------------------- #

    def input(self, name: str, shape: Sequence[int]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, tensor: str, name: str | None = None) -> str:
        """Mark ``tensor`` as a graph output, renaming it to ``name`` if given."""
        if name and name != tensor:
            for node in self.nodes:
                node.input[:] = [name if t == tensor else t for t in node.input]
                node.output[:] = [name if t == tensor else t for t in node.output]
            tensor = name
        self.outputs.append(tensor)
        return tensor

    def node(self, op: str, inputs: Sequence[str], name: str, **attrs) -> str:
        """Append one node named ``<scope>.<name>``; its single output tensor has the same name."""
        full = self.qualify(name)
        if full in self._node_names:
            raise ValueError(f"duplicate node name {full!r}")
        self._node_names.add(full)
        self.nodes.append(helper.make_node(op, list(inputs), [full], name=full, **attrs))
        return full

    def param(self, name: str, array: np.ndarray) -> str:
        """A scoped float32 initializer (weights)."""
        full = self.qualify(name)
        if full in self.initializers:
            raise ValueError(f"duplicate initializer {full!r}")
        self.initializers[full] = numpy_helper.from_array(np.asarray(array, dtype=np.float32), full)
        return full

    def const(self, name: str, value, dtype=np.float32) -> str:
        """A shared, unscoped constant initializer, created on first use."""
        array = np.asarray(value, dtype=dtype)
        existing = self.initializers.get(name)
        if existing is not None:
            if not np.array_equal(numpy_helper.to_array(existing), array):
                raise ValueError(f"constant {name!r} redefined with a different value")
            return name
        self.initializers[name] = numpy_helper.from_array(array, name)
        return name

    # -- random weights ---------------------------------------------------- #

    def normal(self, shape: Sequence[int], std: float) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def uniform(self, shape: Sequence[int], low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, shape).astype(np.float32)

    # -- layers ------------------------------------------------------------ #

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None,
             group: int = 1, bias: bool = False, center: bool = True, name: str = "conv") -> str:
        """Conv with He-style normal weights, std sqrt(gain / fan_in).

        With ``center`` (the default) each filter is made zero-mean, so the
        positive mean of ReLU'd inputs does not turn into per-channel offsets
        that grow with depth (BN here has fixed statistics and cannot remove
        them).  The filter then only sees the variance of a ReLU'd zero-mean
        Gaussian, (1/2 - 1/(2 pi)) sigma^2, so the gain is its inverse (~2.93)
        instead of He's 2.
        """
        pad = k // 2 if pad is None else pad
        fan_in = cin // group * k * k
        gain = 1.0 / (0.5 - 0.5 / math.pi) if center else 2.0
        w = self.normal((cout, cin // group, k, k), math.sqrt(gain / fan_in))
        if center:
            w -= w.mean(axis=(1, 2, 3), keepdims=True)
        inputs = [x, self.param(f"{name}.weight", w)]
        if bias:
            inputs.append(self.param(f"{name}.bias", self.normal((cout,), 0.05)))
        return self.node("Conv", inputs, name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, dilations=[1, 1], group=group)

    def bn(self, x: str, channels: int, name: str = "bn", gamma: float = 1.0) -> str:
        """Inference BatchNormalization with trained-looking statistics.

        ``gamma`` scales the learned scale; residual branches use a small value
        for their last BN (as trained ResNets do) so sums do not blow up.
        """
        c = (channels,)
        inputs = [
            x,
            self.param(f"{name}.scale", gamma * self.uniform(c, 0.7, 1.3)),
            self.param(f"{name}.bias", self.normal(c, 0.1)),
            self.param(f"{name}.mean", self.normal(c, 0.1)),
            self.param(f"{name}.var", self.uniform(c, 0.6, 1.6)),
        ]
        return self.node("BatchNormalization", inputs, name, epsilon=1e-5, momentum=0.9)

    def relu(self, x: str, name: str = "relu") -> str:
        return self.node("Relu", [x], name)

    def relu6(self, x: str, name: str = "relu6") -> str:
        """ReLU6 as Clip(x, 0, 6) with the bounds given as (shared) initializers."""
        lo, hi = self.const("relu6.min", 0.0), self.const("relu6.max", 6.0)
        return self.node("Clip", [x, lo, hi], name)

    def act(self, x: str, kind: str | None, name: str | None = None) -> str:
        if kind is None:
            return x
        if kind == "relu":
            return self.relu(x, name or "relu")
        if kind == "relu6":
            return self.relu6(x, name or "relu6")
        raise ValueError(f"unknown activation {kind!r}")

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                act: str | None = "relu", name: str = "conv", gamma: float = 1.0) -> str:
        """``{name}.conv`` -> ``{name}.bn`` -> ``{name}.{act}``."""
        with self.scope(name):
            y = self.conv(x, cin, cout, k, stride, group=group, name="conv")
            y = self.bn(y, cout, name="bn", gamma=gamma)
            return self.act(y, act)

    def maxpool(self, x: str, k: int, stride: int, pad: int = 0, ceil: bool = False, name: str = "maxpool") -> str:
        return self.node("MaxPool", [x], name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, ceil_mode=int(ceil))

    def avgpool(self, x: str, k: int, stride: int, pad: int = 0, name: str = "avgpool") -> str:
        return self.node("AveragePool", [x], name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, count_include_pad=0)

    def global_avgpool(self, x: str, name: str = "avgpool") -> str:
        return self.node("GlobalAveragePool", [x], name)

    def flatten(self, x: str, name: str = "flatten") -> str:
        return self.node("Flatten", [x], name, axis=1)

    def add(self, a: str, b: str, name: str = "add") -> str:
        return self.node("Add", [a, b], name)

    def concat(self, xs: Sequence[str], axis: int = 1, name: str = "concat") -> str:
        return self.node("Concat", list(xs), name, axis=axis)

    def gemm(self, x: str, cin: int, cout: int, name: str = "fc", gain: float = 2.0) -> str:
        """Fully connected layer as Gemm with a [cout, cin] weight (transB=1, PyTorch layout).

        The default He gain suits the usual input (ReLU'd, pooled features)."""
        w = self.param(f"{name}.weight", self.normal((cout, cin), math.sqrt(gain / cin)))
        b = self.param(f"{name}.bias", self.normal((cout,), 0.02))
        return self.node("Gemm", [x, w, b], name, alpha=1.0, beta=1.0, transB=1)

    def linear(self, x: str, cin: int, cout: int, name: str, gain: float = 1.0) -> str:
        """Fully connected layer as ``{name}.matmul`` (weight [cin, cout]) + ``{name}.add`` (bias)."""
        with self.scope(name):
            w = self.param("weight", self.normal((cin, cout), math.sqrt(gain / cin)))
            b = self.param("bias", self.normal((cout,), 0.02))
            return self.add(self.node("MatMul", [x, w], "matmul"), b, name="add")

    def layer_norm(self, x: str, dim: int, name: str = "ln", eps: float = 1e-5) -> str:
        scale = self.param(f"{name}.scale", self.uniform((dim,), 0.8, 1.2))
        bias = self.param(f"{name}.bias", self.normal((dim,), 0.05))
        return self.node("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=eps)

    def gelu(self, x: str, name: str = "gelu") -> str:
        """Exact GELU as exported by PyTorch: x * 0.5 * (1 + erf(x / sqrt(2)))."""
        with self.scope(name):
            y = self.node("Div", [x, self.const("gelu.sqrt2", math.sqrt(2.0))], "div")
            y = self.node("Erf", [y], "erf")
            y = self.node("Add", [y, self.const("gelu.one", 1.0)], "add")
            y = self.node("Mul", [x, y], "mul")
            return self.node("Mul", [y, self.const("gelu.half", 0.5)], "half")

    # -- finish ------------------------------------------------------------ #

    def build(self, doc: str = "") -> onnx.ModelProto:
        outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in self.outputs]
        graph = helper.make_graph(self.nodes, self.name, self.inputs, outputs,
                                  initializer=list(self.initializers.values()))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=IR_VERSION, producer_name=PRODUCER, doc_string=doc)
        # Declare static output shapes, found by shape inference on a copy of the
        # graph whose float weights are shape-only inputs (cheap for big models).
        # The model itself keeps no value_info.
        weights = [t for t in graph.initializer if t.data_type == TensorProto.FLOAT]
        skeleton = helper.make_graph(
            self.nodes, self.name,
            self.inputs + [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in weights],
            outputs, initializer=[t for t in graph.initializer if t.data_type != TensorProto.FLOAT])
        inferred = onnx.shape_inference.infer_shapes(
            helper.make_model(skeleton, opset_imports=model.opset_import, ir_version=IR_VERSION), strict_mode=True)
        shapes = {vi.name: vi.type for vi in inferred.graph.output}
        for vi in model.graph.output:
            vi.type.CopyFrom(shapes[vi.name])
        return model


# --------------------------------------------------------------------------- #
# Models
# --------------------------------------------------------------------------- #


def mlp(batch: int = 4, seed: int = 0) -> onnx.ModelProto:
    """784-256-128-10 MLP: Gemm+Relu, MatMul+Add+Relu, Gemm, Softmax."""
    b = GraphBuilder("mlp", seed)
    x = b.input("input", [batch, 784])
    x = b.relu(b.gemm(x, 784, 256, name="fc1"), name="relu1")
    x = b.relu(b.linear(x, 256, 128, name="fc2", gain=2.0), name="relu2")
    x = b.gemm(x, 128, 10, name="fc3")
    b.output(b.node("Softmax", [x], "softmax", axis=-1), "probs")
    return b.build(mlp.__doc__)


def cnn(image: int = 32, num_classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """Small CNN covering Conv/BN/Relu/MaxPool/AveragePool/residual Add/Concat/GAP/Flatten/Gemm."""
    b = GraphBuilder("cnn", seed)
    x = b.input("input", [1, 3, image, image])
    x = b.conv_bn(x, 3, 16, 3, name="stem")
    x = b.maxpool(x, 2, 2, name="pool")
    with b.scope("res"):  # basic residual block
        y = b.relu(b.bn(b.conv(x, 16, 16, 3, name="conv1"), 16, name="bn1"), name="relu1")
        y = b.bn(b.conv(y, 16, 16, 3, name="conv2"), 16, name="bn2", gamma=0.5)
        x = b.relu(b.add(x, y), name="relu2")
    a = b.conv_bn(x, 16, 16, 1, name="branch_a")
    c = b.conv_bn(b.avgpool(x, 3, 1, pad=1, name="branch_b.pool"), 16, 16, 3, name="branch_b")
    x = b.concat([a, c], name="concat")
    x = b.conv_bn(x, 32, 64, 3, stride=2, name="down")
    x = b.flatten(b.global_avgpool(x))
    b.output(b.gemm(x, 64, num_classes, name="fc"), "logits")
    return b.build(cnn.__doc__)


def _inverted_residual(b: GraphBuilder, x: str, cin: int, cout: int, stride: int, expand: int, name: str) -> str:
    """MobileNetV2 block: 1x1 expand + BN + ReLU6, 3x3 depthwise + BN + ReLU6, 1x1 project + BN, (+x)."""
    hidden = cin * expand
    residual = stride == 1 and cin == cout
    with b.scope(name):
        y = x
        if expand != 1:
            y = b.conv_bn(y, cin, hidden, 1, act="relu6", name="expand")
        y = b.conv_bn(y, hidden, hidden, 3, stride=stride, group=hidden, act="relu6", name="dw")
        y = b.conv_bn(y, hidden, cout, 1, act=None, name="project", gamma=0.5 if residual else 1.0)
        return b.add(x, y) if residual else y


def dwsep(channels: int = 32, image: int = 56, expand: int = 6, seed: int = 0) -> onnx.ModelProto:
    """One MobileNetV2-style depthwise-separable inverted-residual block."""
    b = GraphBuilder("dwsep", seed)
    x = b.input("input", [1, channels, image, image])
    y = _inverted_residual(b, x, channels, channels, 1, expand, name="block")
    b.output(y, "output")
    return b.build(dwsep.__doc__)


def _encoder_block(b: GraphBuilder, x: str, batch, seq, hidden: int, heads: int, ffn: int,
                   name: str, mask: str | None = None) -> str:
    """Post-LN encoder block: multi-head self-attention and a GELU FFN, each with residual + LayerNorm.

    ``batch`` / ``seq`` given as names (symbolic) reshape with ONNX's 0 (copy this dim);
    ``mask`` is an additive [B, 1, 1, S] attention bias."""
    d = hidden // heads
    b_, s_ = (0 if isinstance(v, str) else v for v in (batch, seq))
    split = b.const("attn.split_shape", [b_, s_, heads, d], np.int64)  # [B, S, H, D]
    merge = b.const("attn.merge_shape", [b_, s_, hidden], np.int64)
    scale = b.const("attn.scale", 1.0 / math.sqrt(d))

    def project_heads(proj: str, perm: list[int]) -> str:
        y = b.linear(x, hidden, hidden, name=proj)
        with b.scope(proj):
            return b.node("Transpose", [b.node("Reshape", [y, split], "reshape")], "transpose", perm=perm)

    with b.scope(name):
        with b.scope("attn"):
            q = project_heads("q", [0, 2, 1, 3])  # [B, H, S, D]
            k = project_heads("k", [0, 2, 3, 1])  # [B, H, D, S], i.e. K^T
            v = project_heads("v", [0, 2, 1, 3])  # [B, H, S, D]
            s = b.node("Mul", [b.node("MatMul", [q, k], "scores"), scale], "scale")
            if mask is not None:
                s = b.node("Add", [s, mask], "mask")
            y = b.node("MatMul", [b.node("Softmax", [s], "softmax", axis=-1), v], "context")
            y = b.node("Transpose", [y], "transpose", perm=[0, 2, 1, 3])  # [B, S, H, D]
            y = b.linear(b.node("Reshape", [y, merge], "reshape"), hidden, hidden, name="out")
        x = b.layer_norm(b.add(x, y, name="attn.residual"), hidden, name="ln1")
        with b.scope("ffn"):
            y = b.gelu(b.linear(x, hidden, ffn, name="fc1"))
            y = b.linear(y, ffn, hidden, name="fc2")
        return b.layer_norm(b.add(x, y, name="ffn.residual"), hidden, name="ln2")


def transformer(seq: int = 16, hidden: int = 64, heads: int = 4, ffn: int = 256, layers: int = 1,
                batch: int = 1, seed: int = 0, name: str = "transformer",
                mask: bool = False) -> onnx.ModelProto:
    """Post-LN transformer encoder (BERT layout) from MatMul/Softmax/LayerNormalization/Erf-GELU.

    ``batch`` / ``seq`` may be names: symbolic input dims (``dim_param``).  ``mask`` adds an
    int64 ``attention_mask`` [batch, seq] input turned into BERT's additive bias
    ``(1 - mask[:, None, None, :]) * -10000``."""
    if hidden % heads:
        raise ValueError("hidden must be divisible by heads")
    b = GraphBuilder(name, seed)
    x = b.input("x", [batch, seq, hidden])
    bias = None
    if mask:
        b.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                      [batch, seq]))
        with b.scope("mask"):
            m = b.node("Cast", ["attention_mask"], "cast", to=TensorProto.FLOAT)
            m = b.node("Unsqueeze", [m, b.const("mask.axes", [1, 2], np.int64)], "unsqueeze")
            m = b.node("Sub", [b.const("mask.one", 1.0), m], "invert")
            bias = b.node("Mul", [m, b.const("mask.neg", -10000.0)], "bias")
    for i in range(layers):
        x = _encoder_block(b, x, batch, seq, hidden, heads, ffn, name=f"blocks.{i}", mask=bias)
    b.output(x, "y")
    return b.build(transformer.__doc__)


def bert(seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, layers: int = 12,
         batch: int = 1, seed: int = 0, mask: bool = False) -> onnx.ModelProto:
    """BERT-base-shaped encoder stack (12 x [768 hidden, 12 heads, 3072 FFN]), no embeddings."""
    return transformer(seq=seq, hidden=hidden, heads=heads, ffn=ffn, layers=layers, batch=batch,
                       seed=seed, name="bert", mask=mask)


def resnet50(blocks: Sequence[int] = (3, 4, 6, 3), image: int = 224, num_classes: int = 1000,
             seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 (v1.5: stride on the 3x3 conv), BN kept as separate BatchNormalization nodes."""
    b = GraphBuilder("resnet50", seed)
    x = b.input("input", [1, 3, image, image])
    x = b.relu(b.bn(b.conv(x, 3, 64, 7, stride=2, name="conv1"), 64, name="bn1"))
    x = b.maxpool(x, 3, 2, pad=1)
    cin = 64
    for stage, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        cout = width * 4
        for i in range(n):
            stride = 2 if (i == 0 and stage > 1) else 1
            with b.scope(f"layer{stage}.{i}"):
                y = b.relu(b.bn(b.conv(x, cin, width, 1, name="conv1"), width, name="bn1"), name="relu1")
                y = b.relu(b.bn(b.conv(y, width, width, 3, stride, name="conv2"), width, name="bn2"), name="relu2")
                y = b.bn(b.conv(y, width, cout, 1, name="conv3"), cout, name="bn3", gamma=0.3)
                if i == 0:
                    x = b.conv(x, cin, cout, 1, stride, name="downsample.0")
                    x = b.bn(x, cout, name="downsample.1")
                x = b.relu(b.add(x, y), name="relu3")
            cin = cout
    x = b.flatten(b.global_avgpool(x))
    b.output(b.gemm(x, cin, num_classes), "logits")
    return b.build(resnet50.__doc__)


# (expansion t, channels c, repeats n, first stride s) from the MobileNetV2 paper.
MOBILENETV2_TABLE = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                     (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenetv2(image: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0): inverted residuals with Clip-based ReLU6 and depthwise 3x3 convs."""
    b = GraphBuilder("mobilenetv2", seed)
    x = b.input("input", [1, 3, image, image])
    x = b.conv_bn(x, 3, 32, 3, stride=2, act="relu6", name="features.0")
    cin, idx = 32, 1
    for t, c, n, s in MOBILENETV2_TABLE:
        for i in range(n):
            x = _inverted_residual(b, x, cin, c, s if i == 0 else 1, t, name=f"features.{idx}")
            cin, idx = c, idx + 1
    x = b.conv_bn(x, cin, 1280, 1, act="relu6", name=f"features.{idx}")
    x = b.flatten(b.global_avgpool(x))
    b.output(b.gemm(x, 1280, num_classes, name="classifier"), "logits")
    return b.build(mobilenetv2.__doc__)


def squeezenet(image: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1: fire modules (squeeze 1x1 -> Concat(expand 1x1, expand 3x3)), no BN, biased convs."""
    b = GraphBuilder("squeezenet", seed)
    x = b.input("input", [1, 3, image, image])

    def fire(x: str, cin: int, squeeze: int, expand: int, name: str) -> str:
        with b.scope(name):
            s = b.relu(b.conv(x, cin, squeeze, 1, bias=True, name="squeeze"), name="squeeze_relu")
            e1 = b.relu(b.conv(s, squeeze, expand, 1, bias=True, name="expand1x1"), name="expand1x1_relu")
            e3 = b.relu(b.conv(s, squeeze, expand, 3, bias=True, name="expand3x3"), name="expand3x3_relu")
            return b.concat([e1, e3])

    x = b.relu(b.conv(x, 3, 64, 3, stride=2, pad=0, bias=True, name="features.0"), name="features.1")
    x = b.maxpool(x, 3, 2, ceil=True, name="features.2")
    x = fire(x, 64, 16, 64, "features.3")
    x = fire(x, 128, 16, 64, "features.4")
    x = b.maxpool(x, 3, 2, ceil=True, name="features.5")
    x = fire(x, 128, 32, 128, "features.6")
    x = fire(x, 256, 32, 128, "features.7")
    x = b.maxpool(x, 3, 2, ceil=True, name="features.8")
    x = fire(x, 256, 48, 192, "features.9")
    x = fire(x, 384, 48, 192, "features.10")
    x = fire(x, 384, 64, 256, "features.11")
    x = fire(x, 512, 64, 256, "features.12")
    # Uncentred, so the class scores differ after the final ReLU + global pooling.
    x = b.conv(x, 512, num_classes, 1, bias=True, center=False, name="classifier.conv")
    x = b.relu(x, name="classifier.relu")
    x = b.global_avgpool(x, name="classifier.avgpool")
    b.output(b.flatten(x), "logits")
    return b.build(squeezenet.__doc__)


# Inception blocks: (1x1, (3x3 reduce, 3x3), (reduce, out, "5x5" | "3x3x2"), (pool kind, pool proj)).
INCEPTION_BLOCKS = (
    ("3a", 64, (96, 128), (16, 32, "5x5"), ("max", 32)),
    ("3b", 128, (128, 192), (32, 96, "3x3x2"), ("max", 64)),
    ("4a", 192, (96, 208), (16, 48, "3x3x2"), ("avg", 64)),
)


def inception(image: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """Small GoogLeNet-shaped net: stem, then 3 four-branch inception blocks joined by Concat."""
    b = GraphBuilder("inception", seed)
    x = b.input("input", [1, 3, image, image])
    x = b.conv_bn(x, 3, 64, 7, stride=2, name="stem.conv1")
    x = b.maxpool(x, 3, 2, pad=1, name="stem.pool1")
    x = b.conv_bn(x, 64, 64, 1, name="stem.conv2")
    x = b.conv_bn(x, 64, 192, 3, name="stem.conv3")
    x = b.maxpool(x, 3, 2, pad=1, name="stem.pool2")
    cin = 192
    for name, c1, (r3, c3), (r5, c5, kind5), (pool, cp) in INCEPTION_BLOCKS:
        if name == "4a":  # GoogLeNet downsamples between inception stages 3 and 4
            x = b.maxpool(x, 3, 2, pad=1, name="pool3")
        with b.scope(f"inception{name}"):
            b1 = b.conv_bn(x, cin, c1, 1, name="branch1")
            b2 = b.conv_bn(b.conv_bn(x, cin, r3, 1, name="branch2.0"), r3, c3, 3, name="branch2.1")
            b3 = b.conv_bn(x, cin, r5, 1, name="branch3.0")
            if kind5 == "5x5":
                b3 = b.conv_bn(b3, r5, c5, 5, name="branch3.1")
            else:
                b3 = b.conv_bn(b.conv_bn(b3, r5, c5, 3, name="branch3.1"), c5, c5, 3, name="branch3.2")
            if pool == "max":
                b4 = b.maxpool(x, 3, 1, pad=1, name="branch4.pool")
            else:
                b4 = b.avgpool(x, 3, 1, pad=1, name="branch4.pool")
            b4 = b.conv_bn(b4, cin, cp, 1, name="branch4.1")
            x = b.concat([b1, b2, b3, b4])
        cin = c1 + c3 + c5 + cp
    x = b.flatten(b.global_avgpool(x))
    b.output(b.gemm(x, cin, num_classes), "logits")
    return b.build(inception.__doc__)


def densenet(blocks: Sequence[int] = (6, 12, 24, 16), growth: int = 32, image: int = 224,
             num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """DenseNet (default DenseNet-121): BN-Relu-Conv1x1-BN-Relu-Conv3x3 layers over the Concat of all
    previous features, transitions BN-Relu-Conv1x1-AveragePool."""
    b = GraphBuilder("densenet", seed)
    x = b.input("input", [1, 3, image, image])
    x = b.conv(x, 3, 64, 7, stride=2, name="features.conv0")
    x = b.relu(b.bn(x, 64, name="features.norm0"), name="features.relu0")
    x = b.maxpool(x, 3, 2, pad=1, name="features.pool0")
    cin = 64
    for bi, n in enumerate(blocks, start=1):
        features = [x]
        for li in range(1, n + 1):
            c = cin + (li - 1) * growth
            with b.scope(f"features.denseblock{bi}.denselayer{li}"):
                y = features[0] if len(features) == 1 else b.concat(features)
                y = b.relu(b.bn(y, c, name="norm1"), name="relu1")
                y = b.conv(y, c, 4 * growth, 1, name="conv1")
                y = b.relu(b.bn(y, 4 * growth, name="norm2"), name="relu2")
                features.append(b.conv(y, 4 * growth, growth, 3, name="conv2"))
        cin += n * growth
        x = b.concat(features, name=f"features.denseblock{bi}.concat")
        if bi < len(blocks):
            with b.scope(f"features.transition{bi}"):
                x = b.relu(b.bn(x, cin, name="norm"))
                x = b.conv(x, cin, cin // 2, 1, name="conv")
                x = b.avgpool(x, 2, 2, name="pool")
            cin //= 2
    x = b.relu(b.bn(x, cin, name="features.norm5"), name="features.relu5")
    x = b.flatten(b.global_avgpool(x))
    b.output(b.gemm(x, cin, num_classes, name="classifier"), "logits")
    return b.build(densenet.__doc__)


ZOO: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": mlp,
    "cnn": cnn,
    "dwsep": dwsep,
    "transformer": transformer,
    "bert": bert,
    "resnet50": resnet50,
    "mobilenetv2": mobilenetv2,
    "squeezenet": squeezenet,
    "inception": inception,
    "densenet": densenet,
}


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def build(name: str, **kw) -> onnx.ModelProto:
    """Build zoo model ``name``; keyword arguments go to its builder (sizes, ``seed``)."""
    try:
        fn = ZOO[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(ZOO)}") from None
    return fn(**kw)


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal arrays for every graph input that is not an initializer."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def param_bytes(model: onnx.ModelProto) -> int:
    """Total size of the initializers in bytes."""
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def io_shapes(model: onnx.ModelProto) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """({input: shape}, {output: shape}) for the non-initializer inputs and the outputs."""
    inits = {t.name for t in model.graph.initializer}

    def shape(vi):
        return [d.dim_value for d in vi.type.tensor_type.shape.dim]

    return ({vi.name: shape(vi) for vi in model.graph.input if vi.name not in inits},
            {vi.name: shape(vi) for vi in model.graph.output})


def _summary(name: str, model: onnx.ModelProto) -> str:
    ins, outs = io_shapes(model)
    return (f"{name}: {len(model.graph.node)} nodes, {param_bytes(model) / 1e6:.2f} MB params, "
            f"inputs {ins}, outputs {outs}")


def _parse_param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build an onnxc zoo model and save it as .onnx.")
    ap.add_argument("name", nargs="?", help="model name (see --list)")
    ap.add_argument("-o", "--output", help="output .onnx path (default: NAME.onnx)")
    ap.add_argument("-p", "--param", action="append", default=[], type=_parse_param, metavar="KEY=VALUE",
                    help="builder keyword argument, e.g. -p layers=2 -p 'blocks=(1,1,1,1)'")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    args = ap.parse_args(argv)

    if args.list:
        for name, fn in ZOO.items():
            summary = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
            print(f"{name:12s} {summary}")
        return 0
    if not args.name:
        ap.error("a model name is required (or --list)")
    if args.name not in ZOO:
        ap.error(f"unknown model {args.name!r}; known: {', '.join(ZOO)}")

    t0 = time.perf_counter()
    model = build(args.name, **dict(args.param))
    out = args.output or f"{args.name}.onnx"
    onnx.save(model, out)
    print(f"{_summary(args.name, model)}; built in {time.perf_counter() - t0:.1f}s -> {out}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- #
# bert_torch_style: what PyTorch's TorchScript exporter writes for a BERT
# --------------------------------------------------------------------------- #


def bert_torch_style(batch: int = 2, seq: int = 16, hidden: int = 64, heads: int = 4,
                     ffn: int = 128, layers: int = 2, vocab: int = 1000, max_positions: int = 128,
                     mask_value: str = "min", dynamic: bool = False,
                     seed: int = 0) -> onnx.ModelProto:
    """BERT encoder as torch.onnx.export (opset 17, dynamo=False) writes it: int64 input_ids and
    attention_mask, shape arithmetic (Shape/Gather/Unsqueeze/Concat/Range/Slice/ConstantOfShape/
    Equal/Where/Expand), extended mask (Unsqueeze/Cast/Sub/Mul), Erf GELU, LayerNormalization.

    ``dynamic`` gives the inputs symbolic ``batch`` and ``sequence`` axes (as the exporter's
    ``dynamic_axes`` do); ``mask_value`` is ``"min"`` (float32 min, transformers >= 4.30) or
    ``"-10000"`` (older transformers).
    """
    if hidden % heads:
        raise ValueError("hidden must be divisible by heads")
    if mask_value not in ("min", "-10000"):
        raise ValueError(f"mask_value must be 'min' or '-10000', got {mask_value!r}")
    d = hidden // heads
    b = GraphBuilder("bert_torch_style", seed)
    dims = ["batch", "sequence"] if dynamic else [batch, seq]
    for name in ("input_ids", "attention_mask"):
        b.inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, dims))
    i64 = np.int64

    def scalar_dim(x: str, axis: int, name: str) -> str:
        """Shape -> Gather(axis): a 0-d int64, as the exporter writes ``x.size(axis)``."""
        shape = b.node("Shape", [x], f"{name}.shape")
        return b.node("Gather", [shape, b.const(f"dim.{axis}", axis, i64)], f"{name}.gather", axis=0)

    def unsqueeze0(x: str, name: str) -> str:
        return b.node("Unsqueeze", [x, b.const("axes.0", [0], i64)], name)

    def expand_minus_one(x: str, shape: str, name: str) -> str:
        """``x.expand(*sizes)`` with -1 entries: Where(Equal(shape, -1), 1, shape), Expand."""
        with b.scope(name):
            n = b.node("Shape", [shape], "shape")
            ones = b.node("ConstantOfShape", [n], "ones",
                          value=numpy_helper.from_array(np.array([1], i64)))
            minus = b.node("Mul", [ones, b.const("minus_one", -1, i64)], "minus_one")
            eq = b.node("Equal", [shape, minus], "equal")
            fixed = b.node("Where", [eq, ones, shape], "where")
            return b.node("Expand", [x, fixed], "expand")

    # sizes, from the inputs' shapes
    batch_n = scalar_dim("input_ids", 0, "batch")
    seq_n = scalar_dim("input_ids", 1, "seq")
    seq_1d = unsqueeze0(seq_n, "seq.unsqueeze")
    batch_1d = unsqueeze0(batch_n, "batch.unsqueeze")

    with b.scope("embeddings"):
        # position ids: Range(0, seq, 1) -> [1, seq]
        start = b.const("zero", 0, i64)
        one = b.const("one", 1, i64)
        pos = b.node("Range", [start, seq_n, one], "position_ids.range")
        pos = b.node("Unsqueeze", [pos, b.const("axes.0", [0], i64)], "position_ids")
        # token type ids: the zero buffer sliced to seq and expanded to (batch, -1)
        buf = b.const("embeddings.token_type_ids", np.zeros((1, max_positions), i64), i64)
        tt = b.node("Slice", [buf, b.const("starts.0", [0], i64), seq_1d,
                              b.const("axes.1", [1], i64)], "token_type_ids.slice")
        shape = b.node("Concat", [batch_1d, b.const("minus_one.1d", [-1], i64)],
                       "token_type_ids.sizes", axis=0)
        tt = expand_minus_one(tt, shape, "token_type_ids")
        words = b.param("word_embeddings.weight", b.normal((vocab, hidden), 0.5))
        types = b.param("token_type_embeddings.weight", b.normal((2, hidden), 0.5))
        positions = b.param("position_embeddings.weight", b.normal((max_positions, hidden), 0.5))
        x = b.node("Gather", [words, "input_ids"], "word_embeddings", axis=0)
        x = b.add(x, b.node("Gather", [types, tt], "token_type_embeddings", axis=0), "add")
        x = b.add(x, b.node("Gather", [positions, pos], "position_embeddings", axis=0), "add_1")
        x = b.layer_norm(x, hidden, name="LayerNorm", eps=1e-12)

    with b.scope("extended_attention_mask"):  # (1 - mask[:, None, None, :]) * min
        m = b.node("Unsqueeze", ["attention_mask", b.const("axes.1", [1], i64)], "unsqueeze")
        m = b.node("Unsqueeze", [m, b.const("axes.2", [2], i64)], "unsqueeze_1")
        m = b.node("Cast", [m], "cast", to=TensorProto.FLOAT)
        m = b.node("Sub", [b.const("mask.one", 1.0), m], "sub")
        fill = np.float32(np.finfo(np.float32).min if mask_value == "min" else -10000.0)
        # the scalar fill as torch.full((), v) exports it: ConstantOfShape of an empty shape
        fill = b.node("ConstantOfShape", [b.const("shape.scalar", np.zeros(0, i64), i64)],
                      "fill", value=numpy_helper.from_array(np.array([fill], np.float32)))
        mask = b.node("Mul", [m, fill], "mul")

    def split_heads(y: str, name: str, perm) -> str:
        """Reshape to (batch, seq, heads, d) with the shape built from Shape, then Transpose."""
        with b.scope(name):
            bn = unsqueeze0(scalar_dim(y, 0, "batch"), "batch.unsqueeze")
            sn = unsqueeze0(scalar_dim(y, 1, "seq"), "seq.unsqueeze")
            shape = b.node("Concat", [bn, sn, b.const("heads.1d", [heads], i64),
                                      b.const("head_dim.1d", [d], i64)], "shape", axis=0)
            y = b.node("Reshape", [y, shape], "reshape")
            return b.node("Transpose", [y], "transpose", perm=perm)

    for i in range(layers):
        with b.scope(f"encoder.layer.{i}"):
            with b.scope("attention"):
                q = split_heads(b.linear(x, hidden, hidden, name="query"), "query", [0, 2, 1, 3])
                k = split_heads(b.linear(x, hidden, hidden, name="key"), "key", [0, 2, 3, 1])
                v = split_heads(b.linear(x, hidden, hidden, name="value"), "value", [0, 2, 1, 3])
                s = b.node("MatMul", [q, k], "scores")
                s = b.node("Div", [s, b.const("attention.sqrt_d", math.sqrt(d))], "div")
                s = b.add(s, mask, "add_mask")
                p = b.node("Softmax", [s], "softmax", axis=-1)
                y = b.node("MatMul", [p, v], "context")
                y = b.node("Transpose", [y], "context.transpose", perm=[0, 2, 1, 3])
                bn = unsqueeze0(scalar_dim(y, 0, "context.batch"), "context.batch.unsqueeze")
                sn = unsqueeze0(scalar_dim(y, 1, "context.seq"), "context.seq.unsqueeze")
                shape = b.node("Concat", [bn, sn, b.const("hidden.1d", [hidden], i64)],
                               "context.shape", axis=0)
                y = b.node("Reshape", [y, shape], "context.reshape")
                y = b.linear(y, hidden, hidden, name="output.dense")
                x = b.layer_norm(b.add(y, x, "output.add"), hidden, name="output.LayerNorm",
                                 eps=1e-12)
            y = b.gelu(b.linear(x, hidden, ffn, name="intermediate.dense"),
                       name="intermediate.gelu")
            y = b.linear(y, ffn, hidden, name="output.dense")
            x = b.layer_norm(b.add(y, x, "output.add"), hidden, name="output.LayerNorm", eps=1e-12)

    with b.scope("pooler"):  # tanh(dense(x[:, 0]))
        first = b.node("Gather", [x, b.const("zero", 0, i64)], "first_token", axis=1)
        pooled = b.node("Tanh", [b.gemm(first, hidden, hidden, name="dense", gain=1.0)], "tanh")
    b.output(x, "last_hidden_state")
    b.output(pooled, "pooler_output")
    model = b.build(bert_torch_style.__doc__)
    if dynamic:  # name the outputs' symbolic axes as the exporter does
        for vi, names in zip(model.graph.output, (("batch", "sequence"), ("batch",))):
            for dim, name in zip(vi.type.tensor_type.shape.dim, names):
                dim.Clear()
                dim.dim_param = name
    return model


ZOO["bert_torch_style"] = bert_torch_style


if __name__ == "__main__":
    sys.exit(main())
