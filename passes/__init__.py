"""Our Relax graph passes, one per file, and the PassContext that runs them.

The order they run in is the pipeline list in ``compiler/pipeline.py``.
"""

from .context import GraphPass, PassConfigError, PassContext, PassReport
from .eliminate_dead_code import EliminateDeadCode
from .fold_constants import FoldConstants
from .pack_conv_weights import PackConvWeights
from .pack_conv_transpose import PackConvTranspose
from .conv_transpose_as_conv import ConvTransposeAsConv
from .pack_matmul_weights import PackMatmulWeights
from .pack_bf16_matmul import PackBf16Matmul
from .pack_int_matmul import PackIntMatmul
from .pack_int_conv import PackIntConv
from .qdq_data_movement import QdqDataMovement
from .qdq_lookup_table import QdqLookupTable
from .qdq_matmul_integer import QdqMatmulInteger
from .qdq_conv_integer import QdqConvInteger
from .canonicalize_bindings import CanonicalizeBindings
from .convert_layout import ConvertLayout
from .fold_batchnorm import FoldBatchNorm
from .fold_pad_into_conv import FoldPadIntoConv
from .trim_conv_taps import TrimConvTaps
from .split_dilated_conv import SplitDilatedConv
from .fold_transpose_matmul import FoldTransposeMatmul
from .fuse_attention import FuseAttention
from .fuse_gelu import FuseGelu
from .fuse_layer_norm import FuseLayerNorm
from .fuse_rms_norm import FuseRmsNorm
from .place_concat import PlaceConcat
from .seq_major_cache import SeqMajorCache
from .sink_reshape import SinkReshape
from .stable_logsumexp import StableLogSumExp
from .stable_sigmoid import StableSigmoid
from .stable_softmax import StableSoftmax
from .stable_softplus import StableSoftplus
from .stable_variance import StableVariance
from .accumulate_fp32 import AccumulateFp32
from .widen_half import WidenHalf
from .flatten_norm_axes import FlattenNormAxes
from .softmax_last_axis import SoftmaxLastAxis

__all__ = ["PackBf16Matmul", "PackConvWeights", "PackConvTranspose", "ConvTransposeAsConv", "PackMatmulWeights", "PackIntMatmul", "PackIntConv", "QdqDataMovement", "QdqLookupTable", "QdqMatmulInteger", "QdqConvInteger", "PassContext", "PassReport", "GraphPass", "PassConfigError", "FoldConstants",
           "EliminateDeadCode", "FoldBatchNorm", "SplitDilatedConv", "FuseAttention", "FuseGelu", "FuseLayerNorm", "FuseRmsNorm",
           "StableLogSumExp", "StableSigmoid", "StableSoftmax", "StableSoftplus", "StableVariance",
           "AccumulateFp32", "CanonicalizeBindings", "ConvertLayout", "FoldTransposeMatmul",
           "FoldPadIntoConv", "TrimConvTaps", "PlaceConcat", "SeqMajorCache", "SinkReshape",
           "WidenHalf", "FlattenNormAxes", "SoftmaxLastAxis"]
