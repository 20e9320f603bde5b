"""Kernel-coverage benchmark: single-op ONNX models at real architectures' shapes, onnxc vs ORT.

Each case is one operator (or an operator and a tiny epilogue: bias Add, ReLU) at a shape
taken from a real model (Whisper, wav2vec2, ResNet-50, MobileNetV2, ConvNeXt, BERT, ViT,
GPT-2, LLaMA, ...), float32, batch 1 unless stated, weights as seeded random initializers
where the real model has constant weights, activations as graph inputs.  Every case is
compiled untuned (``compiler.compile(model, target=T, isolate=True, timeout=...)``) and
timed next to onnxruntime with ``compiler.tools.bench.measure`` (each engine in its own
worker process, alternating, medians).  FLOPs are counted analytically here (2 x MACs for conv/matmul; one
FLOP per arithmetic op per element for the rest, see each builder), and cases that only
move data report GB/s (bytes read + written) instead of GFLOP/s.

    python scripts/kernel_grid.py --quick                 # one small case per class
    python scripts/kernel_grid.py                         # the whole grid
    python scripts/kernel_grid.py --classes conv2d matmul -k r50 --threads 1
    python scripts/kernel_grid.py --list
    python scripts/kernel_grid.py --json grid.json --rounds 5 --runs 20
    python scripts/kernel_grid.py --interleave --shard 1/2 --json a.json   # half the grid
    python scripts/kernel_grid.py --summarize a.json b.json                # tables from saved rows

Columns: class, case, shape summary, GFLOP (or MB moved), onnxc ms, ORT ms, onnxc and ORT
throughput (GFLOP/s, or GB/s for data movement), ratio onnxc/ORT latency (< 1: onnxc is
faster), outputs allclose (rtol 1e-4, atol 1e-5, as compiler/tools/bench.py compares), and the
schedule rule of the heaviest kernel (the report's ``kernel_table`` row with the most FLOPs)
followed by the report's rule counts.

Notes: with ``--threads N`` both engines run N threads (ORT's intra_op_num_threads; onnxc's
TVM_NUM_THREADS, and the target's num-cores when the target is ``host``).  Integer inputs
are filled by compiler.tools.bench.random_feeds with values 0..7, so the Gather cases add
spread constant offsets to the ids to touch rows across the whole table.  A compile error,
a crash, a timeout or a mismatch is a row, never an abort.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

OPSET = 17
IR_VERSION = 8

# --------------------------------------------------------------------------- #
# Model building
# --------------------------------------------------------------------------- #


class G:
    """A tiny ONNX graph builder: inputs, seeded initializers, nodes, outputs."""

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self._n = 0

    def input(self, name, shape, dtype="float32"):
        from onnx import helper

        self.inputs.append(helper.make_tensor_value_info(name, _elem(dtype), list(shape)))
        return name

    def init(self, name, array):
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name, shape, fan_in):
        w = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(1 / math.sqrt(fan_in))
        return self.init(name, w)

    def bias(self, name, n):
        return self.init(name, self.rng.standard_normal((n,), dtype=np.float32) * np.float32(0.02))

    def node(self, op, inputs, n_out=1, **attrs):
        from onnx import helper

        self._n += 1
        outs = [f"{op.lower()}{self._n}" + (f"_{i}" if n_out > 1 else "") for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=f"{op}_{self._n}", **attrs))
        return outs[0] if n_out == 1 else outs

    def output(self, *names):
        self.outputs += names

    def build(self):
        import onnx
        from onnx import helper

        graph = helper.make_graph(self.nodes, self.name, self.inputs,
                                  [helper.make_tensor_value_info(o, 0, None) for o in self.outputs],
                                  initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=IR_VERSION, producer_name="onnxc.kernel_grid")
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        types = {vi.name: vi.type for vi in inferred.graph.output}
        for vi in model.graph.output:
            vi.type.CopyFrom(types[vi.name])
        onnx.checker.check_model(model)
        return model


def _elem(dtype):
    from onnx import TensorProto

    return {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64,
            "bool": TensorProto.BOOL}[dtype]


def _prod(xs):
    return int(np.prod(xs, dtype=np.int64)) if len(xs) else 1


def _s(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass
class Case:
    cls: str
    name: str
    shape: str                 # human summary
    build: object              # () -> onnx.ModelProto
    flops: float               # analytic FLOPs (0: a data-movement case, see bytes)
    bytes: float = 0.0         # activation bytes read + written (for GB/s)
    quick: bool = False        # the small case --quick runs for its class
    notes: str = ""
    layout: str = "auto"       # compile's layout: "NCHW" where the real model keeps NCHW


CASES: list[Case] = []


def case(cls, name, shape, build, flops, nbytes=0.0, quick=False, notes="", layout="auto"):
    CASES.append(Case(cls, name, shape, build, float(flops), float(nbytes), quick, notes,
                      layout))


# -- convolutions ------------------------------------------------------------ #


def conv_case(cls, name, cin, cout, k, spatial, stride=1, pad=None, dil=1, group=1, bias=True,
              epilogue=None, quick=False, pads=None, source="", layout="auto"):
    """Conv (any rank) over x[1,cin,*spatial]; k, stride, dil ints or tuples per axis."""
    nd = len(spatial)
    k = (k,) * nd if isinstance(k, int) else tuple(k)
    stride = (stride,) * nd if isinstance(stride, int) else tuple(stride)
    dil = (dil,) * nd if isinstance(dil, int) else tuple(dil)
    if pads is None:
        pad = tuple(d * (kk - 1) // 2 for kk, d in zip(k, dil)) if pad is None else \
            ((pad,) * nd if isinstance(pad, int) else tuple(pad))
        pads = list(pad) + list(pad)
    out = [(spatial[i] + pads[i] + pads[i + nd] - dil[i] * (k[i] - 1) - 1) // stride[i] + 1
           for i in range(nd)]
    macs = cout * _prod(out) * (cin // group) * _prod(k)
    flops = 2 * macs + (cout * _prod(out) if bias else 0) + \
        (cout * _prod(out) if epilogue else 0)

    def build():
        g = G(name)
        x = g.input("x", [1, cin, *spatial])
        ins = [x, g.weight("w", [cout, cin // group, *k], cin // group * _prod(k))]
        if bias:
            ins.append(g.bias("b", cout))
        y = g.node("Conv", ins, kernel_shape=list(k), strides=list(stride), pads=list(pads),
                   dilations=list(dil), group=group)
        if epilogue == "relu":
            y = g.node("Relu", [y])
        elif epilogue == "relu6":
            y = g.node("Clip", [y, g.init("lo", np.float32(0)), g.init("hi", np.float32(6))])
        elif epilogue == "silu":  # x * sigmoid(x), as torch.onnx exports nn.SiLU()
            y = g.node("Mul", [y, g.node("Sigmoid", [y])])
        elif epilogue == "gelu":  # erf form, as torch.onnx exports nn.GELU()
            e = g.node("Erf", [g.node("Div", [y, g.init("sqrt2", np.float32(2 ** 0.5))])])
            h = g.node("Mul", [y, g.node("Add", [e, g.init("one", np.float32(1))])])
            y = g.node("Mul", [h, g.init("half", np.float32(0.5))])
        g.output(y)
        return g.build()

    kk = "x".join(map(str, k))
    extra = (f"/{stride[0]}" if any(s > 1 for s in stride) else "") + \
        (f" d{dil[0]}" if any(d > 1 for d in dil) else "") + (f" g{group}" if group > 1 else "") + \
        (f" +{epilogue}" if epilogue else "")
    shape = f"{_s([1, cin, *spatial])} {kk}{extra} ->{cout}"
    case(cls, name, shape, build, flops, quick=quick, notes=source, layout=layout)


def convT_case(cls, name, cin, cout, k, spatial, stride, pad=0, bias=True, quick=False, source=""):
    nd = len(spatial)
    out = [(s - 1) * stride - 2 * pad + k for s in spatial]
    macs = cin * _prod(spatial) * cout * k ** nd          # every input pixel scatters k^nd taps
    flops = 2 * macs + (cout * _prod(out) if bias else 0)

    def build():
        g = G(name)
        x = g.input("x", [1, cin, *spatial])
        ins = [x, g.weight("w", [cin, cout, *([k] * nd)], cin * k ** nd // stride ** nd)]
        if bias:
            ins.append(g.bias("b", cout))
        g.output(g.node("ConvTranspose", ins, kernel_shape=[k] * nd, strides=[stride] * nd,
                        pads=[pad] * (2 * nd)))
        return g.build()

    shape = f"{_s([1, cin, *spatial])} k{k} s{stride} p{pad} ->{cout}{_s(out)}"
    case(cls, name, shape, build, flops, quick=quick, notes=source)


# conv1d
conv_case("conv1d", "whisper_stem1", 80, 512, 3, [3000], epilogue=None,
          source="Whisper-base encoder conv1")
conv_case("conv1d", "whisper_stem2", 512, 512, 3, [3000], stride=2,
          source="Whisper-base encoder conv2")
conv_case("conv1d", "w2v2_fe0", 1, 512, 10, [16000], stride=5, pad=0, bias=False,
          source="wav2vec2 feature extractor conv0 (1 s of 16 kHz audio)")
conv_case("conv1d", "w2v2_fe1", 512, 512, 3, [3199], stride=2, pad=0, bias=False,
          source="wav2vec2 feature extractor conv1")
conv_case("conv1d", "w2v2_fe1_gelu", 512, 512, 3, [3199], stride=2, pad=0, bias=False,
          epilogue="gelu", source="wav2vec2 feature extractor conv1 with its GELU")
conv_case("conv1d", "w2v2_fe6", 512, 512, 2, [99], stride=2, pad=0, bias=False, quick=True,
          source="wav2vec2 feature extractor conv6")
conv_case("conv1d", "w2v2_posconv_g16", 768, 768, 128, [49], pad=64, group=16,
          source="wav2vec2 positional conv (grouped)")
conv_case("conv1d", "conformer_dw31", 256, 256, 31, [500], group=256,
          source="Conformer conv module depthwise")
conv_case("conv1d", "wavenet_dil4", 64, 64, 2, [4000], dil=4, pads=[4, 0],
          source="WaveNet-like causal dilated conv")

# conv2d
conv_case("conv2d", "r50_stem7x7s2", 3, 64, 7, [224, 224], stride=2, source="ResNet-50 stem")
conv_case("conv2d", "r50_3x3_64", 64, 64, 3, [56, 56], source="ResNet-50 layer1 conv2")
conv_case("conv2d", "r50_3x3_64_relu", 64, 64, 3, [56, 56], epilogue="relu",
          source="ResNet-50 layer1 conv2 + BN(folded) + ReLU")
conv_case("conv2d", "r50_1x1_256to64", 256, 64, 1, [56, 56], source="ResNet-50 layer1 conv1")
conv_case("conv2d", "r50_3x3s2_128", 128, 128, 3, [56, 56], stride=2,
          source="ResNet-50 v1.5 layer2.0 conv2")
conv_case("conv2d", "r50_1x1_1024to256", 1024, 256, 1, [14, 14], quick=True,
          source="ResNet-50 layer4.0 conv1")
conv_case("conv2d", "r50_1x1s2_1024to2048", 1024, 2048, 1, [14, 14], stride=2,
          source="ResNet-50 layer4 downsampling shortcut (strided 1x1: a subsample stage)")
conv_case("conv2d", "r50_3x3_512_7", 512, 512, 3, [7, 7], source="ResNet-50 layer4 conv2")
conv_case("conv2d", "r50_1x1_512to2048_7", 512, 2048, 1, [7, 7], source="ResNet-50 layer4 conv3")
conv_case("conv2d", "mvit_1x1_64to256_64", 64, 256, 1, [64, 64], epilogue="silu", layout="NCHW",
          source="MobileViT-S expand 1x1 at 64x64 (NCHW as in the model: 16 KB planes)")
conv_case("conv2d", "mvit_1x1_32to128_128", 32, 128, 1, [128, 128], epilogue="silu",
          layout="NCHW", source="MobileViT-S expand 1x1 at 128x128 (NCHW as in the model)")
conv_case("conv2d", "mbv2_expand_16to96", 16, 96, 1, [112, 112], epilogue="relu6",
          source="MobileNetV2 layer 1 expand 1x1 (+ReLU6)")
conv_case("conv2d", "mbv2_stem3x3s2", 3, 32, 3, [224, 224], stride=2, epilogue="relu6",
          source="MobileNetV2 stem")
conv_case("conv2d", "mbv2_dw3x3_144", 144, 144, 3, [56, 56], group=144,
          source="MobileNetV2 block depthwise")
conv_case("conv2d", "mbv2_dw3x3s2_96", 96, 96, 3, [112, 112], stride=2, group=96,
          source="MobileNetV2 block depthwise, stride 2")
conv_case("conv2d", "mbv2_dw3x3_144_relu6", 144, 144, 3, [56, 56], group=144, epilogue="relu6",
          source="MobileNetV2 depthwise + BN(folded) + ReLU6")
conv_case("conv2d", "convnext_dw7x7_96", 96, 96, 7, [56, 56], group=96,
          source="ConvNeXt-T stage1 depthwise")
conv_case("conv2d", "convnext_dw7x7_768", 768, 768, 7, [7, 7], group=768,
          source="ConvNeXt-T stage4 depthwise")
conv_case("conv2d", "resnext_g32_128", 128, 128, 3, [56, 56], group=32,
          source="ResNeXt-50 32x4d layer1 grouped conv")
conv_case("conv2d", "effnet_dw5x5_240", 240, 240, 5, [28, 28], group=240,
          source="EfficientNet-B0 MBConv depthwise 5x5")
conv_case("conv2d", "odd_3x3_40to80", 40, 80, 3, [28, 28], source="odd channels (EfficientNet)")
conv_case("conv2d", "odd_1x1_112to672", 112, 672, 1, [14, 14], source="EfficientNet-B0 expand")
conv_case("conv2d", "unet_3x3_128to64", 128, 64, 3, [128, 128], source="U-Net decoder conv")
conv_case("conv2d", "dpt_3x3_256_144", 256, 256, 3, [144, 144], epilogue="relu",
          source="DPT-base (384) fusion stage residual conv at 144x144 (+ReLU)")
conv_case("conv2d", "segformer_cls_1x1_256to150", 256, 150, 1, [128, 128], bias=False,
          source="Segformer-B0 (512) decode head classifier (150 classes: not packed)")
conv_case("conv2d", "segformer_fuse_1x1_1024to256", 1024, 256, 1, [128, 128], bias=False,
          epilogue="relu", source="Segformer-B0 (512) decode head linear_fuse + BN + ReLU")

# conv3d
conv_case("conv3d", "c3d_3x3x3_64to128", 64, 128, 3, [8, 56, 56], source="C3D conv2")
conv_case("conv3d", "r2p1d_1x3x3_64to144", 64, 144, (1, 3, 3), [8, 56, 56],
          source="R(2+1)D spatial conv")
conv_case("conv3d", "r2p1d_3x1x1_144to64", 144, 64, (3, 1, 1), [8, 56, 56],
          source="R(2+1)D temporal conv")
conv_case("conv3d", "unet3d_3x3x3_32", 32, 32, 3, [32, 32, 32], quick=True, source="3-D U-Net")

# ConvTranspose
convT_case("convtranspose", "unet_up2d_k2s2", 128, 64, 2, [64, 64], 2, source="U-Net up-conv")
convT_case("convtranspose", "dcgan_k4s2p1", 256, 128, 4, [16, 16], 2, pad=1, quick=True,
           source="DCGAN generator")
convT_case("convtranspose", "vocoder1d_k4s2p1", 256, 128, 4, [1000], 2, pad=1,
           source="HiFi-GAN-like upsampler")
convT_case("convtranspose", "up3d_k2s2", 32, 16, 2, [16, 16, 16], 2, source="3-D U-Net up-conv")


# -- matmul with constant weights --------------------------------------------- #


def matmul_case(cls, name, m, k, n, bias=True, quick=False, source="", rank3=True):
    flops = 2 * m * k * n + (m * n if bias else 0)

    def build():
        g = G(name)
        x = g.input("x", [1, m, k] if rank3 else [m, k])
        y = g.node("MatMul", [x, g.weight("w", [k, n], k)])
        if bias:
            y = g.node("Add", [y, g.bias("b", n)])
        g.output(y)
        return g.build()

    shape = f"{_s([1, m, k] if rank3 else [m, k])} x W{_s([k, n])}" + (" +b" if bias else "")
    case(cls, name, shape, build, flops, quick=quick, notes=source)


for _m, _src in ((128, "BERT-base S=128"), (197, "ViT-B/16 224"), (577, "ViT-B/16 384"),
                 (1, "BERT/ViT M=1")):
    for _k, _n in ((768, 768), (768, 3072), (3072, 768)):
        if _m == 577 and (_k, _n) != (768, 3072):
            continue
        if _m == 1 and (_k, _n) != (3072, 768):
            continue  # M=1 x 768x3072 is in gemv
        matmul_case("matmul", f"m{_m}_{_k}x{_n}", _m, _k, _n, source=_src,
                    quick=(_m, _k, _n) == (128, 768, 768))
matmul_case("matmul", "gpt2_m1_768x2304", 1, 768, 2304, source="GPT-2 decode c_attn")
matmul_case("matmul", "llama_m77_1024x2816", 77, 1024, 2816, source="LLaMA-like MLP, 77 tokens")
matmul_case("matmul", "llama_m257_1024x2816", 257, 1024, 2816, source="LLaMA-like MLP, 257 tokens")
matmul_case("matmul", "whisper_m1500_512x2048", 1500, 512, 2048, source="Whisper-base encoder MLP")
matmul_case("matmul", "t5_m128_512x512", 128, 512, 512, bias=False, source="T5-small q/k/v/o")
matmul_case("matmul", "t5_m128_512x2048", 128, 512, 2048, bias=False, source="T5-small MLP wi")
matmul_case("matmul", "t5_m128_2048x512", 128, 2048, 512, bias=False, source="T5-small MLP wo")
matmul_case("matmul", "llama_m128_1024x2816", 128, 1024, 2816, bias=False,
            source="LLaMA-GQA MLP gate/up, 128 tokens")
matmul_case("matmul", "llama_m128_2816x1024", 128, 2816, 1024, bias=False,
            source="LLaMA-GQA MLP down, 128 tokens")
matmul_case("matmul", "odd_m49_768x768", 49, 768, 768, source="Swin window 7x7 tokens")
matmul_case("matmul", "odd_m50_768x3072", 50, 768, 3072, source="CLIP ViT-B/32 50 tokens MLP")

# gemv
matmul_case("gemv", "gemv_4096x4096", 1, 4096, 4096, bias=False, rank3=False, quick=True,
            source="LLaMA-7B decode projection")
matmul_case("gemv", "gemv_768x3072", 1, 768, 3072, bias=False, rank3=False,
            source="BERT/GPT-2 MLP at M=1")


def gemm_head_case(name, k, n, source=""):
    """A CNN classifier head as torch.onnx writes nn.Linear: Gemm(x, W[n, k], b, transB=1)."""
    def build():
        g = G(name)
        x = g.input("x", [1, k])
        g.output(g.node("Gemm", [x, g.weight("w", [n, k], k), g.bias("b", n)], transB=1))
        return g.build()

    case("gemv", name, f"[1,{k}] x W[{n},{k}]^T +b", build, 2 * k * n + n, notes=source)


gemm_head_case("head_1280x1001", 1280, 1001, source="MobileNetV2 (HF) classifier")
gemm_head_case("head_2048x1000", 2048, 1000, source="ResNet-50 classifier")


# -- batched matmul, both operands activations ------------------------------- #


def bmm_case(name, a_shape, b_shape, transposed=False, quick=False, source=""):
    """MatMul(A, B); with ``transposed`` B is given as [..., N, K] and Transposed (last two
    axes) in the graph, as exporters write Q @ K^T."""
    bshape = list(b_shape)
    if transposed:
        bshape[-1], bshape[-2] = bshape[-2], bshape[-1]
    batch = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    flops = 2 * _prod(batch) * m * k * n

    def build():
        g = G(name)
        a = g.input("a", a_shape)
        b = g.input("b", bshape)
        if transposed:
            perm = list(range(len(bshape)))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            b = g.node("Transpose", [b], perm=perm)
        g.output(g.node("MatMul", [a, b]))
        return g.build()

    shape = f"{_s(a_shape)} x {_s(bshape)}" + ("^T" if transposed else "")
    case("bmm", name, shape, build, flops, quick=quick, notes=source)


for _h, _sq, _sk, _tag in ((12, 197, 197, "vit"), (12, 128, 128, "bert"), (12, 512, 512, "s512"),
                           (12, 1, 1024, "decode_kv1024")):
    bmm_case(f"qk_{_tag}", [_h, _sq, 64], [_h, 64, _sk], quick=_tag == "bert",
             source="attention scores, K given transposed")
    bmm_case(f"qkT_{_tag}", [_h, _sq, 64], [_h, 64, _sk], transposed=True,
             source="attention scores, MatMul(Q, Transpose(K))")
bmm_case("qk_s4096_h1", [1, 4096, 64], [1, 64, 4096], source="long sequence, 1 head")
bmm_case("pv_vit", [12, 197, 197], [12, 197, 64], source="attention context P @ V")
bmm_case("qkT_whisper", [8, 1500, 64], [8, 64, 1500], transposed=True,
         source="Whisper-base encoder scores, 1500 frames")
bmm_case("pv_whisper", [8, 1500, 1500], [8, 1500, 64], source="Whisper-base encoder context")
bmm_case("pv_decode_kv1024", [12, 1, 1024], [12, 1024, 64], source="decode context P @ V")
bmm_case("bcast_b2_w64", [2, 12, 128, 64], [64, 64], source="broadcast batch: rank-2 B")
bmm_case("bcast_4d_x_3d", [1, 12, 128, 64], [12, 64, 128], source="broadcast batch: 4-D x 3-D")


def _gqa(s=128, hq=8, hkv=2, d=64):
    name = f"gqa_qkT_h{hq}kv{hkv}_s{s}"
    flops = 2 * hq * s * d * s

    def build():
        g = G(name)
        q = g.input("q", [1, hq, s, d])
        k = g.input("k", [1, hkv, s, d])
        k = g.node("Unsqueeze", [k, g.init("ax2", np.array([2], np.int64))])
        k = g.node("Expand", [k, g.init("eshape", np.array([1, hkv, hq // hkv, s, d], np.int64))])
        k = g.node("Reshape", [k, g.init("rshape", np.array([1, hq, s, d], np.int64))])
        k = g.node("Transpose", [k], perm=[0, 1, 3, 2])
        g.output(g.node("MatMul", [q, k]))
        return g.build()

    case("bmm", name, f"q{_s([1, hq, s, d])} k{_s([1, hkv, s, d])} expand^T", build, flops,
         notes="LLaMA-style GQA export: Unsqueeze/Expand/Reshape of K, Transpose, MatMul")


_gqa()


# -- normalization, softmax, reductions -------------------------------------- #


def norm_case(name, shape, build_body, flops, quick=False, source="", in_dtype="float32"):
    def build():
        g = G(name)
        x = g.input("x", shape, in_dtype)
        g.output(build_body(g, x))
        return g.build()

    case("norm", name, _s(shape) + " " + source, build, flops, quick=quick)


for _shape, _tag in (([12, 197, 197], "vit"), ([12, 128, 128], "bert"), ([1, 32000], "vocab32k"),
                     ([16, 4096], "16x4096"), ([8, 1500, 1500], "whisper"), ([8, 128, 128], "t5")):
    norm_case(f"softmax_{_tag}", _shape, lambda g, x: g.node("Softmax", [x], axis=-1),
              5 * _prod(_shape), quick=_tag == "bert", source="softmax(-1)")


def _ln(dim):
    return lambda g, x: g.node("LayerNormalization",
                               [x, g.init("gamma", 1 + 0.1 * g.rng.standard_normal(dim, dtype=np.float32)),
                                g.bias("beta", dim)], axis=-1, epsilon=1e-5)


norm_case("layernorm_197x768", [197, 768], _ln(768), 8 * 197 * 768, source="ViT LN")
norm_case("layernorm_1500x512", [1500, 512], _ln(512), 8 * 1500 * 512, source="Whisper LN")


def _rms(g, x):
    sq = g.node("Pow", [x, g.init("two", np.float32(2))])
    ms = g.node("ReduceMean", [sq], axes=[-1], keepdims=1)
    r = g.node("Sqrt", [g.node("Add", [ms, g.init("eps", np.float32(1e-6))])])
    y = g.node("Div", [x, r])
    return g.node("Mul", [y, g.init("gamma", 1 + 0.1 * g.rng.standard_normal(1024, dtype=np.float32))])


norm_case("rmsnorm_128x1024", [128, 1024], _rms, 4 * 128 * 1024,
          source="Pow/ReduceMean/Add/Sqrt/Div/Mul")

_R = [1, 512, 3000]
norm_case("reducemean_ax1", _R, lambda g, x: g.node("ReduceMean", [x], axes=[1], keepdims=1),
          _prod(_R), source="axis 1 (not last)")
norm_case("reducesum_ax1", _R, lambda g, x: g.node(
    "ReduceSum", [x, g.init("axes", np.array([1], np.int64))], keepdims=1),
    _prod(_R), source="axis 1 (not last)")
norm_case("reducemax_ax1", _R, lambda g, x: g.node("ReduceMax", [x], axes=[1], keepdims=1),
          _prod(_R), source="axis 1 (not last)")
norm_case("reducemean_gap_2048x7x7", [1, 2048, 7, 7],
          lambda g, x: g.node("ReduceMean", [x], axes=[2, 3], keepdims=1), 2048 * 49,
          source="axes [2,3] (GAP)")
norm_case("reducesum_all", _R, lambda g, x: g.node("ReduceSum", [x], keepdims=0), _prod(_R),
          source="all axes")
norm_case("argmax_vocab32k", [1, 32000],
          lambda g, x: g.node("ArgMax", [x], axis=-1, keepdims=1), 32000, source="axis -1")
norm_case("argmax_seg_ax1", [1, 21, 256, 256],
          lambda g, x: g.node("ArgMax", [x], axis=1, keepdims=0), 21 * 256 * 256,
          source="axis 1 (segmentation classes)")


# -- pooling ------------------------------------------------------------------ #


def pool_case(name, op, shape, k, stride, pad=0, quick=False, source=""):
    nd = len(shape) - 2
    if op == "GlobalAveragePool":
        out = [1] * nd
        flops = _prod(shape)
    else:
        out = [(s + 2 * pad - k) // stride + 1 for s in shape[2:]]
        flops = _prod(shape[:2]) * _prod(out) * k ** nd

    def build():
        g = G(name)
        x = g.input("x", shape)
        attrs = {} if op == "GlobalAveragePool" else dict(
            kernel_shape=[k] * nd, strides=[stride] * nd, pads=[pad] * (2 * nd))
        g.output(g.node(op, [x], **attrs))
        return g.build()

    desc = f"{_s(shape)} " + ("global" if op == "GlobalAveragePool" else f"k{k} s{stride} p{pad}")
    case("pool", name, desc, build, flops, quick=quick, notes=source)


pool_case("maxpool1d_k3s2", "MaxPool", [1, 64, 4000], 3, 2, source="1-D audio")
pool_case("avgpool3d_2x2x2", "AveragePool", [1, 64, 8, 56, 56], 2, 2, source="video (C3D-like)")
pool_case("maxpool2d_3x3s2", "MaxPool", [1, 64, 112, 112], 3, 2, pad=1, source="ResNet-50 stem pool")
pool_case("gap_1280x7x7", "GlobalAveragePool", [1, 1280, 7, 7], 0, 0, quick=True,
          source="MobileNetV2 head")


# -- data movement ------------------------------------------------------------ #


def move_case(name, desc, build, nbytes, flops=0, quick=False, source=""):
    case("move", name, desc, build, flops, nbytes, quick=quick, notes=source)


def _single(name, shape, body, dtype="float32"):
    def build():
        g = G(name)
        x = g.input("x", shape, dtype)
        outs = body(g, x)
        g.output(*(outs if isinstance(outs, list) else [outs]))
        return g.build()
    return build


_B = 4  # bytes per float32


def _resize(mode, scales=None, sizes=None, ctm="half_pixel"):
    def body(g, x):
        attrs = dict(mode=mode, coordinate_transformation_mode=ctm)
        if mode == "nearest":
            attrs["nearest_mode"] = "floor"
        ins = [x, ""]
        if scales is not None:
            ins.append(g.init("scales", np.array(scales, np.float32)))
        else:
            ins += ["", g.init("sizes", np.array(sizes, np.int64))]
        return g.node("Resize", ins, **attrs)
    return body


_X = [1, 256, 32, 32]
move_case("resize_nearest_x2", f"{_s(_X)} nearest x2",
          _single("resize_nearest_x2", _X, _resize("nearest", [1, 1, 2, 2], ctm="asymmetric")),
          _B * _prod(_X) * 5, quick=True, source="FPN / U-Net upsample")
move_case("resize_linear_x2", f"{_s(_X)} linear x2",
          _single("resize_linear_x2", _X, _resize("linear", [1, 1, 2, 2])),
          _B * _prod(_X) * 5, flops=7 * _prod(_X) * 4, source="bilinear upsample")
_D = [1, 128, 192, 192]
move_case("resize_linear_x2_dpt", f"{_s(_D)} linear x2 align_corners",
          _single("resize_linear_x2_dpt", _D,
                  _resize("linear", [1, 1, 2, 2], ctm="align_corners")),
          _B * _prod(_D) * 5, flops=7 * _prod(_D) * 4,
          source="DPT-base (384) head's bilinear x2 (head.1), align_corners")
move_case("resize_linear_to224", "[1,3,256,256] linear ->224",
          _single("resize_linear_to224", [1, 3, 256, 256],
                  _resize("linear", sizes=[1, 3, 224, 224])),
          _B * (3 * 256 * 256 + 3 * 224 * 224), flops=7 * 3 * 224 * 224,
          source="preprocessing resize")


def _gather(name, vocab, dim, n):
    def build():
        g = G(name)
        ids = g.input("ids", [1, n], "int64")
        offs = g.rng.integers(0, vocab - 8, size=(1, n)).astype(np.int64)
        ids = g.node("Add", [ids, g.init("offsets", offs)])
        table = g.init("table", g.rng.standard_normal((vocab, dim), dtype=np.float32))
        g.output(g.node("Gather", [table, ids], axis=0))
        return g.build()
    move_case(name, f"table[{vocab},{dim}] ids[1,{n}]", build, 2 * _B * n * dim,
              source="token embedding")


_gather("gather_bert_30522x768_128", 30522, 768, 128)
_gather("gather_gpt2_50257x768_1", 50257, 768, 1)

_P = [1, 64, 112, 112]
move_case("pad_reflect3", f"{_s(_P)} reflect 3",
          _single("pad_reflect3", _P, lambda g, x: g.node(
              "Pad", [x, g.init("pads", np.array([0, 0, 3, 3, 0, 0, 3, 3], np.int64))],
              mode="reflect")),
          _B * (_prod(_P) + 64 * 118 * 118), source="pix2pix/CycleGAN ReflectionPad2d(3)")
move_case("pad_constant1", f"{_s(_P)} constant 1",
          _single("pad_constant1", _P, lambda g, x: g.node(
              "Pad", [x, g.init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
                      g.init("value", np.float32(0))], mode="constant")),
          _B * (_prod(_P) + 64 * 114 * 114), source="explicit zero pad")


def _concat_build():
    g = G("concat4")
    xs = [g.input(f"x{i}", [1, 64, 56, 56]) for i in range(4)]
    g.output(g.node("Concat", xs, axis=1))
    return g.build()


move_case("concat4_axis1", "4x[1,64,56,56] axis 1", _concat_build, 2 * _B * 4 * 64 * 56 * 56,
          source="Inception/DenseNet concat")
move_case("split3_qkv", "[1,197,2304] -> 3 x 768 on -1",
          _single("split3_qkv", [1, 197, 2304], lambda g, x: list(g.node(
              "Split", [x, g.init("split", np.array([768, 768, 768], np.int64))], n_out=3,
              axis=-1))),
          2 * _B * 197 * 2304, source="ViT fused QKV split")
move_case("transpose_heads", "[1,197,12,64] perm 0213",
          _single("transpose_heads", [1, 197, 12, 64],
                  lambda g, x: g.node("Transpose", [x], perm=[0, 2, 1, 3])),
          2 * _B * 197 * 768, source="attention head split")
move_case("transpose_nchw_nhwc", f"{_s(_P)} perm 0231",
          _single("transpose_nchw_nhwc", _P, lambda g, x: g.node("Transpose", [x], perm=[0, 2, 3, 1])),
          2 * _B * _prod(_P), source="layout change")
move_case("slice_crop224", "[1,3,256,256] [16:240,16:240]",
          _single("slice_crop224", [1, 3, 256, 256], lambda g, x: g.node(
              "Slice", [x, g.init("starts", np.array([16, 16], np.int64)),
                        g.init("ends", np.array([240, 240], np.int64)),
                        g.init("axes", np.array([2, 3], np.int64))])),
          2 * _B * 3 * 224 * 224, source="center crop")
move_case("slice_kv_first512", "[1,12,1024,64] [:, :, :512]",
          _single("slice_kv_first512", [1, 12, 1024, 64], lambda g, x: g.node(
              "Slice", [x, g.init("starts", np.array([0], np.int64)),
                        g.init("ends", np.array([512], np.int64)),
                        g.init("axes", np.array([2], np.int64))])),
          2 * _B * 12 * 512 * 64, source="kv-cache window")
move_case("expand_mask", "[1,1,1,128] -> [1,12,128,128]",
          _single("expand_mask", [1, 1, 1, 128], lambda g, x: g.node(
              "Expand", [x, g.init("shape", np.array([1, 12, 128, 128], np.int64))])),
          _B * (128 + 12 * 128 * 128), source="attention mask broadcast")


def _where_build():
    g = G("where_mask")
    m = g.input("mask", [1, 1, 128, 128], "bool")
    x = g.input("x", [1, 12, 128, 128])
    g.output(g.node("Where", [m, x, g.init("neg", np.float32(-1e4))]))
    return g.build()


move_case("where_bcast_mask", "mask[1,1,128,128] x[1,12,128,128]", _where_build,
          _B * 2 * 12 * 128 * 128 + 128 * 128, source="masked_fill of attention scores")

CLASSES = ["conv1d", "conv2d", "conv3d", "convtranspose", "matmul", "bmm", "gemv", "norm",
           "pool", "move"]


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


def cpu_line(threads: int) -> str:
    from compiler.tools.bench import host_cpu

    return (f"CPU: {host_cpu()}, {len(os.sched_getaffinity(0))} CPUs available, "
            f"threads: {threads}")


def resolve_target(target: str, threads: int):
    """``host`` with num-cores = threads when fewer threads than CPUs are asked for."""
    if target != "host" or threads >= len(os.sched_getaffinity(0)):
        return target
    import targets

    d = dict(targets.resolve("host").tvm)
    d["num-cores"] = threads
    return d


def heaviest(report: dict) -> dict | None:
    """The kernel_table row with the most FLOPs (then the most bytes)."""
    rows = report.get("kernel_table") or []
    return max(rows, key=lambda r: (r["flops"], r["bytes"])) if rows else None


def _first_lines(e: BaseException, n: int = 3) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return " | ".join(line.strip() for line in text[:n] if line.strip())[:600]


def run_case(c: Case, args, tmp: str, target) -> dict:
    import onnx

    import compiler
    from compiler.tools.bench import measure

    row = {"class": c.cls, "case": c.name, "shape": c.shape, "source": c.notes,
           "flops": c.flops, "bytes": c.bytes, "status": "ok"}
    path = os.path.join(tmp, f"{c.name}.onnx")
    so = os.path.join(tmp, f"{c.name}.so")
    try:
        onnx.save(c.build(), path)
    except Exception as e:  # noqa: BLE001
        row.update(status="build_error", error=_first_lines(e))
        return row
    try:
        t0 = time.perf_counter()
        cm = compiler.compile(path, target=target, isolate=True, timeout=args.compile_timeout,
                              layout=c.layout)
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        cm.export(so)
        rep = cm.report
        row["kernels"] = rep.get("kernels")
        row["schedules"] = rep.get("schedules", {})
        row["layout"] = (rep.get("layout") or {}).get("chosen")
        heavy = heaviest(rep)
        if heavy:
            row["heavy_kernel"] = heavy["kernel"]
            row["heavy_ops"] = heavy["ops"]
            row["heavy_rule"] = heavy["rule"]
    except Exception as e:  # noqa: BLE001
        row.update(status="compile_error", error=_first_lines(e))
        if args.verbose:
            traceback.print_exc()
        return row
    runs, warmup = args.runs, args.warmup
    try:
        if c.flops > 2e8 and args.case_budget > 0:  # a slow kernel: fewer runs, not minutes
            t = measure(path, so, rounds=1, runs=1, warmup=1, threads=args.threads,
                        compare=False)["onnxc"]["median_ms"] / 1e3
            per_run = args.case_budget / (2 * args.rounds)  # seconds per engine per round
            if t * (runs + warmup) > per_run:
                warmup = 1
                runs = max(2, min(runs, int(per_run / max(t, 1e-9)) - 1))
                row["runs"] = runs
        r = measure(path, so, rounds=args.rounds, runs=runs, warmup=warmup,
                    threads=args.threads)
    except Exception as e:  # noqa: BLE001
        row.update(status="run_error", error=_first_lines(e))
        return row
    on, ort = r["onnxc"]["median_ms"], r["onnxruntime"]["median_ms"]
    by_bytes = c.cls == "move" or not c.flops
    work = c.bytes if by_bytes else c.flops
    row.update(onnxc_ms=on, ort_ms=ort, onnxc_min_ms=r["onnxc"]["min_ms"],
               ort_min_ms=r["onnxruntime"]["min_ms"], ratio=r["ratio"],
               allclose=bool(r["allclose"]), max_abs_diff=max(r["max_abs_diff"] or [0.0]),
               unit="GB/s" if by_bytes else "GFLOP/s",
               onnxc_rate=work / on / 1e6, ort_rate=work / ort / 1e6)
    if not r["allclose"]:
        row["status"] = "mismatch"
        row["error"] = f"max abs diff {row['max_abs_diff']:.3g}"
    return row


def _rules_compact(sched: dict) -> str:
    return ",".join(f"{k}:{v}" for k, v in sorted(sched.items(), key=lambda kv: -kv[1]))


HDR = (f"{'class':<13} {'case':<26} {'shape':<44} {'GFLOP|MB':>9} {'onnxc ms':>9} {'ORT ms':>9} "
       f"{'onnxc G/s':>9} {'ORT G/s':>9} {'ratio':>6} {'ok':>4}  heavy rule [rule counts]")


def fmt_row(r: dict) -> str:
    work = (f"{r['bytes'] / 1e6:.2f}MB" if r["class"] == "move" or not r["flops"]
            else f"{r['flops'] / 1e9:.4g}")
    if "ratio" in r:
        unit = "" if r["unit"] == "GFLOP/s" else "B"
        nums = (f"{r['onnxc_ms']:>9.3f} {r['ort_ms']:>9.3f} {r['onnxc_rate']:>8.1f}{unit or ' '}"
                f" {r['ort_rate']:>8.1f}{unit or ' '} {r['ratio']:>6.2f} "
                f"{'yes' if r['allclose'] else 'NO':>4}")
    else:
        nums = f"{'-':>9} {'-':>9} {'-':>9} {'-':>9} {'-':>6} {'ERR':>4}"
    rule = r.get("heavy_rule", "-")
    if r.get("schedules"):
        rule += f" [{_rules_compact(r['schedules'])}]"
    if r["status"] not in ("ok", "mismatch"):
        rule = f"{r['status']}: {r.get('error', '')[:160]}"
    return f"{r['class']:<13} {r['case']:<26} {r['shape'][:44]:<44} {work:>9} {nums}  {rule}"


def summarize(rows: list[dict]) -> list[str]:
    lines = [f"{'class':<13} {'cases':>5} {'timed':>5} {'fail':>4} {'mism':>4} {'geomean':>8} "
             f"{'best':>6}  worst case"]
    for cls in CLASSES + ["ALL"]:
        rs = [r for r in rows if cls == "ALL" or r["class"] == cls]
        if not rs:
            continue
        timed = [r for r in rs if "ratio" in r]
        fails = sum(r["status"] not in ("ok", "mismatch") for r in rs)
        mism = sum(r["status"] == "mismatch" for r in rs)
        if timed:
            geo = float(np.exp(np.mean([math.log(r["ratio"]) for r in timed])))
            worst = max(timed, key=lambda r: r["ratio"])
            best = min(timed, key=lambda r: r["ratio"])
            lines.append(f"{cls:<13} {len(rs):>5} {len(timed):>5} {fails:>4} {mism:>4} "
                         f"{geo:>7.2f}x {best['ratio']:>5.2f}x  {worst['case']} "
                         f"{worst['ratio']:.2f}x ({worst['onnxc_ms']:.3f} vs "
                         f"{worst['ort_ms']:.3f} ms)")
        else:
            lines.append(f"{cls:<13} {len(rs):>5} {0:>5} {fails:>4} {mism:>4} {'-':>8} {'-':>6}")
    return lines


def select(args) -> list[Case]:
    cs = [c for c in CASES if not args.classes or c.cls in args.classes]
    if args.k:
        cs = [c for c in cs if any(s in c.name for s in args.k)]
    if args.quick:
        cs = [c for c in cs if c.quick]
    if args.interleave:  # round-robin over classes: a cut-short run still covers every class
        by = [[c for c in cs if c.cls == k] for k in CLASSES]
        cs = [c for i in range(max(map(len, by), default=0)) for grp in by if i < len(grp)
              for c in [grp[i]]]
    if args.shard:
        k, n = (int(v) for v in args.shard.split("/"))
        cs = cs[k - 1::n]
    return cs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n")[2])
    p.add_argument("--classes", nargs="+", choices=CLASSES, default=None)
    p.add_argument("-k", action="append", default=None,
                   help="run cases whose name contains this substring (repeatable)")
    p.add_argument("--quick", action="store_true", help="one small case per class")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="threads of both engines (default: all available CPUs)")
    p.add_argument("--target", default="host")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile-timeout", type=int, default=300)
    p.add_argument("--case-budget", type=float, default=30.0,
                   help="cases over 0.2 GFLOP whose onnxc run is slow get fewer runs, to about "
                        "this many seconds of timed runs per case (0: never)")
    p.add_argument("--json", default=None, help="write all rows here (rewritten after each case)")
    p.add_argument("--interleave", action="store_true",
                   help="run the classes round-robin instead of one after another")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run every N-th selected case starting at the K-th (1-based)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--summarize", nargs="+", metavar="JSON",
                   help="print the tables of saved --json files (shards merged) and exit")
    args = p.parse_args(argv)
    if args.summarize:
        return summarize_files(args.summarize)

    cases = select(args)
    if args.list:
        for c in cases:
            work = (f"{c.bytes / 1e6:.2f} MB" if c.cls == "move" or not c.flops
                    else f"{c.flops / 1e9:.4g} GFLOP")
            print(f"{c.cls:<13} {c.name:<26} {c.shape:<46} {work:>14}  {c.notes}")
        print(f"{len(cases)} cases")
        return 0
    if not cases:
        print("no case selected", file=sys.stderr)
        return 2
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # onnxc workers (runtime/threads.py)
    target = resolve_target(args.target, args.threads)
    head = cpu_line(args.threads)
    print(head, flush=True)
    print(f"onnxc untuned, target {json.dumps(target)}; {len(cases)} cases, rounds {args.rounds} "
          f"x runs {args.runs} (warmup {args.warmup}) per engine, medians", flush=True)
    print(HDR, flush=True)
    rows = []
    t0 = time.perf_counter()

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"cpu": head, "target": target, "threads": args.threads,
                           "rounds": args.rounds, "runs": args.runs, "rows": rows}, f, indent=1,
                          default=str)

    with tempfile.TemporaryDirectory(prefix="onnxc-kgrid-") as tmp:
        try:
            for c in cases:
                try:
                    r = run_case(c, args, tmp, target)
                except Exception as e:  # noqa: BLE001  (belt and braces: never abort the grid)
                    r = {"class": c.cls, "case": c.name, "shape": c.shape, "flops": c.flops,
                         "bytes": c.bytes, "status": "error", "error": _first_lines(e)}
                rows.append(r)
                print(fmt_row(r), flush=True)
                save()
                for f in ("onnx", "so"):
                    try:
                        os.remove(os.path.join(tmp, f"{c.name}.{f}"))
                    except OSError:
                        pass
        except KeyboardInterrupt:
            print(f"interrupted: {len(rows)} of {len(cases)} cases done", flush=True)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    save()
    print_summary(rows)
    return 0


def print_summary(rows: list[dict]) -> None:
    print("ratio = onnxc / ORT median latency (< 1: onnxc faster); "
          "G/s columns: GFLOP/s, or GB/s where marked B")
    for line in summarize(rows):
        print(line)
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        print("\nfailed or mismatched:")
        for r in bad:
            print(f"  {r['class']}/{r['case']}: {r['status']}: {r.get('error', '')}")


def summarize_files(paths: list[str]) -> int:
    """Print the table, the per-class summary and the failures of saved --json files."""
    rows, heads = [], []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        heads.append(f"{d.get('cpu')}; rounds {d.get('rounds')} x runs {d.get('runs')}")
        rows += d["rows"]
    order = {c.name: i for i, c in enumerate(CASES)}
    rows.sort(key=lambda r: order.get(r["case"], len(order)))
    for h in dict.fromkeys(heads):
        print(h)
    print(HDR)
    for r in rows:
        print(fmt_row(r))
    print()
    print_summary(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
