"""Framing: header checks, bounded zstd decompression (bombs), strict msgpack."""

from __future__ import annotations

import os
import resource
import struct
import time

import msgpack
import pytest
import zstandard

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import (
    FRAME_HEADER_BYTES,
    MessageKind,
    decode_frame,
    encode_frame,
    take_bin,
    take_int,
    take_str,
)
from distronet.protocol.limits import Limits

KIND = MessageKind.STEP_PACKET
GiB = 1 << 30


def header(body_len: int, raw_len: int, *, flags: int = 1, version: int = 1, kind: int = 1) -> bytes:
    return struct.pack(">4sBBBBII", b"DNET", version, kind, flags, 0, body_len, raw_len)


def rle_zstd(total: int, content_size: int | None) -> bytes:
    """A hand-made zstd frame of RLE blocks expanding to ``total`` zero bytes (4 bytes per 128 KiB)."""
    if content_size is None:
        head = bytes([0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x38])  # no content size, window 2^17
    else:
        head = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xC0, 0x38]) + struct.pack("<Q", content_size)
    block = 1 << 17
    n = total // block
    mid = struct.pack("<I", 0b010 | (block << 3))[:3] + b"\0"
    last = struct.pack("<I", 0b011 | (block << 3))[:3] + b"\0"
    return head + mid * (n - 1) + last


def reject_code(frame: bytes, **kw: object) -> RejectCode:
    with pytest.raises(Rejected) as info:
        decode_frame(frame, KIND, **kw)  # type: ignore[arg-type]
    return info.value.code


def test_roundtrip_raw_and_compressed() -> None:
    body = {"a": 1, "b": b"\0" * 5000, "c": "text"}
    packed = encode_frame(KIND, body, compress=True)
    assert packed[6] == 1 and len(packed) < 1000
    assert decode_frame(packed, KIND) == body
    raw = encode_frame(KIND, body, compress=False)
    assert raw[6] == 0 and decode_frame(raw, KIND) == body
    incompressible = {"b": os.urandom(512)}
    assert encode_frame(KIND, incompressible, compress=True)[6] == 0  # zstd would not shrink it
    big_noise = {"b": os.urandom(300_000)}  # probed on a sample, sent raw without a full zstd pass
    assert encode_frame(KIND, big_noise, compress=True)[6] == 0
    big_text = {"b": bytes(97 + b % 4 for b in os.urandom(320_000))}  # ~4x, under the ratio cap
    assert encode_frame(KIND, big_text, compress=True)[6] == 1
    assert decode_frame(encode_frame(KIND, big_text, compress=True), KIND) == big_text


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda f: f[:10], RejectCode.TRUNCATED),
        (lambda f: b"", RejectCode.TRUNCATED),
        (lambda f: b"XNET" + f[4:], RejectCode.MALFORMED),
        (lambda f: f[:4] + b"\x02" + f[5:], RejectCode.UNSUPPORTED_VERSION),
        (lambda f: f[:5] + b"\x02" + f[6:], RejectCode.MALFORMED),
        (lambda f: f[:6] + b"\x03" + f[7:], RejectCode.MALFORMED),
        (lambda f: f[:7] + b"\x01" + f[8:], RejectCode.MALFORMED),
        (lambda f: f[:-1], RejectCode.TRUNCATED),
        (lambda f: f + b"\0", RejectCode.MALFORMED),
    ],
)
def test_header_rejections(mutate: object, code: RejectCode) -> None:
    frame = encode_frame(KIND, {"a": b"\0" * 100}, compress=True)
    assert reject_code(mutate(frame)) == code  # type: ignore[operator]


def test_size_limits_checked_before_work() -> None:
    frame = encode_frame(KIND, {"a": b"x" * 2000}, compress=False)
    assert reject_code(frame, limits=Limits(max_frame_bytes=1000)) == RejectCode.TOO_LARGE
    assert (
        reject_code(header(0xFFFFFF00, 10, flags=0), limits=Limits(max_frame_bytes=1000))
        == RejectCode.TOO_LARGE
    )
    small = Limits(max_decompressed_bytes=1000, max_payload_bytes=1000)
    assert reject_code(frame, limits=small) == RejectCode.TOO_LARGE
    raw = msgpack.packb({"a": 1})
    assert reject_code(header(len(raw), len(raw) + 1, flags=0) + raw) == RejectCode.MALFORMED


