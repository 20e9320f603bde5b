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

NEW3 (third sweep, 2026-12-07): 45 more, as users ship them: transformers encoders and
decoders exported by TorchScript with dynamic batch and sequence axes (optimum's recipe;
``onnxc bench M --dim batch=1..8:1 --dim seq=1..512:128``), timm CNN/hybrids at batch 1,
torchvision CNNs with a dynamic batch.  Name them on the command line.
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
        entry = NEW3[name] if name in NEW3 else NEW[name]
        builder, exporter = entry[:2]
        try:
            if exporter in (TSD, DYD):
                _export_axes(name, a.out, builder, entry[2], dynamo=exporter == DYD)
            else:
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


# -- the third sweep (NEW3): symbolic batch / sequence as users ship them ----------------
def _export_axes(name, out_dir, builder, axes, seed=0, dynamo=False):
    """TorchScript export (opset 17) with ``dynamic_axes`` as optimum and most serving
    recipes write them: ``axes`` maps input/output names to {dim index: dim name}.
    ``dynamo``: the same call under torch's default exporter (torch >= 2.9 picks it when
    ``dynamo`` is not given; it turns ``dynamic_axes`` into ``dynamic_shapes``)."""
    import time
    import warnings

    import onnx
    import torch

    torch.manual_seed(seed)
    model, feeds, output_names = builder(seed)
    model.eval()
    em._trained_like_batchnorm(model, seed)
    input_names = list(feeds)
    wrapped = em._wrap(model, input_names, output_names)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    path = os.path.join(out_dir, f"{name}.onnx")
    dyn = {k: v for k, v in axes.items() if k in input_names + output_names}
    t0 = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            # dynamic_axes does not convert for the positional wrapper ("Failed to convert
            # 'dynamic_axes' to 'dynamic_shapes'"): the equivalent dynamic_shapes, one named
            # Dim per axis name shared by the inputs (as that conversion makes them), and a
            # batch of 2 in the example (torch.export specialises a size-1 dim)
            args = tuple(torch.cat([a, a]) if 0 in axes.get(n, {}) else a
                         for n, a in zip(input_names, args))
            named = {}
            for n in input_names:
                for d in axes.get(n, {}).values():
                    named.setdefault(d, torch.export.Dim(d, max=512 if d == "seq" else
                                                         (48000 if d == "samples" else 64)))
            shapes = {"args": tuple({i: named[d] for i, d in axes.get(n, {}).items()}
                                    for n in input_names)}
            torch.onnx.export(wrapped, args, path, input_names=input_names,
                              output_names=output_names, dynamo=True, external_data=False,
                              dynamic_shapes=shapes)
        else:
            torch.onnx.export(wrapped, args, path, input_names=input_names,
                              output_names=output_names, opset_version=em.OPSET,
                              do_constant_folding=True, dynamo=False, dynamic_axes=dyn)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    params = sum(p.numel() for p in model.parameters())
    ops: dict = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print(f"{name}: {path}, {os.path.getsize(path) / 2**20:.1f} MiB, {params / 1e6:.1f}M "
          f"params, {len(m.graph.node)} nodes, export {time.perf_counter() - t0:.1f}s, "
          f"dynamic {dyn}")
    print("  ops: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), flush=True)


_BS = {0: "batch", 1: "seq"}
TEXT_AXES = {"input_ids": _BS, "attention_mask": _BS, "token_type_ids": _BS,
             "last_hidden_state": _BS, "pooler_output": {0: "batch"}}
BATCH_AXES = {"pixel_values": {0: "batch"}, "logits": {0: "batch"}}
BHW = {0: "batch", 2: "height", 3: "width"}
SEG_AXES = {"pixel_values": BHW, "logits": {0: "batch"}}
TSD = "torchscript-dynamic-axes"
DYD = "dynamo-dynamic-axes"
_ids_mask = ["input_ids", "attention_mask"]


def _encoder_of(cls_name, cfg_name, cfg_kw, vocab):
    """The encoder half of an encoder-decoder (BART), as exported for retrieval / embeddings."""
    def make(seed):
        import transformers

        full = getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**cfg_kw))
        return full.get_encoder(), em._seq_inputs(_ids_mask, vocab, seed), \
            ["last_hidden_state"]
    return make


