#!/usr/bin/env python3
"""Generative and dense-prediction exports for the whole-model benchmark (issue #14): the
decoders that carry ConvTranspose and nearest upsampling, which the benchmark sets lacked.

    dcgan_gen            DCGAN generator (nz 100 -> 3 x 64 x 64: five ConvTranspose k4 s2 p1,
                         the last 64 -> 3)
    pix2pix_unet         pix2pix's U-Net 256 generator (8 strided convs down, 7 ConvTranspose
                         k4 s2 p1 up with skip concats, the last 128 -> 3), 256 x 256
    yolov5s_like         a YOLOv5s-style CSP backbone + PAN neck (nn.Upsample nearest x2,
                         concats, SPPF max pools) and three 255-channel heads, 320 x 320
    sd_unet_small        diffusers' UNet2DConditionModel, reduced (blocks 128/256/256, one
                         layer each, cross attention over 77 x 256 tokens), 4 x 32 x 32 latent
    sd_vae_decoder_small diffusers' AutoencoderKL decoder, reduced (blocks 64/128/128),
                         4 x 32 x 32 latent -> 3 x 128 x 128

Random weights (seeded; BatchNorm statistics drawn so activations do not vanish), batch 1,
static shapes, opset 17, TorchScript exporter.  torch (and diffusers for the sd_ models)
run from a separate venv, as for export_models.py::

    /tmp/torchenv/bin/python scripts/export_dense.py [--out /work/dense_models] [NAME ...]
    python scripts/bench_models.py /work/dense_models --rounds 3 --runs 10
"""

from __future__ import annotations

import argparse
import os
import sys


def _bn_stats(m):
    import torch.nn as nn

    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


def _export(m, args, path, inputs, outputs):
    import torch

    torch.onnx.export(m, args, path, dynamo=False, opset_version=17, input_names=inputs,
                      output_names=outputs)


def dcgan_gen(path):
    import torch
    import torch.nn as nn

    nz, ngf, nc = 100, 64, 3
    m = nn.Sequential(
        nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
        nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())
    _export(_bn_stats(m), (torch.randn(1, nz, 1, 1),), path, ["x"], ["y"])


