"""compiler/tools/bench.py: the output comparison the benchmarks print as "match", and the workers."""

import numpy as np

from compiler.tools.bench import outputs_match


def test_rounding_of_large_sums_matches():
    # ResNet-50-like logits: up to ~1000, one element near 0 differing by summation order
    ref = np.array([1000.0, -512.5, 0.0007, 3.0], np.float32)
    ours = ref + np.array([1e-3, -8e-4, 9e-4, 0.0], np.float32)
    assert outputs_match(ours, ref)


def test_a_wrong_result_does_not_match():
    ref = np.array([1000.0, -512.5, 0.5, 3.0], np.float32)
    assert not outputs_match(ref * np.float32(1.001), ref)  # 1 on the largest element
    small = np.array([0.5, 0.25, 0.125], np.float32)
    assert not outputs_match(small + np.float32(1e-3), small)


def test_nan_positions_shapes_and_integers():
    ref = np.array([np.nan, 1.0], np.float32)
    assert outputs_match(ref.copy(), ref)
    assert not outputs_match(np.array([1.0, 1.0], np.float32), ref)
    assert not outputs_match(np.zeros((2, 1), np.float32), np.zeros((1, 2), np.float32))
    assert outputs_match(np.array([1, 2]), np.array([1, 2]))
    assert not outputs_match(np.array([1, 2]), np.array([1, 3]))


def test_onnxc_worker_runs_the_threads_it_is_given(tmp_path, monkeypatch):
    """measure(threads=1) timed onnxc at its default thread count (every core) against a
    one-thread onnxruntime: the worker must pass the count on, as it does to onnxruntime."""
    import runtime
    from compiler.tools import bench
    from tests.conftest import compiled

    so = compiled("mlp").export(str(tmp_path / "mlp.so"))
    seen = []
    real_load = runtime.load

    def load(path, options=None):
        seen.append(options.intra_op_num_threads if options is not None else None)
        return real_load(path, options)

    monkeypatch.setattr(runtime, "load", load)
    bench.worker("onnxc", so, 1, 0, "", 1)
    assert seen == [1]
