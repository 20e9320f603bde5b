#!/usr/bin/env python3
"""Export full-size, randomly initialised HuggingFace models to ONNX for whole-model benchmarks.

The "real exports" benchmark set (``scripts/bench_models.py`` compiles and times them):
published architectures at their published sizes, built from transformers configs written
out below (no hub download), random weights (seeded), batch 1, STATIC input shapes, opset
17, exported with PyTorch's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``,
what most users and older pipelines run) and ``do_constant_folding=True``.

    CNNs        resnet50, mobilenetv2, convnext_tiny, efficientnet_b0, regnet_y_040,
                densenet121 (written out in torch: torchvision does not load here)  (224x224)
    vision      vit_base16, deit_small16, swin_tiny                                  (224x224)
    audio       whisper_base_encoder (80 x 3000 log-mel), wav2vec2_base (16000 samples)
    text        bert_base, gpt2, llama_gqa, t5_small_encoder, distilbert             (seq 128)

BatchNorm layers get trained-looking statistics (see ``_trained_like_batchnorm``): with
transformers' init, deep CNNs' outputs underflow to ~0 and compare equal vacuously.
Text inputs are int64 ``input_ids`` + ``attention_mask`` (+ ``token_type_ids`` for BERT).
Deviations from the published configs, both so that compiler.bench.random_feeds (ints drawn
from [0, 8)) stays in range: BERT's ``type_vocab_size`` is 8 (published: 2; 6 x 768 more
parameters).  Attention uses transformers' default implementation (``sdpa``), which the
TorchScript exporter writes out as MatMul/Softmax.

torch and transformers are not dependencies of onnxc; run this from a separate venv::

    /tmp/torchenv/bin/python scripts/export_models.py [--out /work/real_models] [--models ...]
    /tmp/torchenv/bin/python scripts/export_models.py --check   # onnxruntime vs torch too
    /tmp/torchenv/bin/python scripts/export_models.py --set sweep --exporter dynamo \
        --out /work/sweep_models/dynamo      # new architectures, torch's default exporter

``--exporter dynamo`` uses ``torch.onnx.export(..., dynamo=True, external_data=False)`` at
torch's default opset (18+: LayerNormalization, Gelu, Split, GatherND appear).  ``--set
sweep`` is a second set of architectures outside the benchmark set, at reduced depth (see
``SWEEP``), for correctness sweeps rather than timing.

Each model is exported in its own try/except; the failures are listed at the end (exit 1).
Files over 2 GB would use external data (none of these is: LLaMA-style is ~0.5 GB).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings

import numpy as np

OPSET = 17
SEQ = 128
IMAGE = 224
TWO_GB = 2 * 1024**3


# -- model builders: (model, {input name: example array}, [output names]) ------------------
def _image_inputs(seed):
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((1, 3, IMAGE, IMAGE)).astype(np.float32)}


def _text_inputs(names, vocab, seed, causal=False):
    """input_ids, attention_mask (last 16 positions padded), token_type_ids (two segments)."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, vocab, (1, SEQ), dtype=np.int64)}
    if "attention_mask" in names:
        mask = np.ones((1, SEQ), np.int64)
        mask[:, SEQ - 16:] = 0
        feeds["attention_mask"] = mask
    if "token_type_ids" in names:
        tt = np.zeros((1, SEQ), np.int64)
        tt[:, SEQ // 2:] = 1
        feeds["token_type_ids"] = tt
    return {n: feeds[n] for n in names}


def resnet50(seed):
    from transformers import ResNetConfig, ResNetForImageClassification

    # microsoft/resnet-50
    cfg = ResNetConfig(num_channels=3, embedding_size=64, hidden_sizes=[256, 512, 1024, 2048],
                       depths=[3, 4, 6, 3], layer_type="bottleneck", hidden_act="relu",
                       downsample_in_first_stage=False, num_labels=1000)
    return ResNetForImageClassification(cfg), _image_inputs(seed), ["logits"]


def mobilenetv2(seed):
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # google/mobilenet_v2_1.0_224 (TF-style "same" padding, ReLU6, 1001 classes)
    cfg = MobileNetV2Config(num_channels=3, image_size=IMAGE, depth_multiplier=1.0,
                            depth_divisible_by=8, min_depth=8, expand_ratio=6.0,
                            output_stride=32, first_layer_is_expansion=True,
                            finegrained_output=True, hidden_act="relu6", tf_padding=True,
                            num_labels=1001)
    return MobileNetV2ForImageClassification(cfg), _image_inputs(seed), ["logits"]


def convnext_tiny(seed):
    from transformers import ConvNextConfig, ConvNextForImageClassification

    # facebook/convnext-tiny-224
    cfg = ConvNextConfig(num_channels=3, patch_size=4, num_stages=4,
                         hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3],
                         hidden_act="gelu", layer_scale_init_value=1e-6, num_labels=1000)
    return ConvNextForImageClassification(cfg), _image_inputs(seed), ["logits"]