def pix2pix_unet(path):
    import torch
    import torch.nn as nn

    class Down(nn.Module):
        def __init__(s, i, o, norm=True):
            super().__init__()
            s.c = nn.Conv2d(i, o, 4, 2, 1, bias=False)
            s.n = nn.BatchNorm2d(o) if norm else nn.Identity()
            s.a = nn.LeakyReLU(0.2)

        def forward(s, x):
            return s.a(s.n(s.c(x)))

    class Up(nn.Module):
        def __init__(s, i, o):
            super().__init__()
            s.c, s.n, s.a = nn.ConvTranspose2d(i, o, 4, 2, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU()

        def forward(s, x, skip):
            return torch.cat([s.a(s.n(s.c(x))), skip], 1)

    class Pix2Pix(nn.Module):
        def __init__(s):
            super().__init__()
            ch = [64, 128, 256, 512, 512, 512, 512, 512]
            s.downs = nn.ModuleList([Down(3, 64, False)] + [Down(ch[i], ch[i + 1]) for i in range(7)])
            s.ups = nn.ModuleList([Up(512, 512), Up(1024, 512), Up(1024, 512), Up(1024, 512),
                                   Up(1024, 256), Up(512, 128), Up(256, 64)])
            s.last = nn.ConvTranspose2d(128, 3, 4, 2, 1)

        def forward(s, x):
            skips = []
            for d in s.downs:
                x = d(x)
                skips.append(x)
            for u, sk in zip(s.ups, skips[:-1][::-1]):
                x = u(x, sk)
            return torch.tanh(s.last(x))

    _export(_bn_stats(Pix2Pix()), (torch.randn(1, 3, 256, 256),), path, ["x"], ["y"])


def yolov5s_like(path):
    import torch
    import torch.nn as nn

    def cbs(i, o, k=1, s=1, p=None):
        return nn.Sequential(nn.Conv2d(i, o, k, s, k // 2 if p is None else p, bias=False),
                             nn.BatchNorm2d(o), nn.SiLU())

    class C3(nn.Module):
        def __init__(s, i, o, n=1):
            super().__init__()
            h = o // 2
            s.a, s.b, s.c = cbs(i, h), cbs(i, h), cbs(2 * h, o)
            s.m = nn.Sequential(*[nn.Sequential(cbs(h, h), cbs(h, h, 3)) for _ in range(n)])

        def forward(s, x):
            return s.c(torch.cat([s.m(s.a(x)), s.b(x)], 1))

    class SPPF(nn.Module):
        def __init__(s, i, o):
            super().__init__()
            h = i // 2
            s.a, s.b, s.p = cbs(i, h), cbs(4 * h, o), nn.MaxPool2d(5, 1, 2)

        def forward(s, x):
            x = s.a(x)
            y1 = s.p(x)
            y2 = s.p(y1)
            return s.b(torch.cat([x, y1, y2, s.p(y2)], 1))

    class Yolo(nn.Module):
        def __init__(s):
            super().__init__()
            s.b1 = nn.Sequential(cbs(3, 32, 6, 2, 2), cbs(32, 64, 3, 2), C3(64, 64),
                                 cbs(64, 128, 3, 2), C3(128, 128, 2))
            s.b2 = nn.Sequential(cbs(128, 256, 3, 2), C3(256, 256, 3))
            s.b3 = nn.Sequential(cbs(256, 512, 3, 2), C3(512, 512), SPPF(512, 512))
            s.up = nn.Upsample(scale_factor=2, mode="nearest")
            s.h1, s.c1 = cbs(512, 256), C3(512, 256)
            s.h2, s.c2 = cbs(256, 128), C3(256, 128)
            s.d1, s.c3 = cbs(128, 128, 3, 2), C3(256, 256)
            s.d2, s.c4 = cbs(256, 256, 3, 2), C3(512, 512)
            s.out = nn.ModuleList([nn.Conv2d(c, 255, 1) for c in (128, 256, 512)])

        def forward(s, x):
            p3 = s.b1(x)
            p4 = s.b2(p3)
            p5 = s.b3(p4)
            t5 = s.h1(p5)
            n4 = s.c1(torch.cat([s.up(t5), p4], 1))
            t4 = s.h2(n4)
            n3 = s.c2(torch.cat([s.up(t4), p3], 1))
            m4 = s.c3(torch.cat([s.d1(n3), t4], 1))
            m5 = s.c4(torch.cat([s.d2(m4), t5], 1))
            return tuple(o(f) for o, f in zip(s.out, (n3, m4, m5)))

    _export(_bn_stats(Yolo()), (torch.randn(1, 3, 320, 320),), path, ["images"],
            ["p3", "p4", "p5"])


def sd_unet_small(path):
    import torch
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(128, 256, 256),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=256, attention_head_dim=8, norm_num_groups=32).eval()

    class U(torch.nn.Module):
        def __init__(s, u):
            super().__init__()
            s.u = u

        def forward(s, sample, timestep, ehs):
            return s.u(sample, timestep, ehs, return_dict=False)[0]

    args = (torch.randn(1, 4, 32, 32), torch.tensor([500], dtype=torch.int64),
            torch.randn(1, 77, 256))
    _export(U(unet), args, path, ["sample", "timestep", "encoder_hidden_states"], ["out"])


def sd_vae_decoder_small(path):
    import torch
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(64, 128, 128),
                        latent_channels=4, layers_per_block=1, norm_num_groups=32,
                        sample_size=128).eval()

    class D(torch.nn.Module):
        def __init__(s, v):
            super().__init__()
            s.v = v

        def forward(s, z):
            return s.v.decode(z, return_dict=False)[0]

    _export(D(vae), (torch.randn(1, 4, 32, 32),), path, ["latent"], ["image"])


MODELS = {f.__name__: f for f in (dcgan_gen, pix2pix_unet, yolov5s_like, sd_unet_small,
                                   sd_vae_decoder_small)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"default: all of {', '.join(MODELS)}")
    p.add_argument("--out", default="/work/dense_models")
    args = p.parse_args(argv)
    import torch

    os.makedirs(args.out, exist_ok=True)
    failed = []
    for name in args.names or list(MODELS):
        torch.manual_seed(0)
        path = os.path.join(args.out, f"{name}.onnx")
        try:
            MODELS[name](path)
            print(f"{name}: {path}, {os.path.getsize(path) / 2**20:.1f} MiB", flush=True)
        except Exception as e:  # noqa: BLE001 - export each, list the failures
            failed.append(name)
            print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
