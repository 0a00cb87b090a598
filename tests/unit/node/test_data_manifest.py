"""Token shards and their manifest: prepare → read → load round trip, integrity and limits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from distronet.node.cli import main
from distronet.node.data import (
    ManifestError,
    ShardIntegrityError,
    load_shard,
    prepare_files,
    read_manifest,
)


def _text(tmp_path: Path) -> list[Path]:
    a = tmp_path / "in" / "a.txt"
    b = tmp_path / "in" / "b.txt"
    a.parent.mkdir()
    a.write_bytes(b"hello world\n" * 100)
    b.write_bytes("caf\u00e9 \u2603\n".encode() * 50)
    return [a, b]


def test_prepare_round_trip(tmp_path: Path) -> None:
    files = _text(tmp_path)
    out = tmp_path / "out"
    manifest = prepare_files(files, out, shard_tokens=500)
    assert manifest.total_tokens == sum(f.stat().st_size for f in files)
    again = read_manifest(out / "manifest.json")
    assert again == manifest
    tokens = np.concatenate([load_shard(again, s, out) for s in again.shards])
    assert tokens.tobytes() == b"".join(f.read_bytes() for f in files)
    assert [s.tokens for s in again.shards[:-1]] == [500] * (len(again.shards) - 1)


def test_cli_prepare_writes_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _text(tmp_path)
    rc = main(
        ["data", "prepare", str(files[0].parent), "--out", str(tmp_path / "o"), "--shard-tokens", "700"]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert doc["version"] == 1 and doc["tokenizer"] == "byte" and doc["dtype"] == "uint8"
    assert {"id", "path", "sha256", "tokens", "bytes"} <= set(doc["shards"][0])
    assert "shards" in capsys.readouterr().out


def test_cli_without_inputs_is_usage_error(tmp_path: Path) -> None:
    assert main(["data", "prepare", "--out", str(tmp_path)]) == 2


def test_changed_byte_is_detected_naming_the_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest = prepare_files(_text(tmp_path), out, shard_tokens=500)
    entry = manifest.shards[1]
    f = out / str(entry.path)
    data = bytearray(f.read_bytes())
    data[7] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(ShardIntegrityError, match=entry.id) as info:
        load_shard(manifest, entry, out)
    assert info.value.shard_id == entry.id and "sha256" in str(info.value)


def test_truncated_shard_is_detected_before_hashing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest = prepare_files(_text(tmp_path), out, shard_tokens=500)
    entry = manifest.shards[0]
    (out / str(entry.path)).write_bytes(b"x" * 10)
    with pytest.raises(ShardIntegrityError, match="10 bytes"):
        load_shard(manifest, entry, out)


def _doc(**shard: object) -> dict[str, object]:
    base: dict[str, object] = {"id": "s0", "path": "s0.bin", "sha256": "0" * 64, "tokens": 4, "bytes": 4}
    base.update(shard)
    return {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": [base]}


@pytest.mark.parametrize(
    "doc",
    [
        _doc(path="../etc/passwd"),
        _doc(path="/abs.bin"),
        _doc(bytes=5),
        _doc(tokens=-1, bytes=-1),
        _doc(sha256="XYZ"),
        _doc(id="../x"),
        _doc(url="http://x/s0.bin"),
        {"version": 2, "tokenizer": "byte", "dtype": "uint8", "shards": []},
        {"version": 1, "tokenizer": "byte", "dtype": "float32", "shards": []},
        [],
    ],
)
def test_bad_manifest_is_refused(tmp_path: Path, doc: object) -> None:
    p = tmp_path / "m.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ManifestError):
        read_manifest(p)


def test_uint16_shards_are_little_endian(tmp_path: Path) -> None:
    import hashlib

    raw = np.array([1, 258, 65535], dtype="<u2").tobytes()
    (tmp_path / "s0.bin").write_bytes(raw)
    doc = _doc(sha256=hashlib.sha256(raw).hexdigest(), tokens=3, bytes=6)
    doc["dtype"] = "uint16"
    (tmp_path / "m.json").write_text(json.dumps(doc))
    m = read_manifest(tmp_path / "m.json")
    assert load_shard(m, m.shards[0], tmp_path).tolist() == [1, 258, 65535]