def efficientnet_b0(seed):
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    # google/efficientnet-b0
    cfg = EfficientNetConfig(num_channels=3, image_size=IMAGE, width_coefficient=1.0,
                             depth_coefficient=1.0, dropout_rate=0.2, hidden_dim=1280,
                             hidden_act="swish", num_labels=1000)
    return EfficientNetForImageClassification(cfg), _image_inputs(seed), ["logits"]


def regnet_y_040(seed):
    from transformers import RegNetConfig, RegNetForImageClassification

    # facebook/regnet-y-040
    cfg = RegNetConfig(num_channels=3, embedding_size=32, hidden_sizes=[128, 192, 512, 1088],
                       depths=[2, 6, 12, 2], groups_width=64, layer_type="y",
                       hidden_act="relu", num_labels=1000)
    return RegNetForImageClassification(cfg), _image_inputs(seed), ["logits"]


def vit_base16(seed):
    from transformers import ViTConfig, ViTForImageClassification

    # google/vit-base-patch16-224: 196 patches + CLS = 197 tokens
    cfg = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, hidden_act="gelu", image_size=IMAGE, patch_size=16,
                    num_channels=3, qkv_bias=True, num_labels=1000)
    return ViTForImageClassification(cfg), _image_inputs(seed), ["logits"]


def deit_small16(seed):
    from transformers import DeiTConfig, DeiTForImageClassification

    # facebook/deit-small-patch16-224 (no distillation token: 197 tokens)
    cfg = DeiTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                     intermediate_size=1536, hidden_act="gelu", image_size=IMAGE, patch_size=16,
                     num_channels=3, qkv_bias=True, num_labels=1000)
    return DeiTForImageClassification(cfg), _image_inputs(seed), ["logits"]


def swin_tiny(seed):
    from transformers import SwinConfig, SwinForImageClassification

    # microsoft/swin-tiny-patch4-window7-224
    cfg = SwinConfig(image_size=IMAGE, patch_size=4, num_channels=3, embed_dim=96,
                     depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
                     mlp_ratio=4.0, qkv_bias=True, hidden_act="gelu", num_labels=1000)
    return SwinForImageClassification(cfg), _image_inputs(seed), ["logits"]


def whisper_base_encoder(seed):
    from transformers import WhisperConfig, WhisperModel

    # openai/whisper-base, encoder only: conv1d stem over 80 x 3000 log-mel -> 1500 frames
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=512, encoder_layers=6,
                        encoder_attention_heads=8, encoder_ffn_dim=2048, decoder_layers=6,
                        decoder_attention_heads=8, decoder_ffn_dim=2048,
                        max_source_positions=1500, max_target_positions=448,
                        activation_function="gelu", use_cache=False)
    encoder = WhisperModel(cfg).get_encoder()
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((1, 80, 3000)).astype(np.float32)
    return encoder, {"input_features": feats}, ["last_hidden_state"]


