"""compiler/lowering/artifact.py: the blob object written without an assembler, and the
link with GNU gold where TVM's link command takes it."""

from __future__ import annotations

import os
import platform
import subprocess

import numpy as np
import pytest

from compiler.lowering import artifact
from runtime.artifact import BEGIN_SYMBOL, END_SYMBOL, blob_head, read_artifact

pytestmark = pytest.mark.skipif(platform.machine() not in artifact._ELF_MACHINE,
                                reason="the blob object writer covers x86_64 and aarch64")


def _readelf(*args) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True,
                          check=True).stdout


def _sections(path: str) -> dict:
    """{name: (type, flags, size, align)} of the object's sections."""
    out = {}
    for line in _readelf("-S", path).splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) >= 10 and parts[0].startswith("[") and parts[1].startswith("."):
            flags = parts[7] if len(parts) == 11 else ""
            out[parts[1]] = (parts[2], flags, int(parts[5], 16), parts[-1])
    return out


def _symbols(path: str) -> dict:
    """{name: (value, type, bind, section name)} of the blob's two symbols."""
    index = {}
    for line in _readelf("-S", path).splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 2 and parts[0].startswith("[") and parts[0][1:-1].isdigit():
            index[parts[0][1:-1]] = parts[1]
    out = {}
    for line in _readelf("-s", path).splitlines():
        parts = line.split()
        if len(parts) == 8 and parts[7] in (BEGIN_SYMBOL, END_SYMBOL):
            out[parts[7]] = (int(parts[1], 16), parts[3], parts[4], index.get(parts[6]))
    return out


def _assembled(tmp, head: bytes, payload: bytes) -> str:
    with open(os.path.join(tmp, "blob.bin"), "wb") as f:
        f.write(head + payload)
    with open(os.path.join(tmp, "blob.S"), "w") as f:
        f.write(artifact._ASM)
    subprocess.run(["cc", "-c", "blob.S", "-o", "as.o"], cwd=tmp, check=True)
    return os.path.join(tmp, "as.o")


def test_blob_object_matches_the_assembled_one(tmp_path):
    """Same sections (type, flags, size, alignment), same symbols, same section bytes as
    ``cc -c blob.S``; the linker takes it."""
    payload = np.arange(5000, dtype=np.float32).tobytes()
    head = blob_head({"manifest": {"x": 1}}, payload)
    ours = str(tmp_path / "ours.o")
    artifact.write_blob_object(ours, head, payload, artifact._ELF_MACHINE[platform.machine()])
    theirs = _assembled(str(tmp_path), head, payload)
    for name in (".onnxc_blob", ".note.GNU-stack"):
        assert _sections(ours)[name] == _sections(theirs)[name], name
    assert _sections(ours)[".onnxc_blob"][2] == len(head) + len(payload)
    assert _symbols(ours) == _symbols(theirs)
    assert _symbols(ours)[BEGIN_SYMBOL] == (0, "NOTYPE", "GLOBAL", ".onnxc_blob")
    assert _symbols(ours)[END_SYMBOL][0] == len(head) + len(payload)
    dump = [subprocess.run(["objcopy", "-O", "binary", "--only-section=.onnxc_blob", o,
                            str(tmp_path / f"{i}.bin")], check=True) for i, o in
            enumerate((ours, theirs))]
    assert len(dump) == 2
    assert (tmp_path / "0.bin").read_bytes() == (tmp_path / "1.bin").read_bytes() \
        == head + payload
    so = str(tmp_path / "t.so")
    subprocess.run(["cc", "-shared", "-fPIC", ours, "-o", so], check=True)
    assert _symbols(so) and set(_symbols(so)) == {BEGIN_SYMBOL, END_SYMBOL}


@pytest.mark.parametrize("gold", [True, False])
def test_export_reads_back_with_either_linker(gold, tmp_path, monkeypatch):
    """An export through the written object, linked by gold (where TVM's link command takes
    it) or by the default linker, reads back as compiled and runs as onnxruntime does."""
    from tests.conftest import assert_close, compiled, ort_run, zoo, zoo_model

    import runtime

    if gold and not artifact._links_with_gold():
        pytest.skip("no GNU gold here")
    monkeypatch.setattr(artifact, "_links_with_gold", lambda: gold)
    cm = compiled("cnn")
    path = str(tmp_path / "m.so")
    cm.export(path)
    assert (".note.gnu.gold-version" in _sections(path)) == gold
    meta, payload, _ = read_artifact(path)
    assert meta["graph"] == cm.meta["graph"] and bytes(payload) == bytes(cm._payload)
    feeds = zoo.random_inputs(zoo_model("cnn"), seed=4)
    assert_close(runtime.load(path).run(None, feeds), ort_run(zoo_model("cnn"), feeds))


def test_unknown_machine_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ELF machine 3"):
        artifact.write_blob_object(str(tmp_path / "x.o"), b"h", b"p", 3)
