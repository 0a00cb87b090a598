"""Issue 17: a few kB of frame must not cost a receiver a big decompression before its
signature is checked, and bytes after a zstd frame are refused."""

from __future__ import annotations

import os
import struct

import msgpack
import pytest
import zstandard

from distronet.protocol import framing
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import FRAME_HEADER_BYTES, MessageKind, decode_frame, encode_frame, zstd_cap

KIND = MessageKind.STEP_PACKET


def frame_of(body: bytes, raw_len: int, flags: int = 1) -> bytes:
    return struct.pack(">4sBBBBII", b"DNET", 1, int(KIND), flags, 0, len(body), raw_len) + body


def code_of(frame: bytes) -> RejectCode:
    with pytest.raises(Rejected) as info:
        decode_frame(frame, KIND)
    return info.value.code


def test_small_frame_declaring_a_big_body_is_refused_before_decompressing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = msgpack.packb({"payload": bytes(32 << 20)})  # a valid map, within max_decompressed_bytes
    body = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
    assert len(body) < 8 * 1024  # the attack: a few kB on the wire

    def never(*_: object, **__: object) -> None:
        raise AssertionError("decompression started before the ratio check")

    monkeypatch.setattr(framing, "_decompressor", never)
    monkeypatch.setattr(framing.zstandard, "ZstdDecompressor", never)
    assert code_of(frame_of(body, len(raw))) == RejectCode.DECOMPRESSION_BOMB


def test_encoder_sends_over_ratio_bodies_raw_and_they_decode() -> None:
    body = {"payload": bytes(1 << 20)}
    frame = encode_frame(KIND, body, compress=True)
    assert frame[6] == 0  # raw: zstd would have expanded past zstd_cap
    assert decode_frame(frame, KIND) == body
    mixed = {"payload": bytes(97 + b % 4 for b in os.urandom(1 << 19))}  # ~4x: under the ratio
    packed = encode_frame(KIND, mixed, compress=True)
    assert packed[6] == 1 and decode_frame(packed, KIND) == mixed
    assert zstd_cap(10) == framing.ZSTD_RATIO_FLOOR and zstd_cap(1 << 20) == 16 << 20


@pytest.mark.parametrize("content_size", [True, False])
@pytest.mark.parametrize("tail", [b"\x00", b"junk!", None])
def test_bytes_after_the_zstd_frame_are_refused(content_size: bool, tail: bytes | None) -> None:
    raw = msgpack.packb({"a": b"y" * 300})
    body = zstandard.ZstdCompressor(write_content_size=content_size).compress(raw)
    extra = body if tail is None else tail  # None: a whole second frame
    assert decode_frame(frame_of(body, len(raw)), KIND) == {"a": b"y" * 300}
    refused = code_of(frame_of(body + extra, len(raw)))
    # without a content size the streaming read runs on into a second frame: past the declared length
    assert refused in (
        (RejectCode.MALFORMED,)
        if content_size or tail
        else (RejectCode.MALFORMED, RejectCode.DECOMPRESSION_BOMB)
    )


def test_header_is_unchanged() -> None:
    assert FRAME_HEADER_BYTES == 16
