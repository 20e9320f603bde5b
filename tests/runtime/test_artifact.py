"""Loading refuses what it cannot run, with a message saying why, before running it."""

from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np
import pytest

import runtime
from runtime.artifact import MAGIC, ArtifactError, decode_blob, encode_blob, read_artifact
from tests.conftest import zoo, zoo_model


def test_load_runs_and_manifest(cnn_so):
    sess = runtime.load(str(cnn_so))
    m = sess.get_modelmeta()
    assert m["format_version"] == runtime.FORMAT_VERSION
    assert {"onnxc_version", "tvm_version", "target", "inputs", "outputs", "params_sha256",
            "model", "built_at", "built_by"} <= set(m)
    assert m["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert m["target"]["features"] and m["target"]["cpu"]
    sess.run(None, zoo.random_inputs(zoo_model("cnn")))


def test_runtime_does_not_import_compiler(cnn_so, tmp_path):
    import sys

    code = ("import sys, runtime, numpy as np\n"
            f"s = runtime.load({str(cnn_so)!r})\n"
            "s.run(None, {'input': np.zeros((1, 3, 32, 32), np.float32)})\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('compiler', 'passes', "
            "'schedules', 'onnx')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="no such file"):
        runtime.load(str(tmp_path / "nope.so"))


def test_not_elf(tmp_path):
    p = tmp_path / "model.so"
    p.write_text("hello, not a library")
    with pytest.raises(ArtifactError, match="not a shared library"):
        runtime.load(str(p))


def test_empty_file(tmp_path):
    p = tmp_path / "empty.so"
    p.write_bytes(b"")
    with pytest.raises(ArtifactError, match="not a shared library"):
        runtime.load(str(p))


def test_shared_library_that_is_not_ours(tmp_path):
    src = tmp_path / "other.c"
    src.write_text("int answer(void) { return 42; }\n")
    so = tmp_path / "other.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    with pytest.raises(ArtifactError, match="not an onnxc artifact"):
        runtime.load(str(so))


@pytest.mark.parametrize("keep", [0.9, 0.5, 0.1])
def test_truncated(cnn_so, tmp_path, keep):
    data = cnn_so.read_bytes()
    p = tmp_path / "cut.so"
    p.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ArtifactError, match="truncated"):
        runtime.load(str(p))


def _blob_offset(data: bytes) -> int:
    off = data.find(MAGIC)
    assert off > 0
    return off


def test_corrupted_params(cnn_so, tmp_path):
    data = bytearray(cnn_so.read_bytes())
    off = _blob_offset(bytes(data))
    data[off + 4096] ^= 0x40  # a bit in the graph/params region
    p = tmp_path / "flip.so"
    p.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum mismatch.*corrupted"):
        runtime.load(str(p))


def test_newer_format(cnn_so, tmp_path):
    data = bytearray(cnn_so.read_bytes())
    off = _blob_offset(bytes(data))
    struct.pack_into("<I", data, off + 8, runtime.FORMAT_VERSION + 1)
    p = tmp_path / "newer.so"
    p.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"format version 2 is newer than this runtime "
                                            r"reads \(<= 1\)"):
        runtime.load(str(p))


def test_cpu_features_this_host_lacks(tmp_path, monkeypatch):
    """Code for a CPU feature the host lacks would die of SIGILL: refuse it at load.

    The missing feature is fabricated (the host's flags minus one the artifact needs), so
    the test means the same on a host that has every Sapphire Rapids feature (AMX, FP16)
    as on one that has none of them."""
    import compiler
    from runtime import cpu_features

    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}
    cm = compiler.compile(zoo_model("mlp"), target=target)
    feature = "avx512fp16"
    assert feature in cm.report["target"]["features"]
    path = tmp_path / "spr.so"
    cm.export(str(path))
    # every feature the artifact was built for, but one
    flags = {cpu_features.normalize(f) for f in cm.report["target"]["features"]}
    flags.discard(cpu_features.normalize(feature))
    monkeypatch.setattr(cpu_features, "host_flags", lambda *a, **k: set(flags))
    with pytest.raises(ArtifactError, match=rf"features .*{feature}.* this host lacks.*SIGILL"):
        runtime.load(str(path))
    with pytest.raises(ArtifactError, match="SIGILL"):
        cm.session()


def test_other_architecture():
    manifest = {"target": {"arch": "aarch64", "name": "arm", "features": ["neon"]},
                "tvm_version": "0.27.0"}
    with pytest.raises(ArtifactError, match="built for aarch64.*this host is x86_64"):
        runtime.check_compatible(manifest, "m.so")


def test_other_tvm_version():
    import tvm

    manifest = {"target": {"arch": "x86_64", "features": []}, "tvm_version": "0.19.0"}
    with pytest.raises(ArtifactError, match=f"built with TVM 0.19.0.*TVM {tvm.__version__}"):
        runtime.check_compatible(manifest, "m.so")


