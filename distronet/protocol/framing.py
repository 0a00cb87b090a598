"""Frames: a fixed 16-byte header, then a msgpack map, zstandard-compressed or raw.

Frame layout (integers big-endian)::

    offset  size  field
    0       4     magic  b"DNET"
    4       1     frame version (1)
    5       1     message kind (1 step packet, 2 announcement)
    6       1     flags: bit 0 = body is one zstd frame; bits 1-7 must be 0
    7       1     reserved, must be 0
    8       4     u32 body length: bytes after the header; must equal len(frame) - 16
    12      4     u32 decompressed length: length of the msgpack map (= body length when raw)
    16      ...   body

Decoding never trusts a declared size: the frame's length is checked against
``max_frame_bytes`` before anything else; the declared decompressed length and the zstd frame's
own content size (when present) are checked against ``max_decompressed_bytes`` and against the
ratio cap (``zstd_cap``: ``MAX_ZSTD_RATIO`` times the body, at least ``ZSTD_RATIO_FLOOR``;
encoders send a body raw past it) before decompressing; decompression stops, with
``DECOMPRESSION_BOMB``, as soon as output passes the declared length, and bytes after the zstd
frame are ``MALFORMED``. The zstd window is capped at ``MAX_ZSTD_WINDOW`` so the decompressor's
own memory is bounded too. msgpack is unpacked with every length capped, no ext types, string
map keys only, then each field's type and range is checked by the ``take_*`` helpers (each
raises ``Rejected(MALFORMED)`` naming the field).

Errors::

    ProtocolError
    ├── Rejected         a received frame is refused (code says why)
    └── EncodeError      a message we were asked to build breaks the protocol (over a limit)
"""

from __future__ import annotations

import enum
import struct
import threading
from typing import Any

import msgpack
import zstandard

from distronet.protocol.errors import ProtocolError, RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "FRAME_HEADER_BYTES",
    "FRAME_MAGIC",
    "FRAME_VERSION",
    "MAX_ZSTD_RATIO",
    "MAX_ZSTD_WINDOW",
    "ZSTD_RATIO_FLOOR",
    "EncodeError",
    "MessageKind",
    "decode_frame",
    "encode_frame",
    "take_bin",
    "take_int",
    "take_str",
    "zstd_cap",
]

FRAME_MAGIC = b"DNET"
FRAME_VERSION = 1
FRAME_HEADER_BYTES = 16
FLAG_ZSTD = 0x01
MAX_ZSTD_WINDOW = 1 << 24  # 16 MiB; zstd levels 1-19 never need more than 8 MiB
_HEADER = struct.Struct(">4sBBBBII")
_READ_CHUNK = 1 << 20
_PROBE_ABOVE = 256 * 1024
_PROBE_BYTES = 64 * 1024
_MAX_KEY_LEN = 32  # msgpack map keys are short ASCII names
MAX_ZSTD_RATIO = 16
"""A zstd body may expand to at most this many times its own length (or ZSTD_RATIO_FLOOR)."""
ZSTD_RATIO_FLOOR = 64 * 1024


def zstd_cap(body_len: int) -> int:
    """Most bytes a zstd body of ``body_len`` bytes may decompress to (encoders send raw past it).

    Coded payloads are close to incompressible, so an honest frame never comes near the ratio;
    it keeps a few kB of frame from costing a receiver the whole ``max_decompressed_bytes`` of
    memory and CPU before its signature can be checked.
    """
    return max(ZSTD_RATIO_FLOOR, MAX_ZSTD_RATIO * body_len)


class MessageKind(enum.IntEnum):
    """What a frame carries; a decoder asked for one kind refuses the others (MALFORMED)."""

    STEP_PACKET = 1
    ANNOUNCEMENT = 2


class EncodeError(ProtocolError, ValueError):
    """A message we were asked to build breaks the protocol: a field out of range or over a limit."""


def encode_frame(kind: MessageKind, body: dict[str, Any], *, compress: bool, level: int = 3) -> bytes:
    """Pack ``body`` with msgpack and frame it; zstd-compress it when ``compress`` and it gets smaller.

    Bodies over 256 KiB are first probed: when zstd cannot shrink a 64 KiB sample from their
    middle by 3 %, they go raw (coded payloads are close to incompressible; this saves the full
    zstd pass). The zstd frame always records its content size. Cost: msgpack + at most one
    zstd pass over the body. Size limits are the caller's to check.
    """
    raw = msgpack.packb(body, use_bin_type=True)
    flags = 0
    out = raw
    if compress and _worth_compressing(raw, level):
        cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
        packed = cctx.compress(raw)
        if len(packed) < len(raw) and len(raw) <= zstd_cap(len(packed)):
            out, flags = packed, FLAG_ZSTD
    if len(out) > 0xFFFFFFFF or len(raw) > 0xFFFFFFFF:
        raise EncodeError(f"a frame body of {len(raw)} bytes does not fit the u32 length fields")
    return _HEADER.pack(FRAME_MAGIC, FRAME_VERSION, int(kind), flags, 0, len(out), len(raw)) + out


