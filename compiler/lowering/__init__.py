"""Lowering: Relax graph -> TIR kernels -> the graph the runtime calls, and the artifact.

``legalize_*`` give TVM's LegalizeOps our TE computes where TVM's are missing, wrong or
slow; ``provenance`` names each kernel after the ONNX nodes it computes; ``graph``
extracts the kernel calls and plans storage (``inplace``: outputs reusing a dying input);
``artifact`` writes the ``.so``.
"""
