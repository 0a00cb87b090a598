"""A node's identity: an Ed25519 key in libp2p's protobuf key format, and its libp2p peer id.

The key file is byte-for-byte what go-libp2p's ``crypto.MarshalPrivateKey`` writes and what
``p2pd -id <file>`` reads, so the key that signs our packets is the key p2pd uses for the node's
libp2p connections: a packet's signer IS its libp2p peer id.

Encodings (protobuf, hand-encoded; every field is written in field order, minimal varints)::

    PrivateKey file   08 01 12 40 <seed: 32 bytes> <public key: 32 bytes>      (68 bytes)
    PublicKey         08 01 12 20 <public key: 32 bytes>                       (36 bytes)
    peer id           00 24 <PublicKey>       identity multihash (code 0x00, length 36; 38 bytes)
    peer id string    base58btc(peer id), always starting with "12D3KooW"

``08 01`` is field 1 (KeyType, varint) = 1 (Ed25519); ``12 nn`` is field 2 (Data, bytes) of
length nn. An Ed25519 peer id embeds its public key, so :func:`verify` needs nothing but the
peer id, the data and the signature.

Errors::

    ConfigError
    └── IdentityError      a key file that is missing, unreadable or not an Ed25519 libp2p key
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from distronet.protocol.errors import ConfigError

__all__ = [
    "PEER_ID_BYTES",
    "SIGNATURE_BYTES",
    "Identity",
    "IdentityError",
    "b58decode",
    "b58encode",
    "is_ed25519_peer_id",
    "peer_id_from_b58",
    "peer_id_to_b58",
    "public_key_from_peer_id",
    "verify",
]

KEY_TYPE_ED25519 = 1
_PRIV_PREFIX = bytes([0x08, KEY_TYPE_ED25519, 0x12, 0x40])  # KeyType=Ed25519, Data: 64 bytes
_PUB_PREFIX = bytes([0x08, KEY_TYPE_ED25519, 0x12, 0x20])  # KeyType=Ed25519, Data: 32 bytes
_PEER_ID_PREFIX = bytes([0x00, 0x24]) + _PUB_PREFIX  # identity multihash of the 36-byte PublicKey
PEER_ID_BYTES = len(_PEER_ID_PREFIX) + 32  # 38
SIGNATURE_BYTES = 64
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}
_MAX_B58_CHARS = 128  # far above the 52 characters of an Ed25519 peer id; bounds decoding cost


class IdentityError(ConfigError):
    """The identity key file is missing, unreadable or not an Ed25519 key in libp2p's format."""


def b58encode(data: bytes) -> str:
    """Base58btc (Bitcoin alphabet) of ``data``; each leading zero byte becomes a leading '1'."""
    zeros = len(data) - len(data.lstrip(b"\0"))
    n = int.from_bytes(data, "big")
    out: list[str] = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58_ALPHABET[r])
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Inverse of :func:`b58encode`. Raises ValueError on a foreign character or over 128 characters."""
    if len(text) > _MAX_B58_CHARS:
        raise ValueError(f"base58 string of {len(text)} characters is over {_MAX_B58_CHARS}")
    n = 0
    for ch in text:
        digit = _B58_INDEX.get(ch)
        if digit is None:
            raise ValueError(f"{ch!r} is not a base58btc character")
        n = n * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * zeros + body


def is_ed25519_peer_id(peer_id: bytes) -> bool:
    """True when ``peer_id`` is an identity-multihash Ed25519 peer id (38 bytes, fixed prefix)."""
    return (
        isinstance(peer_id, bytes) and len(peer_id) == PEER_ID_BYTES and peer_id.startswith(_PEER_ID_PREFIX)
    )


def public_key_from_peer_id(peer_id: bytes) -> Ed25519PublicKey:
    """The Ed25519 public key a peer id embeds. Raises ValueError for any other kind of peer id."""
    if not is_ed25519_peer_id(peer_id):
        raise ValueError("not an identity-multihash Ed25519 peer id")
    return Ed25519PublicKey.from_public_bytes(peer_id[len(_PEER_ID_PREFIX) :])


def peer_id_to_b58(peer_id: bytes) -> str:
    """The base58btc string libp2p prints for a peer id ("12D3KooW..." for Ed25519)."""
    return b58encode(peer_id)


def peer_id_from_b58(text: str) -> bytes:
    """Parse a base58btc Ed25519 peer id. Raises ValueError when it is not one."""
    peer_id = b58decode(text)
    if not is_ed25519_peer_id(peer_id):
        raise ValueError(f"{text[:64]!r} is not an Ed25519 libp2p peer id")
    return peer_id


def verify(peer_id: bytes, data: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``data`` by the key ``peer_id`` embeds.

    Every signed message (packets, announcements, manifests, membership records, state manifests,
    coordinator requests) is checked here, by libsodium (PyNaCl): it releases the GIL while it
    verifies (pyca/cryptography's verify holds it) and takes about half the time. It refuses
    small-order keys and non-canonical encodings that OpenSSL may accept; every node runs this
    same check, so all replicas accept the same messages. Never raises: a peer id that is not
    identity-multihash Ed25519, a signature that is not 64 bytes, or a public key that is not a
    curve point all give False. Cost: one Ed25519 verify (~30-60 µs on one CPU core).
    """
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        return False
    if not is_ed25519_peer_id(peer_id):
        return False
    try:
        crypto_sign_open(signature + data, peer_id[-32:])
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


