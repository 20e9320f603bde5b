"""The whole compiler on one screen: which passes run, in which order, and why.

``GRAPH_PASSES`` are ours (``passes/``) and run under the PassContext: each can be
disabled, is reported, and is dumped by ``--dump-ir``.  ``LOWERING`` is TVM's, fixed:
it turns the graph into kernels that the graph runtime calls.
"""

from __future__ import annotations

from tvm import relax

import passes

from . import lowering

# onnxc's legalizations, installed here once, before any pass runs: FoldConstants (a graph
# pass) legalizes constants with the functions registered on the ops, and must agree with
# LegalizeOps below
LEGALIZE_MAP = lowering.install()

FUSE = relax.transform.FuseOps()


def graph_passes() -> list:
    """Our Relax graph passes, in order (fresh instances per compile)."""
    return [
        # float16 models compute in float32 on CPU targets (onnxruntime's CPU provider
        # does the same; x86 rules are fp32): first, so every later pass sees float32
        passes.WidenHalf(),
        # Q(op(DQ(q))) of data movement (reshape, transpose, slice, concat) or max pooling
        # with the same scale and zero point => op(q): bytes move, not floats; first, while
        # the Q / DQ ops are still ops
        passes.QdqDataMovement(),
        # Q(f(DQ(x))) of one 8-bit tensor x (swish, sigmoid, GELU between a QDQ model's
        # layers) => a 256-entry table of x; first, while the Q / DQ ops are still ops
        passes.QdqLookupTable(),
        # QDQ matmuls (DQ(x) @ DQ(W), W a constant 8-bit weight) => int32 matmul * scales,
        # the MatMulInteger form pack_int_matmul packs; first: fold_constants would fold
        # DQ(W) into a float weight
        passes.QdqMatmulInteger(),
        # QDQ convs (DQ(x) conv DQ(W), W a constant 8-bit weight) => int32 conv * scales,
        # and per-tensor activation Q / DQ => arithmetic that convert_layout carries through
        # NCHW[b]c; before fold_constants for the same reason
        passes.QdqConvInteger(),
        # weight reshapes/casts and shape arithmetic on initializers become constants,
        # so no kernel recomputes them on every run
        passes.FoldConstants(),
        # the importer's alias bindings (n1_o0 = n1_2) end FuseOps groups: without this
        # conv + folded BN + Relu are two kernels
        passes.CanonicalizeBindings(),
        # explicit zero Pads before convs ("same" padding in exports) become the conv's
        # own padding: no padded copy of the activation; before the conv rewrites below
        passes.FoldPadIntoConv(),
        # kernel taps that read only padding at every output position (dilated convs over
        # small maps: DeepLab's ASPP) are cut from the weight: 1/9 of the work at dilation
        # 24 over 20x20; after fold_pad_into_conv, which sets the padding
        passes.TrimConvTaps(),
        # conv + inference BatchNorm => conv with scaled weights + bias: no BN kernel, the
        # bias add fuses into the conv (needs the constant weights folded above)
        passes.FoldBatchNorm(),
        # a dilated conv whose taps mostly read padding (DeepLab's dilation-12 ASPP branch
        # over 20x20: 64%) => per-tap 1x1 convs over the outputs each tap reaches, summed;
        # after trim_conv_taps and fold_batchnorm (which matches BN on the whole conv)
        passes.SplitDilatedConv(),
        # a strided ConvTranspose of few output channels (no channel block: a generator's
        # last layer, 64 -> 3), or 2-D with one tap per phase or many input channels =>
        # one stride-1 conv over its phases, interleaved and cropped; after
        # fold_batchnorm, before convert_layout (the conv takes the layouts)
        passes.ConvTransposeAsConv(),
        # E[x^2]-E[x]^2 cancels when |mean| >> std; before fuse_layer_norm, which expects
        # the two-pass form
        passes.StableVariance(),
        # decomposed exp(x)/sum(exp(x)) overflows (TVM's own softmax subtracts the max);
        # log(softmax) underflows to -inf
        passes.StableSoftmax(),
        # log(sum(exp(x))) overflows for x > 88
        passes.StableLogSumExp(),
        # softplus via log1p: no overflow, no loss of tiny values
        passes.StableSoftplus(),
        # softmax / log_softmax over a non-last axis (channels of NCHW) => over the last,
        # between transposes: the row rule takes it (a strided reduction ran 10-850x
        # onnxruntime); after stable_softmax, which makes the decomposed forms ops
        passes.SoftmaxLastAxis(),
        # decomposed LayerNorm (opset < 17 exports): nine ops => one fused kernel
        passes.FuseLayerNorm(),
        # a layer norm over several trailing axes (LayerNormalization axis=1 of NCHW) =>
        # one over their flattened row, reshapes as views: the row rule takes it; after
        # fuse_layer_norm, whose norms may span several axes
        passes.FlattenNormAxes(),
        # decomposed RMSNorm (T5, LLaMA exports): the square's kernel and the reduction's
        # => one row kernel reading x once
        passes.FuseRmsNorm(),
        # Erf/tanh GELU chains => one op
        passes.FuseGelu(),
        # MatMul, scale, mask Add, Softmax, MatMul => one attention kernel (after
        # stable_softmax); opt-in: slower than three kernels until attention has a schedule
        passes.FuseAttention(),
        # a decoder's key/value cache concat(past, new) on the sequence axis => stored
        # sequence-major [P, B, H, D]: present extends past in place (only the new rows are
        # written, no per-step copy of the cache), the attention matmuls read it through
        # their index (repeat_kv too); before fold_transpose_matmul, which takes Q @ K^T
        passes.SeqMajorCache(),
        # Q @ transpose(K) reads K in place (the matmul rule packs its panel transposed)
        # instead of a transpose kernel writing a copy; after fuse_attention, which matches
        # the transpose as part of attention
        passes.FoldTransposeMatmul(),
        # --precision bf16: constant-weight matmuls => bf16 weights [N/32, K/2, 32, 2] and
        # activations, fp32 accumulation (cpu.matmul_bf16: vdpbf16ps); does nothing at
        # fp32; before pack_matmul_weights, which would take them as fp32
        passes.PackBf16Matmul(),
        # constant matmul weights [K, N] -> [N/32, K, 32] panels once, here: the x86 kernel
        # streams contiguous panels instead of copying strided ones per call; after the fusions
        passes.PackMatmulWeights(),
        # MatMulInteger with constant weights (b - zb folded above) => packed int8 panels and
        # the activation zero point as a column-sum epilogue: cpu.matmul_int8's vpmaddwd
        # kernel, into which FuseOps fuses the dequantisation (one f32 kernel)
        passes.PackIntMatmul(),
        # op(reshape(x)) => reshape(op(x)) for elementwise ops keeping the last axis: a
        # matmul's bias / GELU / residual next to it again, where FuseOps takes them into
        # its kernel (pack_matmul_weights' flattened [B*M, K] matmuls: ConvNeXt's MLPs)
        passes.SinkReshape(),
        # fp16 reductions accumulate in fp32; after the fusions, which match fp16 ops bare
        passes.AccumulateFp32(),
        # conv graphs NCHW -> NCHW[b]c (b = vector lanes) with transforms only at the ends
        # of each conv chain; after fold_batchnorm (which expects OIHW weights), before
        # pack_conv_weights (which takes the convs left NCHW: stems, odd channel counts)
        passes.ConvertLayout(),
        # sigmoid's exp(-x) overflows (fp16 sigmoid(-12) = 0); after convert_layout, which
        # moves relax.sigmoid into NCHW[b]c with the convs but stops at the kernel this
        # emits (EfficientNet-B0: two layout transforms around every swish)
        passes.StableSigmoid(),
        # blocked int32 convs (qdq_conv_integer's) => the packed integer conv kernel
        # (cpu.conv2d_int8, vpmaddwd), the activation's widening and padding inside it;
        # after convert_layout, which chose their blocked layout
        passes.PackIntConv(),
        # spatial convs' constant weights OIHW -> OIHW[b]o once, here: the x86 conv kernel
        # vectorises over b output channels whatever the output width; after every pass
        # that changes conv weights (fold_batchnorm)
        passes.PackConvWeights(),
        # ConvTranspose per output phase with phase-packed constant weights: TVM's
        # lowering convolves an s-times zero-dilated input (s^d the work); after
        # fold_batchnorm, which scales transposed-conv weights
        passes.PackConvTranspose(),
        # drop what earlier rewrites left unused
        passes.EliminateDeadCode(),
        # concats on a leading axis (DenseNet's channel concats) => unfused kernels that
        # extraction drops: the planner places their inputs inside the output's buffer,
        # the producers write in place; last, after convert_layout fixed the axis
        passes.PlaceConcat(),
    ]


def lowering() -> list:
    """Relax ops -> TIR kernels, grouped; TVM's passes, always run, not configurable.

    The driver records which ONNX nodes each kernel covers across the "fuse" step
    (compiler/lowering/provenance.py), so that step is named.
    """
    return [
        # every Relax op becomes a call_tir to a TIR PrimFunc, with onnxc's legalizations
        # (compiler/lowering): float32 GELU and softmax with erf / exp in plain arithmetic
        # (TVM's are scalar libm calls per vector lane), blocked conv2d, topk, float max/min
        relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE_MAP),
        # mark each PrimFunc elementwise / broadcast / injective / reduction / out-fusable
        relax.transform.AnnotateTIROpPattern(),
        # constants that legalization exposed (e.g. reshaped biases)
        relax.transform.FoldConstant(),
        # group producer/consumer kernels by pattern (conv + bias + relu, elementwise chains)
        FUSE,
        # merge each group into one PrimFunc: one kernel per group
        relax.transform.FuseTIR(),
        # reshape kernels become views (no copy); the runtime shares their storage
        relax.transform.RewriteDataflowReshape(),
        relax.transform.DeadCodeElimination(["main"]),
    ]