@pytest.mark.parametrize(
    ("declared_header", "zstd_content_size"),
    [
        (4 * GiB - 1, 4 * GiB),  # honest about its size: refused before decompressing
        (1000, 4 * GiB),  # the zstd frame's own header gives it away
        (1000, None),  # no content size anywhere trusted: the streaming cap stops it
    ],
)
def test_zstd_bomb_is_rejected_fast_with_bounded_memory(
    declared_header: int, zstd_content_size: int | None
) -> None:
    bomb = rle_zstd(4 * GiB, zstd_content_size)  # 128 KiB that expands to 4 GiB
    frame = header(len(bomb), declared_header) + bomb
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    assert reject_code(frame) == RejectCode.DECOMPRESSION_BOMB
    assert time.perf_counter() - t0 < 1.0
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < 64 * 1024


def test_rle_helper_really_is_a_bomb() -> None:
    bomb = rle_zstd(8 << 20, 8 << 20)  # the same construction, small enough to expand
    assert zstandard.ZstdDecompressor().decompress(bomb) == bytes(8 << 20)


def test_zstd_lies_and_garbage() -> None:
    raw = msgpack.packb({"a": b"y" * 300})
    z = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    assert decode_frame(header(len(z), len(raw)) + z, KIND) == {"a": b"y" * 300}
    assert reject_code(header(len(z), len(raw) + 5) + z) == RejectCode.MALFORMED  # sizes disagree
    nosize = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    assert reject_code(header(len(nosize), len(raw) - 1) + nosize) == RejectCode.DECOMPRESSION_BOMB
    assert reject_code(header(len(nosize), len(raw) + 9) + nosize) == RejectCode.TRUNCATED
    assert reject_code(header(5, 5) + b"\0" * 5) == RejectCode.MALFORMED  # not zstd
    cut = z[: len(z) // 2]
    assert reject_code(header(len(cut), len(raw)) + cut) in (RejectCode.TRUNCATED, RejectCode.MALFORMED)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (msgpack.packb([1, 2]), RejectCode.MALFORMED),  # not a map
        (msgpack.packb({1: 2}), RejectCode.MALFORMED),  # int key
        (msgpack.packb({"a": [1]}), RejectCode.MALFORMED),  # arrays not allowed here
        (msgpack.packb({"a": msgpack.ExtType(1, b"x")}), RejectCode.MALFORMED),  # ext type
        (msgpack.packb({"a": 1}) + b"\x01", RejectCode.MALFORMED),  # trailing data
        (msgpack.packb({"a": b"x" * 50})[:-5], RejectCode.TRUNCATED),
        (b"\xc1", RejectCode.MALFORMED),  # never-used msgpack byte
        (b"\x81\xa1a\xa2\xff\xfe", RejectCode.MALFORMED),  # invalid UTF-8 str
        (msgpack.packb({"k" * 40: 1}), RejectCode.MALFORMED),  # long key
        (b"\x91" * 5000 + b"\x80", RejectCode.MALFORMED),  # deep nesting
        (b"\x82\xa1a\x01\xa1a\x02", RejectCode.MALFORMED),  # a key repeats
    ],
)
def test_strict_msgpack(raw: bytes, code: RejectCode) -> None:
    assert reject_code(header(len(raw), len(raw), flags=0) + raw) == code


def test_take_helpers() -> None:
    m = {"i": 5, "b": True, "x": b"abc", "s": "hey"}
    assert take_int(m, "i", 0, 5) == 5
    assert take_bin(m, "x", 3, 3) == b"abc"
    assert take_str(m, "s", 1, 3) == "hey"
    for fn, key, lo, hi in (
        (take_int, "i", 6, 9),
        (take_int, "b", 0, 1),
        (take_int, "missing", 0, 1),
        (take_bin, "s", 0, 9),
        (take_bin, "x", 4, 9),
        (take_str, "x", 0, 9),
    ):
        with pytest.raises(Rejected) as info:
            fn(m, key, lo, hi)  # type: ignore[operator]
        assert info.value.code == RejectCode.MALFORMED


def test_frame_header_is_sixteen_bytes() -> None:
    frame = encode_frame(KIND, {}, compress=False)
    assert len(frame) == FRAME_HEADER_BYTES + 1 and frame[:8] == b"DNET\x01\x01\x00\x00"