def wav2vec2_base(seed):
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    # facebook/wav2vec2-base: 7 conv1d feature extractor layers (group norm), 12 layers
    cfg = Wav2Vec2Config(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, hidden_act="gelu", feat_extract_norm="group",
                         feat_extract_activation="gelu", conv_dim=[512] * 7,
                         conv_stride=[5, 2, 2, 2, 2, 2, 2], conv_kernel=[10, 3, 3, 3, 3, 2, 2],
                         conv_bias=False, num_conv_pos_embeddings=128,
                         num_conv_pos_embedding_groups=16, do_stable_layer_norm=False,
                         apply_spec_augment=False)
    rng = np.random.default_rng(seed)
    wave = rng.standard_normal((1, 16000)).astype(np.float32)
    return Wav2Vec2Model(cfg), {"input_values": wave}, ["last_hidden_state"]


def bert_base(seed):
    from transformers import BertConfig, BertModel

    # bert-base-uncased, but type_vocab_size 8 (published 2): see the module docstring
    cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                     max_position_embeddings=512, type_vocab_size=8)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    return BertModel(cfg), _text_inputs(names, 30522, seed), ["last_hidden_state",
                                                              "pooler_output"]


def gpt2(seed):
    from transformers import GPT2Config, GPT2Model

    # gpt2 (124M): 12 layers, 768 hidden, 12 heads; no past key values
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                     activation_function="gelu_new", use_cache=False)
    names = ["input_ids", "attention_mask"]
    return GPT2Model(cfg), _text_inputs(names, 50257, seed), ["last_hidden_state"]


def llama_gqa(seed):
    from transformers import LlamaConfig, LlamaModel

    # LLaMA-style decoder: GQA (16 query heads, 4 kv heads), RoPE, SwiGLU, RMSNorm; no cache
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
                      hidden_act="silu", use_cache=False, tie_word_embeddings=False)
    names = ["input_ids", "attention_mask"]
    return LlamaModel(cfg), _text_inputs(names, 32000, seed), ["last_hidden_state"]


def t5_small_encoder(seed):
    from transformers import T5Config, T5EncoderModel

    # t5-small encoder: 6 layers, d_model 512, 8 heads, relative position buckets
    cfg = T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                   num_heads=8, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, feed_forward_proj="relu",
                   use_cache=False)
    names = ["input_ids", "attention_mask"]
    return T5EncoderModel(cfg), _text_inputs(names, 32128, seed), ["last_hidden_state"]


def distilbert(seed):
    from transformers import DistilBertConfig, DistilBertModel

    # distilbert-base-uncased
    cfg = DistilBertConfig(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                           max_position_embeddings=512, activation="gelu")
    names = ["input_ids", "attention_mask"]
    return DistilBertModel(cfg), _text_inputs(names, 30522, seed), ["last_hidden_state"]


def densenet121(seed):
    """torchvision's densenet121 (growth 32, blocks 6/12/24/16, bn_size 4, 64 initial
    features, 1000 classes), written out here: torchvision's wheel does not load against the
    CPU build of torch in this venv.  Same layers and order, so the same ONNX graph shape:
    BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 per dense layer, concatenation along channels, transitions
    BN-ReLU-Conv1x1-AvgPool2."""
    import torch
    from torch import nn

    def dense_layer(cin, growth=32, bn_size=4):
        return nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, bn_size * growth, 1, bias=False),
                             nn.BatchNorm2d(bn_size * growth), nn.ReLU(),
                             nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False))

    class Block(nn.Module):
        def __init__(self, layers, cin):
            super().__init__()
            self.layers = nn.ModuleList(dense_layer(cin + 32 * i) for i in range(layers))

        def forward(self, x):
            feats = [x]
            for layer in self.layers:
                feats.append(layer(torch.cat(feats, 1)))
            return torch.cat(feats, 1)

    class DenseNet(nn.Module):
        def __init__(self):
            super().__init__()
            mods = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                    nn.MaxPool2d(3, 2, 1)]
            c = 64
            for i, n in enumerate((6, 12, 24, 16)):
                mods.append(Block(n, c))
                c += 32 * n
                if i < 3:
                    mods += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                             nn.AvgPool2d(2, 2)]
                    c //= 2
            mods += [nn.BatchNorm2d(c), nn.ReLU()]
            self.features = nn.Sequential(*mods)
            self.classifier = nn.Linear(c, 1000)

        def forward(self, pixel_values, return_dict=True):
            x = self.features(pixel_values)
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            return {"logits": self.classifier(x)}

    return DenseNet(), _image_inputs(seed), ["logits"]


