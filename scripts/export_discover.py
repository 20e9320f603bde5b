#!/usr/bin/env python3
"""The discovery set: 62 real PyTorch / transformers / timm exports outside the benchmark
sets, in export_models.py's style, for sweeps that look for what fails or runs slow.

Random weights (seeded), batch 1, static shapes, no hub download (transformers models from
configs written out here; timm entries need ``pip install timm`` in the export venv).  Each
entry of NEW is (builder, exporter): torchvision through torch's dynamo exporter (``_dy``),
transformers and timm mostly through TorchScript.  Large language models are cut to a few
layers (``_4l``, ``_2l``) at their published widths.  The eighth session of 2026-12-04 swept
these (docs/performance.md: R(2+1)D's padded conv channels, XLNet's Einsum, EnCodec's
folding, HiFi-GAN's write-back and MobileViTv2's split came from it)::

    /tmp/torchenv/bin/python scripts/export_discover.py [--out DIR] NAME [NAME ...]
    python scripts/bench_models.py DIR --models NAME --rounds 2 --runs 5 -v
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402

tv = em._torchvision
TS, DY = "torchscript", "dynamo"


def _hf(cls_name, cfg_name, cfg_kw, inputs, outputs, model_module="transformers"):
    def make(seed):
        import transformers

        cfg = getattr(transformers, cfg_name)(**cfg_kw)
        model = getattr(transformers, cls_name)(cfg)
        return model, inputs(seed), outputs
    return make


def _text(names, vocab, seq=em.SEQ):
    return lambda seed: em._seq_inputs(names, vocab, seed, seq=seq)


def _pix(h, w=None):
    return lambda seed: em._pixels(seed, h, w)


def _wave(n=16000):
    def f(seed):
        rng = np.random.default_rng(seed)
        return {"input_values": rng.standard_normal((1, n)).astype(np.float32)}
    return f


def _whisper_full(seed):
    # openai/whisper-tiny full encoder-decoder: 80 x 3000 mel, 32 decoder tokens, 4+4 layers
    d = _hf("WhisperModel", "WhisperConfig", dict(
        vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
        encoder_attention_heads=6, encoder_ffn_dim=1536, decoder_layers=4,
        decoder_attention_heads=6, decoder_ffn_dim=1536, max_source_positions=1500,
        max_target_positions=448, activation_function="gelu", use_cache=False),
        lambda s: None, ["last_hidden_state"])
    model, _, outs = d(seed)
    rng = np.random.default_rng(seed)
    feeds = {"input_features": rng.standard_normal((1, 80, 3000)).astype(np.float32),
             "decoder_input_ids": rng.integers(0, 51865, (1, 32), dtype=np.int64)}
    return model, feeds, ["last_hidden_state", "encoder_last_hidden_state"]


def _t5_full(seed):
    from transformers import T5Config, T5Model

    # t5-small full encoder-decoder (6 + 6 layers), 128 source / 32 target tokens
    cfg = T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                   num_decoder_layers=6, num_heads=8, feed_forward_proj="relu",
                   use_cache=False)
    names = ["input_ids", "attention_mask", "decoder_input_ids"]
    return T5Model(cfg), em._seq_inputs(names, 32128, seed), ["last_hidden_state"]


def _detr(seed):
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    # facebook/detr-resnet-50 (HF ResNet backbone instead of timm), 6+6 layers, 100 queries
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=ResNetConfig(
        out_features=["stage4"]), num_queries=100, d_model=256, encoder_layers=6,
        decoder_layers=6, num_labels=91, use_pretrained_backbone=False)
    return DetrForObjectDetection(cfg), em._pixels(seed, 480, 640), ["logits", "pred_boxes"]


def _timm(name, shape=(1, 3, 224, 224), **kw):
    def make(seed):
        import timm
        import torch

        net = timm.create_model(name, pretrained=False, **kw)

        class Vision(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, pixel_values, return_dict=True):
                return {"logits": self.net(pixel_values)}

        rng = np.random.default_rng(seed)
        return Vision(), {"pixel_values": rng.standard_normal(shape).astype(np.float32)}, \
            ["logits"]
    return make


L4 = 4
NEW = {
    # -- torchvision, dynamo exporter ---------------------------------------------------
    "resnet18_dy": (tv("resnet18"), DY),
    "mobilenet_v3_small_dy": (tv("mobilenet_v3_small"), DY),
    "efficientnet_b3_dy": (tv("efficientnet_b3", (1, 3, 300, 300)), DY),
    "regnet_y_400mf_dy": (tv("regnet_y_400mf"), DY),
    "wide_resnet50_2_dy": (tv("wide_resnet50_2"), DY),
    "alexnet_dy": (tv("alexnet"), DY),
    "shufflenet_v2_x0_5_dy": (tv("shufflenet_v2_x0_5"), DY),
    "convnext_small_dy": (tv("convnext_small"), DY),
    "vit_b_32_dy": (tv("vit_b_32"), DY),
    "swin_t_dy": (tv("swin_t"), DY),
    "mc3_18_dy": (tv("video.mc3_18", (1, 3, 16, 112, 112)), DY),
    "r2plus1d_18_dy": (tv("video.r2plus1d_18", (1, 3, 16, 112, 112)), DY),
    "s3d_dy": (tv("video.s3d", (1, 3, 16, 224, 224)), DY),
    "lraspp_dy": (tv("segmentation.lraspp_mobilenet_v3_large", (1, 3, 520, 520),
                     out="out"), DY),
    "fcn_resnet50_dy": (tv("segmentation.fcn_resnet50", (1, 3, 520, 520), out="out",
                           aux_loss=False), DY),
    # -- transformers, torchscript exporter (opset 17) ------------------------------------
    "roberta_base": (_hf("RobertaModel", "RobertaConfig", dict(
        vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
        pad_token_id=1), _text(["input_ids", "attention_mask"], 50265),
        ["last_hidden_state", "pooler_output"]), TS),
    "albert_base_v2": (_hf("AlbertModel", "AlbertConfig", dict(
        vocab_size=30000, embedding_size=128, hidden_size=768, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=3072, hidden_act="gelu_new",
        type_vocab_size=2), _text(["input_ids", "attention_mask"], 30000),
        ["last_hidden_state", "pooler_output"]), TS),
    "electra_small": (_hf("ElectraModel", "ElectraConfig", dict(
        vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12,
        num_attention_heads=4, intermediate_size=1024), _text(["input_ids", "attention_mask"],
                                                             30522),
        ["last_hidden_state"]), TS),
    "mobilebert": (_hf("MobileBertModel", "MobileBertConfig", dict(
        vocab_size=30522, num_hidden_layers=24), _text(["input_ids", "attention_mask"], 30522),
        ["last_hidden_state", "pooler_output"]), TS),
    "xlm_roberta_4l": (_hf("XLMRobertaModel", "XLMRobertaConfig", dict(
        vocab_size=32000, hidden_size=768, num_hidden_layers=L4, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
        pad_token_id=1), _text(["input_ids", "attention_mask"], 32000),
        ["last_hidden_state"]), TS),
    "opt_125m": (_hf("OPTModel", "OPTConfig", dict(
        vocab_size=50272, hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
        num_attention_heads=12, max_position_embeddings=2048, word_embed_proj_dim=768,
        use_cache=False), _text(["input_ids", "attention_mask"], 50272),
        ["last_hidden_state"]), TS),
    "gpt_neo_125m": (_hf("GPTNeoModel", "GPTNeoConfig", dict(
        vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
        attention_types=[[["global", "local"], 6]], window_size=256, use_cache=False),
        _text(["input_ids", "attention_mask"], 50257), ["last_hidden_state"]), TS),
    "mistral_2l": (_hf("MistralModel", "MistralConfig", dict(
        # Mistral-7B is 4096/14336 (0.9 GB per layer): halved widths, 2 layers, GQA 16/8
        vocab_size=32000, hidden_size=2048, intermediate_size=7168, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=8, sliding_window=4096,
        rope_theta=10000.0, use_cache=False), _text(["input_ids", "attention_mask"], 32000),
        ["last_hidden_state"]), TS),
    "gemma_2l": (_hf("GemmaModel", "GemmaConfig", dict(
        # google/gemma-2b widths, 2 of 18 layers, vocabulary 16000 (file ~1 GB)
        vocab_size=16000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256,
        hidden_activation="gelu_pytorch_tanh", use_cache=False),
        _text(["input_ids", "attention_mask"], 16000), ["last_hidden_state"]), TS),
    "falcon_4l": (_hf("FalconModel", "FalconConfig", dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=L4, num_attention_heads=32,
        num_kv_heads=1, new_decoder_architecture=False, multi_query=True, parallel_attn=True,
        bias=False, alibi=False, use_cache=False),
        _text(["input_ids", "attention_mask"], 32000), ["last_hidden_state"]), TS),
    "beit_base": (_hf("BeitModel", "BeitConfig", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        use_relative_position_bias=True, use_mean_pooling=True, layer_scale_init_value=0.1),
        _pix(224), ["last_hidden_state", "pooler_output"]), TS),
    "data2vec_vision": (_hf("Data2VecVisionModel", "Data2VecVisionConfig", dict(
        hidden_size=768, num_hidden_layers=L4, num_attention_heads=12, intermediate_size=3072,
        use_relative_position_bias=True, use_mean_pooling=True),
        _pix(224), ["last_hidden_state"]), TS),
    "hubert_base": (_hf("HubertModel", "HubertConfig", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        feat_extract_norm="group", conv_bias=False, apply_spec_augment=False),
        _wave(), ["last_hidden_state"]), TS),
    "wavlm_base": (_hf("WavLMModel", "WavLMConfig", dict(
        hidden_size=768, num_hidden_layers=L4, num_attention_heads=12, intermediate_size=3072,
        feat_extract_norm="group", conv_bias=False, apply_spec_augment=False),
        _wave(), ["last_hidden_state"]), TS),
    "whisper_tiny_full": (_whisper_full, TS),
    "t5_small_full": (_t5_full, TS),
    "marian_4l": (_hf("MarianModel", "MarianConfig", dict(
        vocab_size=32000, d_model=512, encoder_layers=L4, decoder_layers=L4,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, activation_function="swish", pad_token_id=31999,
        decoder_start_token_id=31999, use_cache=False),
        _text(["input_ids", "attention_mask", "decoder_input_ids"], 32000),
        ["last_hidden_state"]), TS),
    "detr_resnet50": (_detr, TS),
    # -- dynamo on transformers ---------------------------------------------------------
    "roberta_base_dy": (None, DY),  # filled below
    "mistral_2l_dy": (None, DY),
    "vit_mae_base_dy": (_hf("ViTMAEModel", "ViTMAEConfig", dict(
        hidden_size=768, num_hidden_layers=L4, num_attention_heads=12, intermediate_size=3072,
        mask_ratio=0.0), _pix(224), ["last_hidden_state"]), DY),
    # -- timm ---------------------------------------------------------------------------
    "timm_efficientformer_l1": (_timm("efficientformer_l1"), TS),
    "timm_ghostnet": (_timm("ghostnet_100"), TS),
    "timm_mobilevitv2_100": (_timm("mobilevitv2_100", (1, 3, 256, 256)), TS),
    "timm_repvgg_a2": (_timm("repvgg_a2"), TS),
    "timm_poolformer_s12": (_timm("poolformer_s12"), TS),
    "timm_coatnet_0": (_timm("coatnet_0_rw_224"), TS),
}
NEW["roberta_base_dy"] = (NEW["roberta_base"][0], DY)
NEW["mistral_2l_dy"] = (NEW["mistral_2l"][0], DY)
# torchscript fails on whisper full (aten::diff in the decoder mask): dynamo
NEW["whisper_tiny_full_dy"] = (_whisper_full, DY)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/work/discover/models")
    ap.add_argument("names", nargs="*", help="default: all of NEW")
    a = ap.parse_args(argv)
    a.names = a.names or list(NEW)
    os.makedirs(a.out, exist_ok=True)
    bad = 0
    for name in a.names:
        builder, exporter = NEW[name]
        try:
            em.export(name, a.out, 0, False, exporter, {name: builder})
        except Exception as e:
            bad += 1
            print(f"{name}: export FAILED: {type(e).__name__}: {str(e).strip()[:500]}", flush=True)
            traceback.print_exc(limit=-4)
    return 1 if bad else 0




# -- optional: detection / optical flow (data-dependent shapes, grid_sample) -------------
def _raft_small(seed):
    import torch
    import torchvision

    net = torchvision.models.optical_flow.raft_small(weights=None)

    class Flow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, image1, image2, return_dict=True):
            return {"flow": self.net(image1, image2, num_flow_updates=6)[-1]}

    rng = np.random.default_rng(seed)
    f = lambda: rng.standard_normal((1, 3, 256, 320)).astype(np.float32)  # noqa: E731
    return Flow(), {"image1": f(), "image2": f()}, ["flow"]


def _ssdlite(seed):
    import torch
    import torchvision

    net = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None)

    class Det(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, pixel_values, return_dict=True):
            d = self.net(pixel_values)[0]
            return {"boxes": d["boxes"], "scores": d["scores"], "labels": d["labels"]}

    rng = np.random.default_rng(seed)
    return Det(), {"pixel_values": rng.random((1, 3, 320, 320)).astype(np.float32)}, \
        ["boxes", "scores", "labels"]


NEW["raft_small_dy"] = (_raft_small, DY)
NEW["raft_small"] = (_raft_small, TS)
NEW["ssdlite320_dy"] = (_ssdlite, DY)
NEW["ssdlite320"] = (_ssdlite, TS)

# -- more transformers: unusual attention / op patterns ----------------------------------
def _audio_feats(n_frames, n_mel, name="input_features"):
    def f(seed):
        rng = np.random.default_rng(seed)
        return {name: rng.standard_normal((1, n_frames, n_mel)).astype(np.float32)}
    return f


NEW.update({
    # allenai/longformer-base-4096 widths, 4 of 12 layers, seq 512 (window 128): chunked
    # sliding-window attention (as_strided / diagonal shifts)
    "longformer_4l": (_hf("LongformerModel", "LongformerConfig", dict(
        vocab_size=50265, hidden_size=768, num_hidden_layers=L4, num_attention_heads=12,
        intermediate_size=3072, attention_window=128, max_position_embeddings=4098,
        pad_token_id=1, type_vocab_size=1), _text(["input_ids", "attention_mask"], 50265, 512),
        ["last_hidden_state"]), TS),
    # YituTech/conv-bert-small (hidden 256, 12 layers, head_ratio 2, span conv 9)
    "convbert_small": (_hf("ConvBertModel", "ConvBertConfig", dict(
        vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12,
        num_attention_heads=4, intermediate_size=1024, head_ratio=2, conv_kernel_size=9,
        num_groups=1), _text(["input_ids", "attention_mask"], 30522), ["last_hidden_state"]),
        TS),
    # funnel-transformer/small-base (blocks 4-4-4, d 768): pooled query attention
    "funnel_small": (_hf("FunnelBaseModel", "FunnelConfig", dict(
        vocab_size=30522, block_sizes=[4, 4, 4], d_model=768, n_head=12, d_head=64,
        d_inner=3072), _text(["input_ids", "attention_mask"], 30522), ["last_hidden_state"]),
        TS),
    # caidas/swin2SR-lightweight-x2-64: pixel-shuffle upsampler, 64x64 -> 128x128
    "swin2sr_light": (_hf("Swin2SRForImageSuperResolution", "Swin2SRConfig", dict(
        image_size=64, embed_dim=60, depths=[6, 6, 6, 6], num_heads=[6, 6, 6, 6],
        window_size=8, upscale=2, upsampler="pixelshuffledirect", img_range=1.0,
        resi_connection="1conv"), _pix(64), ["reconstruction"]), TS),
    # facebook/s2t-small-librispeech-asr widths, 4+4 layers: conv1d subsampler, 300 frames
    "speech2text_4l": (None, TS),
    # facebook/encodec_24khz: SEANet conv encoder/decoder, LSTMs, RVQ (1 s of audio)
    "encodec_24k": (None, TS),
})


def _s2t(seed):
    from transformers import Speech2TextConfig, Speech2TextModel

    cfg = Speech2TextConfig(vocab_size=10000, d_model=256, encoder_layers=L4,
                            decoder_layers=L4, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=2048,
                            decoder_ffn_dim=2048, num_conv_layers=2, conv_kernel_sizes=[5, 5],
                            conv_channels=1024, input_feat_per_channel=80, use_cache=False)
    rng = np.random.default_rng(seed)
    feeds = {"input_features": rng.standard_normal((1, 300, 80)).astype(np.float32),
             "attention_mask": np.ones((1, 300), np.int64),
             "decoder_input_ids": rng.integers(0, 10000, (1, 32), dtype=np.int64)}
    return Speech2TextModel(cfg), feeds, ["last_hidden_state"]


def _encodec(seed):
    import torch
    from transformers import EncodecConfig, EncodecModel

    model = EncodecModel(EncodecConfig())

    class Codec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_values, return_dict=True):
            codes = self.m.encode(input_values, bandwidth=6.0).audio_codes
            return {"audio_values": self.m.decode(codes, [None]).audio_values}

    rng = np.random.default_rng(seed)
    return Codec(), {"input_values": (0.1 * rng.standard_normal((1, 1, 24000))).astype(
        np.float32)}, ["audio_values"]


NEW["speech2text_4l"] = (_s2t, TS)
NEW["encodec_24k"] = (_encodec, TS)

NEW.update({
    # google/bit-50: weight-standardised convs (weights normalised in forward), dynamo
    "bit_50_dy": (_hf("BitForImageClassification", "BitConfig", dict(
        layer_type="preactivation", depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048],
        global_padding="SAME", num_labels=1000), _pix(224), ["logits"]), DY),
    # MCG-NJU/videomae-base widths, 4 of 12 layers: Conv3d tubelet embedding (2x16x16),
    # 16 frames 224x224 -> 1568 tokens
    "videomae_4l": (_hf("VideoMAEModel", "VideoMAEConfig", dict(
        hidden_size=768, num_hidden_layers=L4, num_attention_heads=12, intermediate_size=3072,
        num_frames=16, tubelet_size=2, image_size=224, patch_size=16),
        lambda seed: {"pixel_values": np.random.default_rng(seed).standard_normal(
            (1, 16, 3, 224, 224)).astype(np.float32)}, ["last_hidden_state"]), TS),
    # google/mobilenet_v1_1.0_224: TF "same" padding computed in the graph
    "mobilenet_v1_dy": (_hf("MobileNetV1ForImageClassification", "MobileNetV1Config", dict(
        depth_multiplier=1.0, tf_padding=True, hidden_act="relu6", num_labels=1001),
        _pix(224), ["logits"]), DY),
})


def _hifigan(seed):
    import torch
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    # microsoft/speecht5_hifigan: conv1d 80->512, 4 ConvTranspose1d upsamplers (x256),
    # dilated residual conv1d blocks, final conv1d 32->1; 100 mel frames -> 25600 samples
    net = SpeechT5HifiGan(SpeechT5HifiGanConfig())

    class Voc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, spectrogram, return_dict=True):
            return {"waveform": self.net(spectrogram)}

    rng = np.random.default_rng(seed)
    return Voc(), {"spectrogram": rng.standard_normal((1, 100, 80)).astype(np.float32)}, \
        ["waveform"]


NEW["speecht5_hifigan"] = (_hifigan, TS)

NEW.update({
    # facebook/dinov2-small widths, 4 of 12 layers, fed 224 (configured 518: bicubic
    # position-embedding interpolation), layer scale; dynamo
    "dinov2_small_4l_dy": (_hf("Dinov2Model", "Dinov2Config", dict(
        hidden_size=384, num_hidden_layers=L4, num_attention_heads=6, mlp_ratio=4,
        image_size=518, patch_size=14, layerscale_value=1.0), _pix(224),
        ["last_hidden_state", "pooler_output"]), DY),
    # LiheYoung/depth-anything-small: DINOv2-small backbone (4 layers) + DPT head
    "depth_anything_small": (None, TS),
})


def _depth_anything(seed):
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config

    bb = Dinov2Config(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                      image_size=518, patch_size=14, out_features=["stage1", "stage2", "stage3",
                                                                   "stage4"],
                      reshape_hidden_states=False)
    cfg = DepthAnythingConfig(backbone_config=bb, reassemble_hidden_size=384,
                              patch_size=14, neck_hidden_sizes=[48, 96, 192, 384],
                              fusion_hidden_size=64, head_hidden_size=32)
    return DepthAnythingForDepthEstimation(cfg), em._pixels(seed, 252, 336), ["predicted_depth"]


NEW["depth_anything_small"] = (_depth_anything, TS)

NEW.update({
    # xlnet-base-cased widths, 4 of 12 layers: two-stream-free relative attention (einsum,
    # rel_shift reshape trick)
    "xlnet_4l": (_hf("XLNetModel", "XLNetConfig", dict(
        vocab_size=32000, d_model=768, n_layer=L4, n_head=12, d_inner=3072,
        ff_activation="gelu", use_mems_eval=False), _text(["input_ids", "attention_mask"],
                                                        32000), ["last_hidden_state"]), TS),
    # google/bigbird-roberta-base widths, 2 of 12 layers, seq 1024: block-sparse attention
    # (block 64, 3 random blocks: fixed at eval with seed)
    "bigbird_2l": (_hf("BigBirdModel", "BigBirdConfig", dict(
        vocab_size=50358, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
        intermediate_size=3072, attention_type="block_sparse", block_size=64,
        num_random_blocks=3, max_position_embeddings=4096),
        _text(["input_ids", "attention_mask"], 50358, 1024), ["last_hidden_state"]), TS),
    # Salesforce/codegen-350M-mono widths, 4 of 20 layers: GPT-J style interleaved rotary
    # (rotate_every_two: strided slices), parallel attention + MLP
    "codegen_4l": (_hf("CodeGenModel", "CodeGenConfig", dict(
        vocab_size=51200, n_embd=1024, n_layer=L4, n_head=16, rotary_dim=32, n_ctx=2048,
        n_positions=2048, activation_function="gelu_new", use_cache=False),
        _text(["input_ids", "attention_mask"], 51200), ["last_hidden_state"]), TS),
    # state-spaces/mamba-130m widths, 2 of 24 layers, 64 tokens: selective scan (the slow
    # path's Python loop, unrolled by the exporter)
    "mamba_2l": (_hf("MambaModel", "MambaConfig", dict(
        vocab_size=32000, hidden_size=768, state_size=16, num_hidden_layers=2, expand=2,
        conv_kernel=4, use_cache=False), _text(["input_ids"], 32000, 64),
        ["last_hidden_state"]), TS),
})

NEW["xlnet_4l_dy"] = (NEW["xlnet_4l"][0], DY)


if __name__ == "__main__":
    sys.exit(main())
