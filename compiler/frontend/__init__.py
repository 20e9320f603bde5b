"""Front end: ONNX model -> Relax module.

``loader`` (read, check, infer shapes) -> ``fold_onnx`` (evaluate constant shape arithmetic)
-> ``importer`` (every node through the operator ``registry``: TVM's converters, ours in
``converters/``, control flow unrolled by ``control_flow``; narrow float/int types through
``narrow_import`` and ``narrow_types``).
"""