MODELS = {f.__name__: f for f in (
    resnet50, mobilenetv2, convnext_tiny, efficientnet_b0, regnet_y_040, densenet121,
    vit_base16, deit_small16, swin_tiny,
    whisper_base_encoder, wav2vec2_base,
    bert_base, gpt2, llama_gqa, t5_small_encoder, distilbert)}


# -- the sweep set (``--set sweep``): architectures outside the benchmark set ----------------
# Each exercises op patterns the benchmark set lacks.  Reduced depth (2-4 layers, noted per
# model) so that exports and compiles stay quick; published widths, heads and resolutions.
# The decoders' vocabularies are capped at 32000 (BLOOM 250880, Qwen2 151936): the embedding
# Gather is the same op at any vocabulary, and the full tables would be 0.5-1 GB of file.
SWEEP_LAYERS = 2
SWEEP_VOCAB = 32000


def _seq_inputs(names, vocab, seed, seq=SEQ):
    """input_ids / attention_mask (last 16 padded) / decoder_input_ids of length ``seq``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for n in names:
        if n == "attention_mask":
            mask = np.ones((1, seq), np.int64)
            mask[:, seq - 16:] = 0
            feeds[n] = mask
        elif n == "decoder_input_ids":
            feeds[n] = rng.integers(0, vocab, (1, 32), dtype=np.int64)
        else:
            feeds[n] = rng.integers(0, vocab, (1, seq), dtype=np.int64)
    return feeds


def _pixels(seed, h, w=None):
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((1, 3, h, w or h)).astype(np.float32)}


def deberta_v3_base(seed):
    from transformers import DebertaV2Config, DebertaV2Model

    # microsoft/deberta-v3-base, 2 of 12 layers: disentangled relative-position attention
    # (c2p + p2c, 256 log buckets, shared keys), no token types
    cfg = DebertaV2Config(vocab_size=128100, hidden_size=768, num_hidden_layers=SWEEP_LAYERS,
                          num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                          max_position_embeddings=512, type_vocab_size=0,
                          relative_attention=True, position_buckets=256,
                          norm_rel_ebd="layer_norm", share_att_key=True,
                          pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
                          position_biased_input=False, layer_norm_eps=1e-7)
    names = ["input_ids", "attention_mask"]
    return DebertaV2Model(cfg), _seq_inputs(names, 128100, seed), ["last_hidden_state"]


def bart_base(seed):
    from transformers import BartConfig, BartModel

    # facebook/bart-base, 2 + 2 of 6 + 6 layers: full encoder-decoder (causal self-attention
    # and cross-attention in the decoder), 128 source and 32 target tokens
    cfg = BartConfig(vocab_size=50265, d_model=768, encoder_layers=SWEEP_LAYERS,
                     decoder_layers=SWEEP_LAYERS, encoder_attention_heads=12,
                     decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                     max_position_embeddings=1024, activation_function="gelu", use_cache=False)
    names = ["input_ids", "attention_mask", "decoder_input_ids"]
    return BartModel(cfg), _seq_inputs(names, 50265, seed), ["last_hidden_state",
                                                             "encoder_last_hidden_state"]


def clip_text_b32(seed):
    from transformers import CLIPTextConfig, CLIPTextModel

    # openai/clip-vit-base-patch32 text tower, 2 of 12 layers: causal mask, quick_gelu,
    # pooled output gathered at the argmax token (77 tokens)
    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=512, intermediate_size=2048,
                         num_hidden_layers=SWEEP_LAYERS, num_attention_heads=8,
                         max_position_embeddings=77, hidden_act="quick_gelu")
    names = ["input_ids", "attention_mask"]
    return CLIPTextModel(cfg), _seq_inputs(names, 49408, seed, seq=77), [
        "last_hidden_state", "pooler_output"]


def clip_vision_b32(seed):
    from transformers import CLIPVisionConfig, CLIPVisionModel

    # openai/clip-vit-base-patch32 vision tower, 2 of 12 layers: pre-LayerNorm, 50 tokens
    cfg = CLIPVisionConfig(hidden_size=768, intermediate_size=3072,
                           num_hidden_layers=SWEEP_LAYERS, num_attention_heads=12,
                           image_size=224, patch_size=32, hidden_act="quick_gelu")
    return CLIPVisionModel(cfg), _pixels(seed, 224), ["last_hidden_state", "pooler_output"]


def segformer_b0(seed):
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    # nvidia/segformer-b0-finetuned-ade-512-512 (full depth: B0 is 2-2-2-2): overlapping
    # patch embeddings, spatial-reduction attention, Mix-FFN depthwise conv, bilinear
    # upsampling of every stage in the decode head
    cfg = SegformerConfig(num_labels=150)
    return SegformerForSemanticSegmentation(cfg), _pixels(seed, 512), ["logits"]


def dpt_base(seed):
    from transformers import DPTConfig, DPTForDepthEstimation

    # DPT with a ViT-B/16 backbone at 384 x 384, 4 of 12 layers (each one a reassemble tap):
    # ConvTranspose + Resize (bilinear, align_corners) fusion head
    cfg = DPTConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                    intermediate_size=3072, image_size=384, patch_size=16,
                    backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[96, 192, 384, 768],
                    fusion_hidden_size=256, is_hybrid=False)
    return DPTForDepthEstimation(cfg), _pixels(seed, 384), ["predicted_depth"]


def mobilevit_small(seed):
    from transformers import MobileViTConfig, MobileViTForImageClassification

    # apple/mobilevit-small (full depth, 256 x 256): unfold/fold of patches around
    # transformer blocks, SiLU
    cfg = MobileViTConfig(image_size=256, num_labels=1000)
    return MobileViTForImageClassification(cfg), _pixels(seed, 256), ["logits"]


def levit_128s(seed):
    from transformers import LevitConfig, LevitForImageClassification

    # facebook/levit-128S (full depth, 224): attention biases gathered by offset index,
    # Hardswish, BatchNorm after Linear, subsampling attention
    cfg = LevitConfig(image_size=224, hidden_sizes=[128, 256, 384], num_attention_heads=[4, 6, 8],
                      depths=[2, 3, 4], key_dim=[16, 16, 16], num_labels=1000)
    return LevitForImageClassification(cfg), _pixels(seed, 224), ["logits"]


def swinv2_tiny(seed):
    from transformers import Swinv2Config, Swinv2ForImageClassification

    # microsoft/swinv2-tiny-patch4-window8-256, depths 2-2-2-2 of 2-2-6-2: scaled cosine
    # attention (normalised q, k, clamped logit scale), continuous position bias MLP
    cfg = Swinv2Config(image_size=256, patch_size=4, embed_dim=96, depths=[2, 2, 2, 2],
                       num_heads=[3, 6, 12, 24], window_size=8, num_labels=1000)
    return Swinv2ForImageClassification(cfg), _pixels(seed, 256), ["logits"]


def convnextv2_tiny(seed):
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification

    # facebook/convnextv2-tiny-1k-224, depths 1-1-3-1 of 3-3-9-3: global response
    # normalisation (L2 norm over H, W divided by its channel mean)
    cfg = ConvNextV2Config(hidden_sizes=[96, 192, 384, 768], depths=[1, 1, 3, 1],
                           num_labels=1000)
    return ConvNextV2ForImageClassification(cfg), _pixels(seed, 224), ["logits"]


def qwen2_05b(seed):
    from transformers import Qwen2Config, Qwen2Model

    # Qwen/Qwen2-0.5B widths, 2 of 24 layers: GQA 14 query / 2 kv heads, q/k/v biases,
    # RoPE theta 1e6; the second layer a sliding-window layer (window 64 < 128 tokens)
    cfg = Qwen2Config(vocab_size=SWEEP_VOCAB, hidden_size=896, intermediate_size=4864,
                      num_hidden_layers=SWEEP_LAYERS, num_attention_heads=14,
                      num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=True,
                      sliding_window=64, max_window_layers=1, use_cache=False,
                      tie_word_embeddings=True)
    names = ["input_ids", "attention_mask"]
    return Qwen2Model(cfg), _seq_inputs(names, SWEEP_VOCAB, seed), ["last_hidden_state"]


def phi_15(seed):
    from transformers import PhiConfig, PhiModel

    # microsoft/phi-1_5 widths, 2 of 24 layers: parallel attention + MLP, partial rotary
    # (32 of 64 dims), gelu_new
    cfg = PhiConfig(vocab_size=51200, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=SWEEP_LAYERS, num_attention_heads=32,
                    partial_rotary_factor=0.5, hidden_act="gelu_new",
                    max_position_embeddings=2048, use_cache=False)
    names = ["input_ids", "attention_mask"]
    return PhiModel(cfg), _seq_inputs(names, 51200, seed), ["last_hidden_state"]


def bloom_560m(seed):
    from transformers import BloomConfig, BloomModel

    # bigscience/bloom-560m widths (vocabulary capped), 2 of 24 layers: ALiBi position
    # biases from the attention mask's cumsum, LayerNorm after the embedding
    cfg = BloomConfig(vocab_size=SWEEP_VOCAB, hidden_size=1024, n_layer=SWEEP_LAYERS,
                      n_head=16, use_cache=False)
    names = ["input_ids", "attention_mask"]
    return BloomModel(cfg), _seq_inputs(names, SWEEP_VOCAB, seed), ["last_hidden_state"]


def squeezebert(seed):
    from transformers import SqueezeBertConfig, SqueezeBertModel

    # squeezebert/squeezebert-uncased, 2 of 12 layers: grouped 1-D convolutions for q/k/v
    # and the FFN, channels-first attention
    cfg = SqueezeBertConfig(vocab_size=30522, hidden_size=768,
                            num_hidden_layers=SWEEP_LAYERS, num_attention_heads=12,
                            intermediate_size=3072, q_groups=4, k_groups=4, v_groups=4,
                            post_attention_groups=1, intermediate_groups=4, output_groups=4)
    names = ["input_ids", "attention_mask"]
    return SqueezeBertModel(cfg), _seq_inputs(names, 30522, seed), ["last_hidden_state"]


def ast_audio(seed):
    from transformers import ASTConfig, ASTModel

    # MIT/ast-finetuned-audioset-10-10-0.4593, 2 of 12 layers: overlapping 16 x 16 patches
    # (stride 10) over 1024 frames x 128 mel bins = 1212 + 2 tokens
    cfg = ASTConfig(hidden_size=768, num_hidden_layers=SWEEP_LAYERS, num_attention_heads=12,
                    intermediate_size=3072, patch_size=16, frequency_stride=10,
                    time_stride=10, max_length=1024, num_mel_bins=128)
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((1, 1024, 128)).astype(np.float32)
    return ASTModel(cfg), {"input_values": feats}, ["last_hidden_state", "pooler_output"]


def yolos_tiny(seed):
    from transformers import YolosConfig, YolosForObjectDetection

    # hustvl/yolos-tiny (hidden 192, 3 heads, 100 detection tokens), 4 of 12 layers, fed
    # 512 x 640 against its configured 800 x 1333: position embeddings interpolated
    # (bicubic Resize) at run time, box MLP heads
    cfg = YolosConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                      intermediate_size=768, image_size=[800, 1333], patch_size=16,
                      num_detection_tokens=100, use_mid_position_embeddings=False,
                      num_labels=91)
    return YolosForObjectDetection(cfg), _pixels(seed, 512, 640), ["logits", "pred_boxes"]


def _recurrent_classifier(kind: str, seed: int):
    """A 2-layer torch ``nn.LSTM`` / ``nn.GRU`` (input 128, hidden 256, batch-first,
    100 steps) and a linear head on the last step: the ONNX LSTM / GRU ops, unrolled by
    onnxc (its recurrent weight read at every step)."""
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(128, 256, num_layers=2, batch_first=True)
            self.fc = torch.nn.Linear(256, 10)

        def forward(self, x, return_dict=True):  # _wrap's call, as to transformers
            y, _ = self.rnn(x)
            return {"logits": self.fc(y[:, -1])}

    rng = np.random.default_rng(seed)
    return Classifier(), {"x": rng.standard_normal((1, 100, 128)).astype(np.float32)}, \
        ["logits"]


def lstm_2x256(seed):
    return _recurrent_classifier("LSTM", seed)


def gru_2x256(seed):
    return _recurrent_classifier("GRU", seed)


SWEEP = {f.__name__: f for f in (
    deberta_v3_base, bart_base, clip_text_b32, clip_vision_b32, segformer_b0, dpt_base,
    mobilevit_small, levit_128s, swinv2_tiny, convnextv2_tiny, qwen2_05b, phi_15,
    bloom_560m, squeezebert, ast_audio, yolos_tiny, lstm_2x256, gru_2x256)}

# -- the torchvision set (``--set vision``): full-size CNNs none of our rules were written on ----
# Published architectures at their published sizes (torchvision's builders, random weights;
# needs ``pip install torchvision`` in the export venv).  For timing as well as correctness:
# grouped / channel-shuffle convs, 5x5 and 1x7 / 7x1 kernels, hard-swish, SE blocks, 299x299
# inputs, video 3-D convs, a segmentation head with atrous convs and an upsample.
def _torchvision(builder: str, shape=(1, 3, IMAGE, IMAGE), out="logits", **kw):
    def make(seed):
        import torch
        import torchvision

        fn = torchvision.models
        for part in builder.split("."):  # "video.r3d_18", "segmentation.deeplabv3_..."
            fn = getattr(fn, part)
        extra = {"weights_backbone": None} if builder.startswith("segmentation.") else {}
        net = fn(weights=None, **extra, **kw)

        class Vision(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, pixel_values, return_dict=True):
                y = self.net(pixel_values)
                return {out: y["out"] if isinstance(y, dict) else y}

        rng = np.random.default_rng(seed)
        return Vision(), {"pixel_values": rng.standard_normal(shape).astype(np.float32)}, [out]
    return make


VISION = {
    "shufflenet_v2": _torchvision("shufflenet_v2_x1_0"),
    "squeezenet1_1": _torchvision("squeezenet1_1"),
    "googlenet": _torchvision("googlenet", aux_logits=False, init_weights=True),
    "inception_v3": _torchvision("inception_v3", (1, 3, 299, 299), aux_logits=False,
                                 init_weights=True),
    "mnasnet1_0": _torchvision("mnasnet1_0"),
    "mobilenet_v3_large": _torchvision("mobilenet_v3_large"),
    "resnext50_32x4d": _torchvision("resnext50_32x4d"),
    "efficientnet_v2_s": _torchvision("efficientnet_v2_s"),
    "regnet_x_1_6gf": _torchvision("regnet_x_1_6gf"),
    "vgg16_bn": _torchvision("vgg16_bn"),
    "r3d_18": _torchvision("video.r3d_18", (1, 3, 16, 112, 112)),
    "deeplabv3_mobilenet": _torchvision("segmentation.deeplabv3_mobilenet_v3_large",
                                        (1, 3, 320, 320), out="out", aux_loss=False),
    "maxvit_t": _torchvision("maxvit_t"),
}
SETS = {"bench": MODELS, "sweep": SWEEP, "vision": VISION}


def _trained_like_batchnorm(model, seed: int) -> int:
    """Give every BatchNorm trained-looking statistics; returns how many it changed.

    transformers initialises BatchNorm weights near 0 (normal, std 0.02), so in deep
    random-weight CNNs the activations shrink by ~50x per layer: EfficientNet-B0's final
    features were exactly 0 and MobileNetV2's logits ~1e-25, which makes any output
    comparison pass vacuously.  Scale ~U(0.5, 1.5), shift ~N(0, 0.1), running mean
    ~N(0, 0.1), running var ~U(0.5, 1.5) keep them alive."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    n = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            c = mod.num_features
            with torch.no_grad():
                if mod.weight is not None:
                    mod.weight.copy_(0.5 + torch.rand(c, generator=g))
                    mod.bias.copy_(0.1 * torch.randn(c, generator=g))
                if mod.running_mean is not None:
                    mod.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                    mod.running_var.copy_(0.5 + torch.rand(c, generator=g))
            n += 1
    return n


