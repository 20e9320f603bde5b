#!/usr/bin/env python3
"""Export torchvision CNNs with symbolic dims, as users export them for serving.

A model exported with ``dynamic_axes={"x": {0: "batch"}}`` (TorchScript exporter) or
``dynamic_shapes`` (torch's dynamo exporter) has a symbolic batch; detection and
segmentation users make height and width symbolic too (``--dims batch,height,width``).
These are the models ``onnxc bench --dim batch=1..8:1`` and the batch loop
(``compiler/lowering/batch_loop.py``) are measured on.  Random weights (seeded), BatchNorm
statistics trained-looking (``export_models._trained_like_batchnorm``), opset 17 for the
TorchScript exporter, torch's default for dynamo.  Outputs are named ``{name}_{exporter}
[_hw].onnx``.

torch and torchvision are not dependencies of onnxc; run this from a separate venv::

    /tmp/torchenv/bin/python scripts/export_dynamic.py --out /work/shapes
    /tmp/torchenv/bin/python scripts/export_dynamic.py --out /work/shapes --exporter dynamo \
        --models resnet50 mobilenet_v2 --dims batch,height,width
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

MODELS = ["resnet50", "mobilenet_v2", "googlenet", "densenet121", "efficientnet_b0",
          "inception_v3", "shufflenet_v2_x1_0", "mobilenet_v3_large", "regnet_y_400mf",
          "convnext_tiny", "resnext50_32x4d", "squeezenet1_1", "vgg16",
          "deeplabv3_mobilenet_v3_large", "fcn_resnet50"]
SEGMENTATION = {"deeplabv3_mobilenet_v3_large", "fcn_resnet50"}


def build(name: str, seed: int):
    import torch
    import torchvision

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from export_models import _trained_like_batchnorm

    torch.manual_seed(seed)
    if name in SEGMENTATION:
        net = getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, aux_loss=False)

        class Seg(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]

        net = Seg(net)
    else:
        kw = {"aux_logits": False, "init_weights": True} if name in (
            "googlenet", "inception_v3") else {}
        net = getattr(torchvision.models, name)(weights=None, **kw)
    _trained_like_batchnorm(net, seed)
    size = 299 if name == "inception_v3" else (520 if name in SEGMENTATION else 224)
    return net.eval(), size


def export(name: str, out_dir: str, exporter: str, dims: list[str], seed: int = 0) -> str:
    import torch

    net, size = build(name, seed)
    x = torch.randn(1, 3, size, size)
    suffix = "_hw" if "height" in dims else ""
    path = os.path.join(out_dir, f"{name}_{exporter}{suffix}.onnx")
    axes = {i: d for i, d in zip((0, 2, 3), ("batch", "height", "width")) if d in dims}
    if exporter == "dynamo":
        shapes = {"x": {i: torch.export.Dim(d, min=1 if d == "batch" else 32, max=64 if d
                                            == "batch" else 2048) for i, d in axes.items()}}
        torch.onnx.export(net, (x,), path, dynamo=True, external_data=False,
                          input_names=["x"], output_names=["y"], dynamic_shapes=shapes)
    else:
        torch.onnx.export(net, (x,), path, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"], do_constant_folding=True,
                          dynamic_axes={"x": axes, "y": {0: "batch"}})
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/work/shapes")
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript")
    ap.add_argument("--dims", default="batch",
                    help="comma-separated symbolic dims of the image: batch,height,width")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for name in args.models:
        try:
            print(export(name, args.out, args.exporter, args.dims.split(",")), flush=True)
        except Exception:  # noqa: BLE001 - one model's failure must not stop the others
            traceback.print_exc()
            failed.append(name)
    if failed:
        print("failed:", " ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
