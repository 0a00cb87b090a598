"""Limits defaults and validation; the layout digest's canonical encoding."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import pytest

from distronet.protocol.errors import ConfigError
from distronet.protocol.layout import LAYOUT_DIGEST_BYTES, layout_canonical_bytes, layout_digest
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

LAYOUT = [("wte.weight", (256, 128), 64), ("ln.bias", (128,), 64), ("scale", (), 1)]


def test_default_limits_fit_a_one_billion_parameter_step() -> None:
    lim = DEFAULT_LIMITS
    assert lim.max_announcement_bytes == 1024
    chunks_1b = 10**9 // (64 * 64)
    assert chunks_1b * 32 <= lim.max_total_coefficients
    assert chunks_1b * 32 * 12 <= lim.max_payload_bytes  # fp32 values + int64 indices
    assert lim.max_chunks_per_tensor >= (128_000 * 2048) // (32 * 32)
    assert lim.max_payload_bytes <= lim.max_decompressed_bytes


def test_limits_are_frozen_and_validated() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_LIMITS.max_k = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_k"):
        Limits(max_k=-1)
    with pytest.raises(ValueError, match="max_payload_bytes"):
        Limits(max_payload_bytes=10, max_decompressed_bytes=5)
    assert Limits(max_step_lag=2, max_step_lead=1).step_in_window(9, 10)
    assert not Limits(max_step_lag=2, max_step_lead=1).step_in_window(7, 10)
    assert not Limits(max_step_lag=2, max_step_lead=1).step_in_window(12, 10)


def test_layout_canonical_encoding_byte_by_byte() -> None:
    enc = layout_canonical_bytes(LAYOUT)
    expect = b"distronet/layout/v1\x00" + struct.pack(">I", 3)
    expect += struct.pack(">H", 10) + b"wte.weight" + struct.pack(">BQQI", 2, 256, 128, 64)
    expect += struct.pack(">H", 7) + b"ln.bias" + struct.pack(">BQI", 1, 128, 64)
    expect += struct.pack(">H", 5) + b"scale" + struct.pack(">BI", 0, 1)
    assert enc == expect
    assert layout_digest(LAYOUT) == hashlib.sha256(expect).digest()
    assert len(layout_digest(LAYOUT)) == LAYOUT_DIGEST_BYTES


def test_layout_digest_depends_on_every_field_and_order() -> None:
    base = layout_digest(LAYOUT)
    variants = [
        LAYOUT[::-1],
        [("wte.weighT", (256, 128), 64), *LAYOUT[1:]],
        [("wte.weight", (128, 256), 64), *LAYOUT[1:]],
        [("wte.weight", (256, 128, 1), 64), *LAYOUT[1:]],
        [("wte.weight", (256, 128), 32), *LAYOUT[1:]],
        LAYOUT[:2],
    ]
    digests = {layout_digest(v) for v in variants}
    assert base not in digests and len(digests) == len(variants)


@pytest.mark.parametrize(
    "entries",
    [
        [("", (1,), 1)],
        [("a", (1,), 1), ("a", (2,), 1)],
        [("a", (0,), 1)],
        [("a", (1,) * 9, 1)],
        [("a", (1 << 25,), 1)],
        [("a", (1 << 24, 1 << 24), 1)],
        [("a", (4,), 0)],
        [("a", (4.0,), 4)],
        [("a", (True,), 4)],
        [("x" * 300, (4,), 4)],
        [("a", (4,))],
    ],
)
def test_layout_rejects_bad_entries(entries: list) -> None:
    with pytest.raises(ConfigError):
        layout_digest(entries)


def test_layout_rejects_too_many_tensors() -> None:
    with pytest.raises(ConfigError, match="number of tensors"):
        layout_digest([(f"t{i}", (1,), 1) for i in range(3)], Limits(max_tensors=2))