def _wrap(model, input_names, output_names):
    """Positional inputs -> keyword inputs; the named outputs as a tuple."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(input_names, args)), return_dict=True)
            return tuple(out[k] for k in output_names)

    return Wrapped().eval()


def export(name: str, out_dir: str, seed: int = 0, check: bool = False,
           exporter: str = "torchscript", models: dict = MODELS) -> dict:
    import onnx
    import torch

    torch.manual_seed(seed)
    model, feeds, output_names = models[name](seed)
    model.eval()
    _trained_like_batchnorm(model, seed)
    input_names = list(feeds)
    wrapped = _wrap(model, input_names, output_names)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    params = sum(p.numel() for p in model.parameters())
    path = os.path.join(out_dir, f"{name}.onnx")
    t0 = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            # torch's default exporter, at its default opset, as users call it
            torch.onnx.export(wrapped, args, path, input_names=input_names,
                              output_names=output_names, dynamo=True, external_data=False)
        else:
            torch.onnx.export(wrapped, args, path, input_names=input_names,
                              output_names=output_names, opset_version=OPSET,
                              do_constant_folding=True, dynamo=False)
    export_s = time.perf_counter() - t0
    m = onnx.load(path)
    m.producer_name = f"pytorch {torch.__version__} (scripts/export_models.py {name})"
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    m.doc_string = (f"random-weight {type(model).__name__} ({params} params, seed {seed}), "
                    f"batch 1, static shapes, torch.onnx.export opset {opset} "
                    f"dynamo={exporter == 'dynamo'}")
    big = m.ByteSize() > TWO_GB
    if big:
        onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{name}.onnx.data")
    else:
        onnx.save(m, path)
    onnx.checker.check_model(path)
    size = os.path.getsize(path) + (os.path.getsize(path + ".data") if big else 0)
    ops: dict = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    shapes = {n: list(v.shape) for n, v in feeds.items()}
    print(f"{name}: {path}, {size / 2**20:.1f} MiB, {params / 1e6:.1f}M params, "
          f"{len(m.graph.node)} nodes, export {export_s:.1f}s, inputs {shapes}")
    print("  ops: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), flush=True)
    info = {"model": name, "path": path, "bytes": size, "params": params,
            "nodes": len(m.graph.node), "ops": ops, "inputs": shapes}
    if check:
        info["max_abs_diff_vs_torch"] = _check(path, wrapped, feeds)
    return info


def _check(path, wrapped, feeds):
    import torch

    try:
        import onnxruntime as ort
    except ImportError:
        print("  (onnxruntime not installed here: no check)")
        return None
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    with torch.no_grad():
        want = wrapped(*[torch.from_numpy(v) for v in feeds.values()])
    err = max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want))
    print(f"  onnxruntime vs torch: max abs diff {err:.2e}", flush=True)
    return err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/work/real_models", help="output folder")
    ap.add_argument("--set", default="bench", choices=list(SETS),
                    help="bench: the benchmark set; sweep: architectures outside it; vision: "
                         "torchvision CNNs at full size")
    ap.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"],
                    help="torchscript: dynamo=False, opset 17 (the benchmark set); dynamo: "
                         "torch's default exporter at its default opset")
    ap.add_argument("--models", nargs="*", default=None,
                    choices=list(MODELS) + list(SWEEP) + list(VISION),
                    help="default: all of --set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare with torch via onnxruntime")
    args = ap.parse_args(argv)
    models = SETS[args.set]
    args.models = args.models or list(models)
    unknown = [m for m in args.models if m not in models]
    if unknown:
        ap.error(f"not in --set {args.set}: {' '.join(unknown)}")
    os.makedirs(args.out, exist_ok=True)
    failed = {}
    for name in args.models:
        try:
            export(name, args.out, args.seed, args.check, args.exporter, models)
        except Exception as e:  # keep going: report every model that does not export
            failed[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            print(f"{name}: export FAILED: {failed[name]}", flush=True)
            traceback.print_exc(limit=-3)
    print(f"\n{len(args.models) - len(failed)}/{len(args.models)} exported to {args.out}")
    for name, why in failed.items():
        print(f"  FAILED {name}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