class Identity:
    """An Ed25519 private key with its libp2p peer id. Immutable; safe to share between tasks."""

    __slots__ = ("_key", "_peer_id", "_public")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        raw = serialization.Encoding.Raw
        self._public = key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
        self._peer_id = _PEER_ID_PREFIX + self._public

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity (OS randomness)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """The identity of a 32-byte Ed25519 seed (deterministic; for tests and key import)."""
        if len(seed) != 32:
            raise IdentityError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_bytes(cls, data: bytes) -> Identity:
        """Parse libp2p's protobuf PrivateKey encoding (the key file's whole content).

        Accepts exactly ``08 01 12 40 <seed> <public>`` and checks that the public half matches
        the seed. Raises IdentityError on anything else (another key type, another length, a
        public half that does not belong to the seed).
        """
        if len(data) != len(_PRIV_PREFIX) + 64 or not data.startswith(_PRIV_PREFIX):
            if len(data) >= 2 and data[0] == 0x08 and data[1] != KEY_TYPE_ED25519:
                raise IdentityError(
                    f"the key file holds a libp2p key of type {data[1]} (0 RSA, 2 Secp256k1, 3 ECDSA); "
                    "distro-node needs an Ed25519 key (type 1): move the file away to generate a new one"
                )
            raise IdentityError(
                f"not an Ed25519 private key in libp2p's protobuf format ({len(data)} bytes; expected 68)"
            )
        body = data[len(_PRIV_PREFIX) :]
        ident = cls.from_seed(body[:32])
        if ident._public != body[32:]:
            raise IdentityError("the key file's public key does not match its private key: file corrupt")
        return ident

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Read a key file written by :meth:`save`, by go-libp2p or by ``p2pd``. Raises IdentityError."""
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
        except OSError as e:
            raise IdentityError(f"cannot read identity file {os.fspath(path)!r}: {e.strerror or e}") from e
        try:
            return cls.from_bytes(data)
        except IdentityError as e:
            raise IdentityError(f"{os.fspath(path)!r}: {e}") from None

    def to_bytes(self) -> bytes:
        """libp2p's protobuf PrivateKey encoding: ``08 01 12 40`` + seed + public key (68 bytes)."""
        seed = self._key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return _PRIV_PREFIX + seed + self._public

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key file atomically with mode 0600 (temp file in the same folder, fsync, rename).

        Overwrites an existing file. Raises IdentityError when the folder is missing or unwritable.
        """
        target = Path(path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError as e:
            raise IdentityError(f"cannot write identity file {os.fspath(path)!r}: {e.strerror or e}") from e
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.to_bytes())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise IdentityError(f"cannot write identity file {os.fspath(path)!r}: {e.strerror or e}") from e
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        return self._public

    @property
    def peer_id(self) -> bytes:
        """The libp2p peer id: identity multihash of the protobuf-encoded public key (38 bytes)."""
        return self._peer_id

    @property
    def peer_id_b58(self) -> str:
        """The peer id as libp2p prints it: base58btc, starting with "12D3KooW"."""
        return b58encode(self._peer_id)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (deterministic, RFC 8032)."""
        return self._key.sign(data)

    def __repr__(self) -> str:
        return f"Identity({self.peer_id_b58})"


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort where the OS cannot open folders)."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
