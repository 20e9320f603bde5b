#!/usr/bin/env python3
"""onnxruntime's quantizer in every format and type it offers, on one float model: quantize,
compile with onnxc, compare with onnxruntime on the same seeded input.

Variants: QDQ u8/s8 per tensor, s8/s8 and u8/u8 per channel, symmetric activations, 16-bit
activations (opset 21, and com.microsoft Q / DQ with ``UseQDQContribOps``), s16/s16, 4-bit
weights (QInt4 per channel, QUInt4 per tensor), QOperator s8/s8 and u8/u8, and
``quantize_dynamic``.  Calibration: two seeded normal inputs.  Prints per variant the
compile seconds, the largest |difference| relative to the largest |reference| and whether
every row's top-1 agrees, or the first line of the failure (quantizer, onnxruntime or
onnxc).  Quantized models are kept under ``--out``.

    python scripts/quant_variants.py /work/real_models/mobilenetv2.onnx
    python scripts/quant_variants.py /work/vision_models/googlenet.onnx qop_s8s8_pc dyn_s8
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_qdq's calibration


def variants() -> dict:
    from onnxruntime.quantization import QuantFormat, QuantType

    qdq, qop = QuantFormat.QDQ, QuantFormat.QOperator
    u8, s8, u16, s16 = QuantType.QUInt8, QuantType.QInt8, QuantType.QUInt16, QuantType.QInt16

    def v(fmt, per_channel, act, weight, **extra):
        return dict(quant_format=fmt, per_channel=per_channel, activation_type=act,
                    weight_type=weight, extra_options=extra or None)
    return {
        "qdq_u8s8_pt": v(qdq, False, u8, s8),
        "qdq_s8s8_pc": v(qdq, True, s8, s8),
        "qdq_u8u8_pc": v(qdq, True, u8, QuantType.QUInt8),
        "qdq_sym_act": v(qdq, True, s8, s8, ActivationSymmetric=True),
        "qdq_u16s8": v(qdq, True, u16, s8),
        "qdq_u16_contrib": v(qdq, True, u16, s8, UseQDQContribOps=True),
        "qdq_s16s16": v(qdq, False, s16, s16),
        "qdq_u8s4": v(qdq, True, u8, QuantType.QInt4),
        "qdq_u8u4_pt": v(qdq, False, u8, QuantType.QUInt4),
        "qop_s8s8_pc": v(qop, True, s8, s8),
        "qop_u8u8_pt": v(qop, False, u8, QuantType.QUInt8),
        "dyn_s8": "dynamic",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a float .onnx with one float input")
    ap.add_argument("only", nargs="*", help="variant names (default: all)")
    ap.add_argument("--out", default="/tmp/onnxc-quant-variants")
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic, quantize_static

    import compiler
    from bench_qdq import calibration

    ort.set_default_logger_severity(3)
    m = onnx.load(args.model, load_external_data=False)
    inp = m.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]

    table = variants()
    os.makedirs(args.out, exist_ok=True)
    tag = os.path.splitext(os.path.basename(args.model))[0]
    feeds = {inp.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    for name in args.only or list(table):
        dst = os.path.join(args.out, f"{tag}_{name}.onnx")
        try:
            if not os.path.exists(dst):
                if table[name] == "dynamic":
                    quantize_dynamic(args.model, dst, weight_type=QuantType.QInt8,
                                     per_channel=True)
                else:
                    quantize_static(args.model, dst, calibration(args.model, 2), **table[name])
            ref = ort.InferenceSession(dst, providers=["CPUExecutionProvider"]).run(
                None, feeds)[0]
        except Exception as e:  # the quantizer or onnxruntime itself
            print(f"{name}: onnxruntime side failed: {str(e).strip().splitlines()[0][:200]}")
            continue
        t0 = time.perf_counter()
        try:
            out = compiler.compile(dst, target="host").session().run(None, feeds)[0]
        except Exception as e:
            print(f"{name}: onnxc FAILED ({type(e).__name__}): "
                  f"{str(e).strip().splitlines()[0][:300]}")
            continue
        rel = float(np.abs(out.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))
        top1 = bool((out.reshape(len(out), -1).argmax(1)
                     == ref.reshape(len(ref), -1).argmax(1)).all())
        print(f"{name}: compile {time.perf_counter() - t0:.0f} s, max rel diff {rel:.2e}, "
              f"same top-1 {top1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
