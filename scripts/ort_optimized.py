#!/usr/bin/env python3
"""Write onnxruntime's graph-optimizer output of every model in folders, as its users save
it (``SessionOptions.optimized_model_filepath``), for ``scripts/bench_models.py``.

``ORT_ENABLE_EXTENDED`` (default) writes the com.microsoft fused ops (FusedConv, FusedGemm,
FusedMatMul, Gelu, FastGelu, QuickGelu, SkipLayerNormalization) and the default-domain
SimplifiedLayerNormalization; ``--level all`` adds the com.microsoft.nchwc layout ops, which
onnxruntime documents as tied to the saving machine (onnxc refuses them, saying so).  Prints
each model's contrib op counts.

    python scripts/ort_optimized.py --out /work/ortopt_models /work/real_models /work/vision_models
    python scripts/bench_models.py /work/ortopt_models --rounds 1 --runs 5
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--level", default="extended", choices=["basic", "extended", "all"])
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
             "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
             "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[args.level]
    os.makedirs(args.out, exist_ok=True)
    for d in args.dirs:
        for src in sorted(glob.glob(os.path.join(d, "*.onnx"))):
            dst = os.path.join(args.out, os.path.basename(src))
            so = ort.SessionOptions()
            so.graph_optimization_level = level
            so.optimized_model_filepath = dst
            try:
                ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
            except Exception as e:
                print(f"{os.path.basename(src)}: onnxruntime failed: {str(e).splitlines()[0]}")
                continue
            m = onnx.load(dst, load_external_data=False)
            ops = collections.Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in m.graph.node
                                      if n.domain or not onnx.defs.has(n.op_type))
            print(f"{os.path.basename(src)}: {dict(ops)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