def test_blob_round_trip_and_refusals():
    meta = {"graph": {"x": [1, 2]}, "manifest": {}}
    payload = np.arange(100, dtype=np.float32).tobytes()
    blob = encode_blob(meta, payload)
    got, view = decode_blob(blob)
    assert got == meta and bytes(view) == payload
    with pytest.raises(ArtifactError, match="truncated or corrupted"):
        decode_blob(blob[:-1])
    with pytest.raises(ArtifactError, match="onnxc magic"):
        decode_blob(b"X" + blob[1:])


def test_read_artifact_without_loading(cnn_so):
    meta, payload, arch = read_artifact(str(cnn_so))
    assert arch == "x86_64"
    assert set(meta) == {"manifest", "graph", "memory_plan"}
    import hashlib

    assert hashlib.sha256(payload).hexdigest() == meta["manifest"]["params_sha256"]


def test_copy_deploys_one_file(cnn_so, tmp_path):
    """The .so alone is the deployment: copy it elsewhere and load it."""
    dst = tmp_path / "elsewhere" / "m.so"
    dst.parent.mkdir()
    shutil.copy(cnn_so, dst)
    sess = runtime.load(str(dst))
    sess.run(None, zoo.random_inputs(zoo_model("cnn")))


def test_encode_blob_names_an_entry_json_cannot_hold():
    with pytest.raises(ArtifactError, match=r"metadata entry meta\.manifest\.model\.graph_name "
                                            r"holds bytes b'nan\\xedodel'"):
        encode_blob({"manifest": {"model": {"graph_name": b"nan\xedodel"}}}, b"")


# -- params are views onto the file mapping ------------------------------------------------

def _mapping_of(address: int) -> list:
    """The /proc/self/maps fields of the mapping that holds ``address``."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields
    raise AssertionError(f"{address:#x} is not mapped")


def _param_pointers(sess) -> dict:
    """{graph tensor id: data pointer of the TVM tensor the kernel calls receive}."""
    tensors, out = sess.graph["tensors"], {}
    for (_, args), call in zip(sess._calls, sess.graph["calls"]):
        for arg, t in zip(args, call["args"]):
            if tensors[t]["storage"] == "param":
                out[t] = arg.data_ptr()
    return out


def test_params_alias_the_read_only_file_mapping(cnn_so):
    import os

    sess = runtime.load(str(cnn_so))
    ptrs = _param_pointers(sess)
    assert ptrs
    for t, ptr in ptrs.items():
        fields = _mapping_of(ptr)
        # a shared, read-only mapping of the artifact file itself: no copy, no anonymous memory
        assert fields[1] == "r--s" and os.path.samefile(fields[-1], cnn_so), fields
        param = sess.graph["params"][sess.graph["tensors"][t]["index"]]
        assert ptr == sess._params.ctypes.data + param["offset"]
        assert ptr % 64 == 0  # what the kernels assume of their buffers
    x = zoo.random_inputs(zoo_model("cnn"))
    from tests.conftest import assert_close, ort_run

    assert_close(sess.run(None, x), ort_run(zoo_model("cnn"), x))


def test_two_sessions_of_one_file_share_the_mapping(cnn_so, tmp_path):
    a, b = runtime.load(str(cnn_so)), runtime.load(str(cnn_so))
    assert _param_pointers(a) == _param_pointers(b)
    # another file (a copy) is another mapping, of its own pages
    copy = tmp_path / "copy.so"
    shutil.copyfile(cnn_so, copy)
    meta, params, _ = read_artifact(str(copy))
    assert params.ctypes.data != a._params.ctypes.data
    assert bytes(params) == bytes(a._params)


def test_in_memory_payload_is_copied_aligned():
    from tests.conftest import compiled

    cm = compiled("cnn")
    sess = cm.session()
    assert sess._params.ctypes.data % 64 == 0
    assert _mapping_of(sess._params.ctypes.data)[1] == "rw-p"  # its own (anonymous) memory


def test_corrupt_param_byte_fails_the_checksum(cnn_so, tmp_path):
    data = bytearray(cnn_so.read_bytes())
    off = _blob_offset(bytes(data))
    _, _, _, meta_len, payload_len, _ = struct.unpack_from("<8sIIQQ32s", data, off)
    payload = off + 64 + meta_len
    assert payload % 4096 == 0 and payload_len > 0  # the params start page-aligned
    data[payload + payload_len // 2] ^= 0x01  # one bit of one weight
    p = tmp_path / "flip_param.so"
    p.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"flip_param\.so: checksum mismatch in the "
                                            r"embedded model .*corrupted, recompile it"):
        runtime.load(str(p))