def _worth_compressing(raw: bytes, level: int) -> bool:
    if len(raw) <= _PROBE_ABOVE:
        return True
    mid = len(raw) // 2
    sample = raw[mid - _PROBE_BYTES // 2 : mid + _PROBE_BYTES // 2]
    packed = zstandard.ZstdCompressor(level=level).compress(sample)
    return len(packed) < 0.97 * len(sample)


def decode_frame(
    frame: bytes,
    kind: MessageKind,
    *,
    limits: Limits = DEFAULT_LIMITS,
    max_frame_bytes: int | None = None,
    max_decompressed_bytes: int | None = None,
    max_map_len: int = 16,
    max_array_len: int = 0,
) -> dict[str, Any]:
    """Check the header, decompress boundedly and unpack the msgpack map of a ``kind`` frame.

    ``max_frame_bytes`` and ``max_decompressed_bytes`` default to the ``limits`` fields of those
    names (announcements pass smaller ones). Returns the map with str keys;
    field types are the caller's to check (``take_*``). Raises Rejected with TOO_LARGE,
    TRUNCATED, MALFORMED, UNSUPPORTED_VERSION or DECOMPRESSION_BOMB. Memory: at most the
    declared decompressed length (itself <= ``limits.max_decompressed_bytes``) plus one 1 MiB
    read chunk and the zstd window.
    """
    cap = limits.max_frame_bytes if max_frame_bytes is None else max_frame_bytes
    raw_cap = limits.max_decompressed_bytes if max_decompressed_bytes is None else max_decompressed_bytes
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise Rejected(RejectCode.MALFORMED, f"a frame is bytes, got {type(frame).__name__}")
    frame = bytes(frame)
    if len(frame) > cap:
        raise Rejected(RejectCode.TOO_LARGE, f"frame of {len(frame)} bytes; limit {cap}")
    if len(frame) < FRAME_HEADER_BYTES:
        if FRAME_MAGIC.startswith(frame[:4]):
            raise Rejected(RejectCode.TRUNCATED, f"frame of {len(frame)} bytes is shorter than its header")
        raise Rejected(RejectCode.MALFORMED, "bad magic")
    magic, version, frame_kind, flags, reserved, body_len, raw_len = _HEADER.unpack_from(frame)
    if magic != FRAME_MAGIC:
        raise Rejected(RejectCode.MALFORMED, "bad magic")
    if version != FRAME_VERSION:
        raise Rejected(RejectCode.UNSUPPORTED_VERSION, f"frame version {version}; this node speaks 1")
    if frame_kind != kind:
        raise Rejected(RejectCode.MALFORMED, f"message kind {frame_kind}; expected {int(kind)}")
    if flags & ~FLAG_ZSTD or reserved:
        raise Rejected(RejectCode.MALFORMED, f"unknown flags {flags:#04x} or reserved byte {reserved}")
    if body_len > cap - FRAME_HEADER_BYTES:
        raise Rejected(RejectCode.TOO_LARGE, f"declared body of {body_len} bytes; limit {cap}")
    actual = len(frame) - FRAME_HEADER_BYTES
    if actual < body_len:
        raise Rejected(RejectCode.TRUNCATED, f"body has {actual} of its {body_len} declared bytes")
    if actual > body_len:
        raise Rejected(RejectCode.MALFORMED, f"{actual - body_len} bytes after the declared body")
    body = memoryview(frame)[FRAME_HEADER_BYTES:]
    if flags & FLAG_ZSTD:
        raw: bytes | bytearray | memoryview = _decompress(body, raw_len, min(raw_cap, zstd_cap(body_len)))
    else:
        if raw_len != body_len:
            raise Rejected(RejectCode.MALFORMED, "raw body: decompressed length differs from body length")
        if raw_len > raw_cap:
            raise Rejected(RejectCode.TOO_LARGE, f"body of {raw_len} bytes over its limit")
        raw = body
    return _unpack(raw, limits, raw_cap, max_map_len=max_map_len, max_array_len=max_array_len)


def _decompress(body: memoryview, declared: int, limit: int) -> bytes | bytearray:
    """Decompress one zstd frame, refusing any output past ``declared`` (<= ``limit``).

    A frame that records its content size (equal to ``declared``, checked) is decompressed in one
    call into a buffer of that size; any error there, or any other frame, takes the streaming
    read, which grows its buffer with real output only and names the fault.
    """
    if declared > limit:
        raise Rejected(
            RejectCode.DECOMPRESSION_BOMB, f"declares {declared} decompressed bytes; limit {limit}"
        )
    try:
        params = zstandard.get_frame_parameters(body)
    except zstandard.ZstdError as e:
        raise Rejected(RejectCode.MALFORMED, f"not a zstd frame: {e}") from None
    size = params.content_size
    if size != zstandard.CONTENTSIZE_UNKNOWN:
        if size > limit:
            raise Rejected(RejectCode.DECOMPRESSION_BOMB, f"zstd frame declares {size} bytes; limit {limit}")
        if size != declared:
            raise Rejected(RejectCode.MALFORMED, f"zstd content size {size} differs from header's {declared}")
    if params.window_size > MAX_ZSTD_WINDOW:
        raise Rejected(RejectCode.DECOMPRESSION_BOMB, f"zstd window of {params.window_size} bytes")
    if size == declared:  # the common case: one pass into a buffer of the known size
        dobj = _decompressor().decompressobj(write_size=max(1, declared))
        try:
            whole = dobj.decompress(body)  # libzstd stops a frame at its recorded content size
        except zstandard.ZstdError:
            whole = None  # the streaming read below names the fault
        if whole is not None and len(whole) == declared and dobj.eof:
            if dobj.unused_data:
                raise Rejected(RejectCode.MALFORMED, f"{len(dobj.unused_data)} bytes after the zstd frame")
            return whole
    dctx = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
    out = bytearray()
    try:
        with dctx.stream_reader(body, read_across_frames=False) as reader:
            while len(out) <= declared:
                chunk = reader.read(min(_READ_CHUNK, declared + 1 - len(out)))
                if not chunk:
                    break
                out += chunk
    except zstandard.ZstdError as e:
        raise Rejected(RejectCode.MALFORMED, f"zstd: {e}") from None
    if len(out) > declared:
        raise Rejected(RejectCode.DECOMPRESSION_BOMB, f"expands past its declared {declared} bytes")
    if len(out) < declared:
        raise Rejected(RejectCode.TRUNCATED, f"zstd frame ends after {len(out)} of {declared} bytes")
    dobj = dctx.decompressobj(write_size=max(1, declared))
    dobj.decompress(body)  # the same frame again, now known to give ``declared`` bytes: find its end
    if dobj.unused_data:
        raise Rejected(RejectCode.MALFORMED, f"{len(dobj.unused_data)} bytes after the zstd frame")
    return out


_LOCAL = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's reusable decompressor (a context costs ~100 KiB and microseconds to make)."""
    dctx: zstandard.ZstdDecompressor | None = getattr(_LOCAL, "dctx", None)
    if dctx is None:
        dctx = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
        _LOCAL.dctx = dctx
    return dctx


def _unpack(
    raw: bytes | bytearray | memoryview, limits: Limits, max_bin: int, *, max_map_len: int, max_array_len: int
) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_bin_len=max_bin,
            max_str_len=max(256, limits.max_multiaddr_len, 4 * limits.max_run_id_len),
            max_array_len=max_array_len,
            max_map_len=max_map_len,
            max_ext_len=0,
            object_pairs_hook=_unique_keys,
        )
    except msgpack.OutOfData:
        raise Rejected(RejectCode.TRUNCATED, "msgpack body ends early") from None
    except (ValueError, TypeError, RecursionError) as e:
        # FormatError, StackError, ExtraData, UnicodeDecodeError and limit errors are ValueErrors.
        text = str(e)
        code = RejectCode.TRUNCATED if "incomplete" in text else RejectCode.MALFORMED
        raise Rejected(code, f"msgpack: {text[:120]}") from None
    if not isinstance(obj, dict):
        raise Rejected(RejectCode.MALFORMED, f"body is a msgpack {type(obj).__name__}, not a map")
    for key in obj:
        if not isinstance(key, str) or len(key) > _MAX_KEY_LEN:
            raise Rejected(RejectCode.MALFORMED, "map keys must be short strings")
    return obj


