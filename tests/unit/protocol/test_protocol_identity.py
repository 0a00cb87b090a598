"""Identity: libp2p key file format, peer id derivation, signatures, and the real p2pd agreeing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from distronet.protocol.identity import (
    PEER_ID_BYTES,
    Identity,
    IdentityError,
    b58decode,
    b58encode,
    is_ed25519_peer_id,
    peer_id_from_b58,
    peer_id_to_b58,
    verify,
)

# RFC 8032 §7.1 test 1: seed and public key.
RFC_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC_PUB = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")


def test_key_file_bytes_are_libp2p_protobuf() -> None:
    ident = Identity.from_seed(RFC_SEED)
    assert ident.public_key == RFC_PUB
    assert ident.to_bytes() == bytes([8, 1, 0x12, 64]) + RFC_SEED + RFC_PUB
    assert ident.peer_id == bytes([0, 36, 8, 1, 0x12, 32]) + RFC_PUB
    assert len(ident.peer_id) == PEER_ID_BYTES
    assert ident.peer_id_b58.startswith("12D3KooW")
    assert peer_id_from_b58(ident.peer_id_b58) == ident.peer_id


def test_generate_save_load_roundtrip_with_mode_0600(tmp_path: Path) -> None:
    ident = Identity.generate()
    path = tmp_path / "identity.key"
    ident.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Identity.load(path).peer_id == ident.peer_id
    other = Identity.generate()
    other.save(path)  # overwrite atomically, no temp files left behind
    assert Identity.load(path).peer_id == other.peer_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["identity.key"]


def test_sign_and_verify_from_peer_id_alone() -> None:
    ident = Identity.generate()
    sig = ident.sign(b"hello")
    assert verify(ident.peer_id, b"hello", sig)
    assert not verify(ident.peer_id, b"hellO", sig)
    assert not verify(Identity.generate().peer_id, b"hello", sig)
    assert not verify(ident.peer_id, b"hello", sig[:-1])
    bad = bytearray(sig)
    bad[5] ^= 1
    assert not verify(ident.peer_id, b"hello", bytes(bad))


def test_verify_refuses_peer_ids_that_are_not_identity_ed25519() -> None:
    ident = Identity.generate()
    sig = ident.sign(b"x")
    sha256_style = bytes([0x12, 0x20]) + ident.peer_id[6:]  # an RSA-style sha2-256 multihash
    secp = bytes([0, 37, 8, 2, 0x12, 33]) + b"\2" + ident.public_key  # Secp256k1 key type
    for pid in (sha256_style, secp, ident.peer_id[:-1], ident.peer_id + b"\0", b""):
        assert not is_ed25519_peer_id(pid)
        assert not verify(pid, b"x", sig)
    with pytest.raises(ValueError):
        peer_id_from_b58(b58encode(sha256_style))
    with pytest.raises(ValueError):
        peer_id_from_b58("12D3KooW0OIl")  # characters outside base58btc


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "expected 68"),
        (bytes([8, 0, 0x12, 5]) + b"x" * 5, "type 0"),
        (bytes([8, 1, 0x12, 64]) + RFC_SEED + bytes(32), "does not match"),
        (bytes([8, 1, 0x12, 64]) + RFC_SEED, "expected 68"),
    ],
)
def test_load_rejects_bad_key_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "k"
    path.write_bytes(content)
    with pytest.raises(IdentityError, match=message):
        Identity.load(path)


def test_load_missing_file_and_save_to_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cannot read"):
        Identity.load(tmp_path / "absent")
    with pytest.raises(IdentityError, match="cannot write"):
        Identity.generate().save(tmp_path / "no" / "such" / "dir" / "k")


def test_base58_known_vectors() -> None:
    assert b58encode(b"") == ""
    assert b58encode(b"\0\0\1") == "112"
    assert b58encode(b"hello world") == "StV1DL6CwTryKyV"
    assert b58decode("StV1DL6CwTryKyV") == b"hello world"
    assert b58decode("112") == b"\0\0\1"
    assert peer_id_to_b58(Identity.from_seed(RFC_SEED).peer_id) == b58encode(
        Identity.from_seed(RFC_SEED).peer_id
    )


@pytest.mark.slow
async def test_real_p2pd_reads_the_key_file_and_reports_the_same_peer_id(tmp_path: Path) -> None:
    p2p_mod = pytest.importorskip("hivemind.p2p")
    ident = Identity.generate()
    path = tmp_path / "identity.key"
    ident.save(path)
    p2p = await p2p_mod.P2P.create(identity_path=str(path), auto_nat=False, nat_port_map=False)
    try:
        assert p2p.peer_id.to_base58() == ident.peer_id_b58
        assert p2p.peer_id.to_bytes() == ident.peer_id
    finally:
        await p2p.shutdown()