def _tvd(builder, shape=(1, 3, 224, 224)):
    return (tv(builder, shape), TSD, BATCH_AXES)


_DEC = dict(use_cache=False)
NEW3 = {  # the third sweep: symbolic batch/sequence, timm hybrids (docstring above)
    # -- (a) transformers, TorchScript with dynamic batch + sequence (optimum's export) ----
    # microsoft/deberta-v3-small: 6 layers of 768, relative position buckets 256; vocabulary
    # 32000 (published 128100: 540 MB of file)
    "deberta_v3_small_dyn": (_hf("DebertaV2Model", "DebertaV2Config", dict(
        vocab_size=32000, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=3072, relative_attention=True, position_buckets=256,
        norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
        max_relative_positions=-1, position_biased_input=False, type_vocab_size=0),
        _text(_ids_mask, 32000), ["last_hidden_state"]), TSD, TEXT_AXES),
    # sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 x 384): the most shipped embedder
    "minilm_l6_dyn": (_hf("BertModel", "BertConfig", dict(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536), _text(_ids_mask, 30522),
        ["last_hidden_state"]), TSD, TEXT_AXES),
    # microsoft/mpnet-base widths, 6 of 12 layers: relative position bias
    "mpnet_6l_dyn": (_hf("MPNetModel", "MPNetConfig", dict(
        vocab_size=30527, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514),
        _text(_ids_mask, 30527), ["last_hidden_state"]), TSD, TEXT_AXES),
    # squeezebert/squeezebert-uncased: grouped 1-D convs instead of dense layers
    "squeezebert_dyn": (_hf("SqueezeBertModel", "SqueezeBertConfig", dict(
        vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, q_groups=4, k_groups=4, v_groups=4, post_attention_groups=1,
        intermediate_groups=4, output_groups=4), _text(_ids_mask, 30528),
        ["last_hidden_state"]), TSD, TEXT_AXES),
    # almanach/camembert-base widths, 4 of 12 layers
    "camembert_4l_dyn": (_hf("CamembertModel", "CamembertConfig", dict(
        vocab_size=32005, hidden_size=768, num_hidden_layers=L4, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
        pad_token_id=1), _text(_ids_mask, 32005), ["last_hidden_state"]), TSD, TEXT_AXES),
    # nghuyong/ernie-3.0-base-zh widths, 4 of 12 layers
    "ernie_4l_dyn": (_hf("ErnieModel", "ErnieConfig", dict(
        vocab_size=40000, hidden_size=768, num_hidden_layers=L4, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=2048, type_vocab_size=4,
        use_task_id=False), _text(_ids_mask, 40000), ["last_hidden_state"]), TSD, TEXT_AXES),
    # bigscience/bloom-560m widths, 2 of 24 layers: ALiBi
    "bloom_2l_dyn": (_hf("BloomModel", "BloomConfig", dict(
        vocab_size=32000, hidden_size=1024, n_layer=2, n_head=16, **_DEC),
        _text(_ids_mask, 32000), ["last_hidden_state"]), TSD, TEXT_AXES),
    # EleutherAI/gpt-j-6b at 1/4 width (1024, 16 heads), 4 layers: interleaved rotary 64
    "gptj_4l_dyn": (_hf("GPTJModel", "GPTJConfig", dict(
        vocab_size=32000, n_embd=1024, n_layer=L4, n_head=16, rotary_dim=64,
        n_positions=2048, **_DEC), _text(_ids_mask, 32000), ["last_hidden_state"]),
        TSD, TEXT_AXES),
    # EleutherAI/pythia-160m widths, 4 of 12 layers: partial rotary 0.25, parallel residual
    "gpt_neox_4l_dyn": (_hf("GPTNeoXModel", "GPTNeoXConfig", dict(
        vocab_size=50304, hidden_size=768, num_hidden_layers=L4, num_attention_heads=12,
        intermediate_size=3072, rotary_pct=0.25, use_parallel_residual=True, **_DEC),
        _text(_ids_mask, 50304), ["last_hidden_state"]), TSD, TEXT_AXES),
    # Qwen/Qwen2-0.5B widths, 2 of 24 layers: GQA 14/2, qkv bias
    "qwen2_2l_dyn": (_hf("Qwen2Model", "Qwen2Config", dict(
        vocab_size=32000, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
        num_attention_heads=14, num_key_value_heads=2, **_DEC), _text(_ids_mask, 32000),
        ["last_hidden_state"]), TSD, TEXT_AXES),
    # microsoft/phi-1_5 at half width (1024, 16 heads of 64; 2048 is 640 MB for 2 layers),
    # 2 of 24 layers: partial rotary 0.5, parallel block
    "phi_2l_dyn": (_hf("PhiModel", "PhiConfig", dict(
        vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=2,
        num_attention_heads=16, partial_rotary_factor=0.5, **_DEC), _text(_ids_mask, 32000),
        ["last_hidden_state"]), TSD, TEXT_AXES),
    # stabilityai/stablelm-2-1_6b at half width (1024, 16 heads of 64), 2 of 24 layers:
    # partial rotary 0.25
    "stablelm_2l_dyn": (_hf("StableLmModel", "StableLmConfig", dict(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=16, partial_rotary_factor=0.25, **_DEC),
        _text(_ids_mask, 32000), ["last_hidden_state"]), TSD, TEXT_AXES),
    # bigcode/tiny_starcoder_py widths (768, 12 heads, multi-query), 4 of 20 layers
    "gpt_bigcode_4l_dyn": (_hf("GPTBigCodeModel", "GPTBigCodeConfig", dict(
        vocab_size=49152, n_embd=768, n_layer=L4, n_head=12, multi_query=True,
        n_positions=8192, **_DEC), _text(_ids_mask, 49152), ["last_hidden_state"]),
        TSD, TEXT_AXES),
    # TinyLlama/TinyLlama-1.1B at half width (1024, 16 heads of 64, GQA 16/2), 2 of 22
    # layers
    "llama_2l_dyn": (_hf("LlamaModel", "LlamaConfig", dict(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=2, **_DEC), _text(_ids_mask, 32000),
        ["last_hidden_state"]), TSD, TEXT_AXES),
    # t5-small encoder (6 layers, relative position buckets)
    "t5_encoder_dyn": (_hf("T5EncoderModel", "T5Config", dict(
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
        feed_forward_proj="relu", **_DEC), _text(_ids_mask, 32128), ["last_hidden_state"]),
        TSD, TEXT_AXES),
    # facebook/bart-base encoder (6 layers of 768)
    "bart_encoder_dyn": (_encoder_of("BartModel", "BartConfig", dict(
        vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=1,
        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
        decoder_ffn_dim=3072, **_DEC), 50265), TSD, TEXT_AXES),
    # answerdotai/ModernBERT-base widths, 4 of 22 layers: rotary, GeGLU, local/global
    "modernbert_4l_dyn": (_hf("ModernBertModel", "ModernBertConfig", dict(
        vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=L4,
        num_attention_heads=12, global_attn_every_n_layers=3, local_attention=128,
        reference_compile=False), _text(_ids_mask, 50368), ["last_hidden_state"]),
        TSD, TEXT_AXES),
    # nvidia/mit-b0 SegFormer, symbolic batch, height and width (segmentation serving)
    "segformer_b0_dyn": (_hf("SegformerForSemanticSegmentation", "SegformerConfig", dict(
        num_labels=150), _pix(512), ["logits"]), TSD, SEG_AXES),
    # google-bert/bert-base-uncased widths with token_type_ids, 4 of 12 layers (8 token
    # types, published 2, as export_models' BERT: random feeds draw from [0, 8))
    "bert_tt_4l_dyn": (_hf("BertModel", "BertConfig", dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=L4, num_attention_heads=12,
        intermediate_size=3072, type_vocab_size=8),
        lambda seed: {**em._seq_inputs(_ids_mask, 30522, seed),
                      "token_type_ids": np.zeros((1, em.SEQ), np.int64)},
        ["last_hidden_state", "pooler_output"]), TSD, TEXT_AXES),
    # openai/clip-vit-base-patch32 text tower (12 x 512): causal mask, argmax-eos pooling
    "clip_text_dyn": (_hf("CLIPTextModel", "CLIPTextConfig", dict(
        vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=8, max_position_embeddings=77),
        _text(_ids_mask, 49408, 77), ["last_hidden_state", "pooler_output"]), TSD, TEXT_AXES),
    # facebook/wav2vec2-base widths, 4 of 12 layers: conv feature encoder over a symbolic
    # number of samples (1 s = 16000 at the export)
    "wav2vec2_4l_dyn": (_hf("Wav2Vec2Model", "Wav2Vec2Config", dict(
        hidden_size=768, num_hidden_layers=L4, num_attention_heads=12, intermediate_size=3072,
        feat_extract_norm="group", conv_bias=False, apply_spec_augment=False),
        _wave(), ["last_hidden_state"]), TSD,
        {"input_values": {0: "batch", 1: "samples"}, "last_hidden_state": {0: "batch"}}),
    # google/vit-base-patch16-224 widths, 4 of 12 layers, dynamic batch (optimum's
    # image-classification export)
    "vit_4l_dynb": (_hf("ViTModel", "ViTConfig", dict(
        hidden_size=768, num_hidden_layers=L4, num_attention_heads=12, intermediate_size=3072),
        _pix(224), ["last_hidden_state"]), TSD,
        {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}}),
    # -- (b) timm, TorchScript, static batch 1 -------------------------------------------
    "timm_resnest14d": (_timm("resnest14d"), TS),
    "timm_res2net50_14w_8s": (_timm("res2net50_14w_8s"), TS),
    "timm_dla34": (_timm("dla34"), TS),
    "timm_hrnet_w18_small": (_timm("hrnet_w18_small"), TS),
    "timm_cspdarknet53": (_timm("cspdarknet53", (1, 3, 256, 256)), TS),
    "timm_rexnet_100": (_timm("rexnet_100"), TS),
    "timm_pvt_v2_b0": (_timm("pvt_v2_b0"), TS),
    "timm_efficientvit_b0": (_timm("efficientvit_b0"), TS),
    "timm_fastvit_t8": (_timm("fastvit_t8", (1, 3, 256, 256)), TS),
    "timm_edgenext_xx_small": (_timm("edgenext_xx_small", (1, 3, 256, 256)), TS),
    "timm_convmixer_768_32": (_timm("convmixer_768_32"), TS),
    "timm_mixer_b16": (_timm("mixer_b16_224"), TS),
    "timm_gcvit_xxtiny": (_timm("gcvit_xxtiny"), TS),
    "timm_inception_next_tiny": (_timm("inception_next_tiny"), TS),
    "timm_convnextv2_atto": (_timm("convnextv2_atto"), TS),
    "timm_levit_128s": (_timm("levit_128s"), TS),
    "timm_mobilenetv4_conv_small": (_timm("mobilenetv4_conv_small"), TS),
    "timm_hgnetv2_b0": (_timm("hgnetv2_b0"), TS),
    # -- (c) torchvision, TorchScript, dynamic batch ({"pixel_values": {0: "batch"}}) -----
    "mnasnet1_0_dynb": _tvd("mnasnet1_0"),
    "squeezenet1_0_dynb": _tvd("squeezenet1_0"),
    # vgg11_bn: 507 MB of file (its 4096-wide classifier): over the 400 MB cap, left out
    "mobilenet_v3_small_dynb": _tvd("mobilenet_v3_small"),
    "efficientnet_v2_s_dynb": _tvd("efficientnet_v2_s"),
    "regnet_x_400mf_dynb": _tvd("regnet_x_400mf"),
    "maxvit_t_dynb": _tvd("maxvit_t"),
}


# torch's default exporter (dynamo) given dynamic_axes, as a torch >= 2.9 user's plain
# torch.onnx.export(model, args, f, dynamic_axes=...) call runs it
for _name in ("bert_tt_4l_dyn", "minilm_l6_dyn", "llama_2l_dyn", "gpt_neox_4l_dyn",
              "t5_encoder_dyn",
              "vit_4l_dynb", "deberta_v3_small_dyn", "wav2vec2_4l_dyn"):
    NEW3[_name + "_dynamo"] = (NEW3[_name][0], DYD, NEW3[_name][2])
for _name in ("mnasnet1_0_dynb", "efficientnet_v2_s_dynb", "maxvit_t_dynb"):
    NEW3[_name + "_dynamo"] = (NEW3[_name][0], DYD, NEW3[_name][2])


if __name__ == "__main__":
    sys.exit(main())
