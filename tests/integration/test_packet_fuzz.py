"""The full packet decoder (open_packet, then decode_payload) against hostile input.

Explicit cases for each rejection the foundation issue names, then a seeded 100,000-case
mutation fuzz (valid sealed packets with byte flips, truncations, extensions, header and field
substitutions, re-signed malicious payloads, random bytes) and a hypothesis test. The rule:
the decoder returns or raises ``Rejected`` with a code; nothing else escapes, nothing hangs,
and a packet it accepts is either the original one or (re-signed cases) a payload whose
indices are in range, unique and ascending and whose values are finite.

Reproduce the fuzz: ``.venv/bin/python -m pytest -q -s tests/integration/test_packet_fuzz.py``
(``DISTRO_FUZZ_CASES`` and ``DISTRO_FUZZ_SEED`` override the count and seed).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import struct
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distronet.kernels.coding import (
    DecodedTensor,
    IndexCoding,
    ValueCoding,
    decode_payload,
    encode_payload,
    encode_tensor,
)
from distronet.kernels.coding_bits import pack_bits
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import MessageKind, decode_frame, encode_frame
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_digest
from distronet.protocol.limits import DEFAULT_LIMITS
from distronet.protocol.packet import StepPacket, open_packet, seal_packet

RUN = "fuzz-run"
# (name, shape, chunk) -> (n_chunks, chunk_numel): 3x4 blocks of 32x32; 8, 4 and 2 runs of 64, 48, 16.
ENTRIES = [("w0", (96, 128), 32), ("w1", (512,), 64), ("w2", (192,), 48), ("w3", (32,), 16)]
LAYOUTS = [(12, 1024), (8, 64), (4, 48), (2, 16)]
DIGEST = layout_digest(ENTRIES)
LIMITS = DEFAULT_LIMITS
ME = Identity.from_seed(b"\1" * 32)
MALLORY = Identity.from_seed(b"\2" * 32)


def full_decode(frame: bytes) -> tuple[StepPacket, list[DecodedTensor]]:
    """The whole receive path of a step packet, as a node runs it."""
    pkt = open_packet(frame, run_id=RUN, layout_digest=DIGEST, limits=LIMITS)
    return pkt, decode_payload(pkt.payload, LAYOUTS, LIMITS).tensors()


def code_of(frame: bytes) -> RejectCode:
    with pytest.raises(Rejected) as info:
        full_decode(frame)
    assert info.value.code in RejectCode
    return info.value.code


def valid_payload(
    rng: np.random.Generator, vc: ValueCoding, ic: IndexCoding, constant: bool = False
) -> bytes:
    tensors = []
    for tid, (n, cn) in enumerate(LAYOUTS):
        if rng.random() < 0.25:
            continue  # a payload may carry any subset
        k = int(rng.choice([1, 2, 4, 8, cn])) if cn <= 64 else int(rng.choice([1, 4, 8, 16]))
        idx = np.sort(np.argsort(rng.random((n, cn)), axis=1)[:, :k], axis=1)
        val = np.ones((n, k), np.float32) if constant else rng.standard_normal((n, k)).astype(np.float32)
        tensors.append(encode_tensor(tid, idx, val, cn, vc, ic)[0])
    return encode_payload(tensors)


def handmade_payload(k: int, idx: list[list[int]], values: list[float]) -> bytes:
    """Tensor 2 (4 chunks of 48) with FIXED indices and FP32 values exactly as given, unchecked.

    The encoder refuses bad indices and values, so this writes the payload by hand, following
    docs/protocol-payload.md: header (version 1, one tensor, one class, codings FP32|FIXED, k),
    then the bit stream (tensor id 2 as a 3-bit unary code, then 6-bit indices, MSB first), then
    the little-endian float32 values.
    """
    head = bytes([1, 1, 1, ValueCoding.FP32 << 4 | IndexCoding.FIXED, k])
    fields = [(3, 0b110)] + [(6, i) for row in idx for i in row]
    bits = pack_bits(np.array([v for _, v in fields]), np.array([w for w, _ in fields]))
    return head + bits + np.array(values, dtype="<f4").tobytes()


# --- explicit cases -----------------------------------------------------------------------------


def test_a_valid_packet_decodes() -> None:
    payload = valid_payload(np.random.default_rng(0), ValueCoding.SIGN1, IndexCoding.ENTROPY)
    pkt, tensors = full_decode(seal_packet(ME, RUN, 3, DIGEST, payload))
    assert pkt.peer_id == ME.peer_id and tensors


def test_bad_signature() -> None:
    frame = seal_packet(
        ME, RUN, 3, DIGEST, valid_payload(np.random.default_rng(1), ValueCoding.FP16, IndexCoding.FIXED)
    )
    body = decode_frame(frame, MessageKind.STEP_PACKET)
    body["sig"] = MALLORY.sign(b"not this")
    assert code_of(encode_frame(MessageKind.STEP_PACKET, body, compress=False)) == RejectCode.BAD_SIGNATURE
    body = decode_frame(frame, MessageKind.STEP_PACKET)
    body["peer"] = MALLORY.peer_id  # claims another sender, keeps ME's signature
    assert code_of(encode_frame(MessageKind.STEP_PACKET, body, compress=False)) == RejectCode.BAD_SIGNATURE


def test_wrong_run_id() -> None:
    assert code_of(seal_packet(ME, "other-run", 3, DIGEST, b"")) == RejectCode.WRONG_RUN


def test_layout_mismatch() -> None:
    assert code_of(seal_packet(ME, RUN, 3, bytes(32), b"")) == RejectCode.LAYOUT_MISMATCH


def test_handmade_payloads_follow_the_wire_format() -> None:
    """Control for the cases below: an honest hand-made payload decodes to what was written."""
    payload = handmade_payload(2, [[0, 47], [1, 2], [3, 4], [5, 6]], [1.0, -2.0] * 4)
    (t,) = full_decode(seal_packet(ME, RUN, 3, DIGEST, payload))[1]
    assert t.tensor_id == 2 and t.idx.tolist() == [[0, 47], [1, 2], [3, 4], [5, 6]]
    assert t.val.tolist() == [[1.0, -2.0]] * 4


def test_index_out_of_range() -> None:
    payload = handmade_payload(2, [[0, 50], [1, 2], [3, 4], [5, 6]], [1.0] * 8)  # 50 >= 48
    assert code_of(seal_packet(ME, RUN, 3, DIGEST, payload)) == RejectCode.INDEX_OUT_OF_RANGE


def test_duplicate_index() -> None:
    payload = handmade_payload(2, [[7, 7], [1, 2], [3, 4], [5, 6]], [1.0] * 8)
    assert code_of(seal_packet(ME, RUN, 3, DIGEST, payload)) == RejectCode.DUPLICATE_INDEX


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_value(bad: float) -> None:
    payload = handmade_payload(2, [[0, 1], [1, 2], [3, 4], [5, 6]], [1.0] * 7 + [bad])
    assert code_of(seal_packet(ME, RUN, 3, DIGEST, payload)) == RejectCode.NON_FINITE_VALUE


def test_declared_sizes_over_their_limits() -> None:
    hdr = struct.Struct(">4sBBBBII")
    assert code_of(hdr.pack(b"DNET", 1, 1, 0, 0, 0xFFFFFFFF, 10) + b"\0" * 10) == RejectCode.TOO_LARGE
    assert (
        code_of(hdr.pack(b"DNET", 1, 1, 1, 0, 10, 0xFFFFFFFF) + b"\0" * 10) == RejectCode.DECOMPRESSION_BOMB
    )
    idx = np.tile(np.arange(8), (8, 1))
    t, _ = encode_tensor(1, idx, np.ones((8, 8), np.float32), 64, ValueCoding.SIGN1, IndexCoding.ENTROPY)
    tight = dataclasses.replace(LIMITS, max_k=4, max_total_coefficients=32)  # the payload declares k = 8
    pkt = open_packet(seal_packet(ME, RUN, 3, DIGEST, encode_payload([t])), run_id=RUN, layout_digest=DIGEST)
    with pytest.raises(Rejected) as info:
        decode_payload(pkt.payload, LAYOUTS, tight)
    assert info.value.code == RejectCode.LIMIT_EXCEEDED


def test_truncated_frame() -> None:
    frame = seal_packet(
        ME, RUN, 3, DIGEST, valid_payload(np.random.default_rng(2), ValueCoding.INT8, IndexCoding.FIXED)
    )
    for cut in (0, 5, 15, 16, len(frame) // 2, len(frame) - 1):
        assert code_of(frame[:cut]) == RejectCode.TRUNCATED


def test_zstd_bomb_rejected_fast() -> None:
    block = 1 << 17
    rle = struct.pack("<I", 0b010 | (block << 3))[:3] + b"\0"
    last = struct.pack("<I", 0b011 | (block << 3))[:3] + b"\0"
    zframe = bytes([0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x38]) + rle * 32767 + last  # 128 KiB -> 4 GiB, no size
    frame = struct.pack(">4sBBBBII", b"DNET", 1, 1, 1, 0, len(zframe), 4096) + zframe
    t0 = time.perf_counter()
    assert code_of(frame) == RejectCode.DECOMPRESSION_BOMB
    assert time.perf_counter() - t0 < 1.0


# --- the seeded mutation fuzz ----------------------------------------------------------------------


def _base_frames(rng: np.random.Generator) -> list[tuple[bytes, StepPacket]]:
    frames = []
    for vc in ValueCoding:
        for ic in IndexCoding:
            for constant in (False, True):
                frame = seal_packet(
                    ME, RUN, int(rng.integers(0, 1000)), DIGEST, valid_payload(rng, vc, ic, constant)
                )
                frames.append((frame, full_decode(frame)[0]))
    assert any(f[6] == 1 for f, _ in frames) and any(f[6] == 0 for f, _ in frames)  # both body forms
    return frames


def _rand_value(r: random.Random) -> Any:
    return r.choice(
        [
            None,
            True,
            -1,
            0,
            2**63,
            2**64 - 1,
            -(2**63),
            1.0,
            1.5,
            float("nan"),
            "",
            "fuzz-run",
            "x" * r.randrange(300),
            b"",
            os.urandom(r.choice([31, 32, 33, 37, 38, 39, 63, 64, 65])),
            [1, 2],
            {"a": 1},
        ]
    )


class Mutator:
    """Seeded mutation operators; each returns (frame, re-signed?)."""

    def __init__(self, seed: int, frames: list[tuple[bytes, StepPacket]]) -> None:
        self.r = random.Random(seed)
        self.frames = frames
        self.bodies = [decode_frame(f, MessageKind.STEP_PACKET) for f, _ in frames]
        self.ops: list[Callable[[bytes, int], tuple[bytes, bool]]] = [
            self.flip_bytes,
            self.flip_bytes,
            self.flip_bit,
            self.truncate,
            self.extend,
            self.splice,
            self.header_field,
            self.substitute_field,
            self.mutate_msgpack,
            self.resign_payload,
            self.resign_payload,
            self.random_bytes,
        ]

    def rand_bytes(self, n: int) -> bytes:
        return self.r.getrandbits(8 * n).to_bytes(n, "little") if n else b""

    def flip_bytes(self, f: bytes, i: int) -> tuple[bytes, bool]:
        b = bytearray(f)
        for _ in range(self.r.randint(1, 8)):
            b[self.r.randrange(len(b))] ^= self.r.randint(1, 255)
        return bytes(b), False

    def flip_bit(self, f: bytes, i: int) -> tuple[bytes, bool]:
        b = bytearray(f)
        b[self.r.randrange(len(b))] ^= 1 << self.r.randrange(8)
        return bytes(b), False

    def truncate(self, f: bytes, i: int) -> tuple[bytes, bool]:
        return f[: self.r.randrange(len(f))], False

    def extend(self, f: bytes, i: int) -> tuple[bytes, bool]:
        return f + self.rand_bytes(self.r.randint(1, 64)), False

    def splice(self, f: bytes, i: int) -> tuple[bytes, bool]:
        a = self.r.randrange(len(f))
        b = min(len(f), a + self.r.randint(0, 32))
        return f[:a] + self.rand_bytes(self.r.randint(0, 32)) + f[b:], False

    def header_field(self, f: bytes, i: int) -> tuple[bytes, bool]:
        off, size = self.r.choice([(4, 1), (5, 1), (6, 1), (7, 1), (8, 4), (12, 4)])
        n = len(f) - 16
        cands = [0, 1, 2, 255, n - 1, n + 1, 2**31, 2**32 - 1, self.r.getrandbits(8 * size)]
        v = self.r.choice(cands) % (1 << (8 * size))
        return f[:off] + v.to_bytes(size, "big") + f[off + size :], False

    def substitute_field(self, f: bytes, i: int) -> tuple[bytes, bool]:
        body = dict(self.bodies[i])
        key = self.r.choice([*body, "extra"])
        if self.r.random() < 0.1:
            body.pop(key, None)
        else:
            body[key] = _rand_value(self.r)
        return encode_frame(MessageKind.STEP_PACKET, body, compress=self.r.random() < 0.5), False

    def mutate_msgpack(self, f: bytes, i: int) -> tuple[bytes, bool]:
        raw = bytearray(msgpack.packb(self.bodies[i]))
        for _ in range(self.r.randint(1, 4)):
            raw[self.r.randrange(len(raw))] = self.r.getrandbits(8)
        if self.r.random() < 0.5:
            z = zstandard.ZstdCompressor(level=1).compress(bytes(raw))
            return struct.pack(">4sBBBBII", b"DNET", 1, 1, 1, 0, len(z), len(raw)) + z, False
        return struct.pack(">4sBBBBII", b"DNET", 1, 1, 0, 0, len(raw), len(raw)) + raw, False

    def resign_payload(self, f: bytes, i: int) -> tuple[bytes, bool]:
        p = bytearray(self.bodies[i]["payload"])
        op = self.r.randrange(5)
        if op == 0 and p:
            for _ in range(self.r.randint(1, 6)):
                p[self.r.randrange(len(p))] ^= 1 << self.r.randrange(8)
        elif op == 1:
            p = p[: self.r.randrange(len(p) + 1)]
        elif op == 2:
            p += self.rand_bytes(self.r.randint(1, 16))
        elif op == 3 and p:
            a = self.r.randrange(len(p))
            p[a : a + self.r.randint(1, 8)] = self.rand_bytes(self.r.randint(0, 8))
        else:
            p = bytearray(
                bytes([1, self.r.randint(0, 6), self.r.randint(0, 3)])
                + self.rand_bytes(self.r.randint(0, 64))
            )
        return seal_packet(MALLORY, RUN, self.r.randrange(1000), DIGEST, bytes(p)), True

    def random_bytes(self, f: bytes, i: int) -> tuple[bytes, bool]:
        n = self.r.randint(0, 300)
        head = f[:16] if self.r.random() < 0.5 else b""
        return head + self.rand_bytes(n), False

    def case(self) -> tuple[bytes, bool, StepPacket]:
        i = self.r.randrange(len(self.frames))
        frame, pkt = self.frames[i]
        mutated, resigned = self.r.choice(self.ops)(frame, i)
        return mutated, resigned, pkt


def _check_accepted(tensors: list[DecodedTensor]) -> None:
    ids = [t.tensor_id for t in tensors]
    assert ids == sorted(set(ids)) and all(0 <= t < len(LAYOUTS) for t in ids)
    for t in tensors:
        n, cn = LAYOUTS[t.tensor_id]
        assert t.idx.ndim == 2 and t.idx.shape[0] == n and t.val.shape == t.idx.shape
        assert t.idx.min() >= 0 and t.idx.max() < cn
        assert (np.diff(t.idx, axis=1) > 0).all()
        assert np.isfinite(t.val).all()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_decoder_survives_100k_mutated_packets() -> None:
    n_cases = int(os.environ.get("DISTRO_FUZZ_CASES", "100000"))
    seed = int(os.environ.get("DISTRO_FUZZ_SEED", "20261129"))
    mut = Mutator(seed, _base_frames(np.random.default_rng(seed)))
    outcomes: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    t_start, cpu_start = time.perf_counter(), time.process_time()
    for case in range(n_cases):
        frame, resigned, original = mut.case()
        t0 = time.perf_counter()
        try:
            pkt, tensors = full_decode(frame)
        except Rejected as e:
            assert isinstance(e.code, RejectCode), f"case {case}: {e!r}"
            outcomes[e.code.name] += 1
        except Exception as e:  # anything but Rejected is a decoder bug
            raise AssertionError(
                f"case {case} (seed {seed}) escaped with {e!r}; frame {frame[:64].hex()}"
            ) from e
        else:
            if resigned:
                _check_accepted(tensors)
            else:  # a mutation that still opens must be the very same packet
                same = (pkt.run_id, pkt.step, pkt.peer_id, pkt.layout_digest, pkt.payload)
                assert same == (
                    original.run_id,
                    original.step,
                    original.peer_id,
                    original.layout_digest,
                    original.payload,
                ), case
            outcomes["accepted"] += 1
        slowest = max(slowest, time.perf_counter() - t0)
    elapsed, cpu = time.perf_counter() - t_start, time.process_time() - cpu_start
    print(
        f"\npacket fuzz: {n_cases} cases in {elapsed:.1f} s wall, {cpu:.1f} s CPU "
        f"({n_cases / elapsed:.0f}/s), "
        f"slowest case {slowest * 1000:.1f} ms, seed {seed}\n  outcomes: {dict(outcomes.most_common())}"
    )
    assert slowest < 1.0
    assert sum(outcomes.values()) == n_cases
    assert len(outcomes) >= 8  # the mutations reach many distinct rejection paths


# --- hypothesis ------------------------------------------------------------------------------------

_FIELD = st.one_of(
    st.sampled_from([1, 1.0, True, 0, 2, "fuzz-run", b"", bytes(32), bytes(64)]),
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=80),
    st.binary(max_size=80),
    st.lists(st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=3),
)
_BODY = st.dictionaries(
    st.sampled_from(["v", "run", "step", "peer", "layout", "payload", "sig", "x"]), _FIELD
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_BODY, compress=st.booleans())
def test_hypothesis_structured_bodies(body: dict[str, Any], compress: bool) -> None:
    frame = encode_frame(MessageKind.STEP_PACKET, body, compress=compress)
    with pytest.raises(Rejected):
        full_decode(frame)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=512), keep_header=st.booleans())
def test_hypothesis_arbitrary_bytes(data: bytes, keep_header: bool) -> None:
    frame = (
        (struct.pack(">4sBBBBII", b"DNET", 1, 1, 0, 0, len(data), len(data)) + data) if keep_header else data
    )
    with pytest.raises(Rejected):
        full_decode(frame)


# --- announcements ---------------------------------------------------------------------------------


def test_announcement_decoder_survives_mutations() -> None:
    """10,000 mutated announcements: each refused with a code, or the very same announcement."""
    from distronet.protocol.announce import open_announcement, seal_announcement

    r = random.Random(7)
    packet = seal_packet(ME, RUN, 5, DIGEST, b"p" * 300)
    base = seal_announcement(ME, RUN, 5, packet, addrs=["/ip4/10.0.0.1/tcp/4001", "/dns4/x.example/tcp/1"])
    original = open_announcement(base, run_id=RUN)
    outcomes: collections.Counter[str] = collections.Counter()
    for case in range(10_000):
        b = bytearray(base)
        op = r.randrange(4)
        if op == 0:
            for _ in range(r.randint(1, 4)):
                b[r.randrange(len(b))] ^= r.randint(1, 255)
        elif op == 1:
            del b[r.randrange(len(b)) :]
        elif op == 2:
            b += r.randbytes(r.randint(1, 900))
        else:
            b = bytearray(r.randbytes(r.randint(0, 1100)))
        try:
            ann = open_announcement(bytes(b), run_id=RUN)
        except Rejected as e:
            outcomes[e.code.name] += 1
        except Exception as e:
            raise AssertionError(f"announcement case {case} escaped with {e!r}") from e
        else:
            assert ann == original, case
            outcomes["accepted"] += 1
    assert outcomes["accepted"] < 100 and len(outcomes) >= 4