def _unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """Build a map, refusing a repeated key: implementations that keep the first or the last of
    two values must never disagree about what a signed message says."""
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a map key repeats")
    return out


def take_int(m: dict[str, Any], key: str, lo: int, hi: int) -> int:
    """``m[key]`` as an int in ``[lo, hi]`` (bools refused). Raises Rejected(MALFORMED)."""
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise Rejected(RejectCode.MALFORMED, f"field {key!r} must be an int in [{lo}, {hi}]")
    return v


def take_bin(m: dict[str, Any], key: str, lo: int, hi: int) -> bytes:
    """``m[key]`` as msgpack bin of ``lo..hi`` bytes. Raises Rejected(MALFORMED)."""
    v = m.get(key)
    if not isinstance(v, bytes) or not lo <= len(v) <= hi:
        raise Rejected(RejectCode.MALFORMED, f"field {key!r} must be {lo}..{hi} bytes of bin")
    return v


def take_str(m: dict[str, Any], key: str, lo: int, hi: int) -> str:
    """``m[key]`` as a msgpack str of ``lo..hi`` characters. Raises Rejected(MALFORMED)."""
    v = m.get(key)
    if not isinstance(v, str) or not lo <= len(v) <= hi:
        raise Rejected(RejectCode.MALFORMED, f"field {key!r} must be a str of {lo}..{hi} characters")
    return v
