"""Tools around the compiler: ``tune`` (tuning jobs over our pipeline's kernels),
``bench`` (latency against onnxruntime) and ``debug`` (first diverging ONNX node)."""
