"""The fallback rule leaves scalar what TVM 0.27 would vectorise wrongly."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.backend.test.case.node import collect_testcases

import compiler
import targets


@pytest.mark.parametrize("cores", [1, 2])
def test_rotary_half_rotation_right_on_serial_and_parallel_targets(cores):
    # the half rotation selects x[.., v % 8 - 4] when v % 8 >= 4: vectorised under serial
    # outer loops (a 1-core target), lanes 8-15 of each 16-lane vector read garbage
    case = next(c for c in collect_testcases(None) if c.name == "test_rotary_embedding_3d_input")
    inputs, outputs = case.data_sets[0]
    feeds = {i.name: x for i, x in zip(case.model.graph.input, inputs)}
    # the host's own CPU (16 lanes where it has AVX-512, where the bug showed): the
    # artifact must run here
    target = dict(targets.resolve("host").tvm, **{"num-cores": cores})
    cm = compiler.compile(case.model, target=target)
    got = cm.session().run(None, feeds)[0]
    np.testing.assert_allclose(got, outputs[0], rtol=1e-5, atol=1e-5)
