"""The coordinator's HTTP API: typed error codes, request schemas, validation and signed forms.

Shared by the coordinator (which validates) and the node's client (which signs). JSON bodies
are validated by small declarative :class:`Schema` objects that also render the JSON Schema the
OpenAPI document serves, so the document and the validator cannot disagree.

Node requests are authenticated by the peer key: either signed (four headers, see
:func:`sign_request`), or — after one signed key exchange — with a session MAC (see
:mod:`distronet.protocol.coordinator_session`). Signed requests carry::

    X-Distro-Peer       the sender's libp2p peer id (base58btc, "12D3KooW...")
    X-Distro-Time       milliseconds since the Unix epoch when signed
    X-Distro-Nonce      16-64 characters [A-Za-z0-9_-], never reused within the time window
    X-Distro-Signature  base64 of the Ed25519 signature of :func:`request_message`

Admission signs :func:`join_message` (a server challenge), and a packet receipt signs
:func:`receipt_message` (the acceptor vouches that the producer's packet for a step arrived).

Errors::

    ProtocolError
    └── ApiError          an API call refused; ``code`` (ApiErrorCode) gives the HTTP status
"""

from __future__ import annotations

import base64
import copy
import enum
import hashlib
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from distronet.protocol.errors import ProtocolError

__all__ = [
    "API_PREFIX",
    "HDR_NONCE",
    "HDR_PEER",
    "HDR_SIGNATURE",
    "HDR_TIME",
    "MANIFEST",
    "PEER_RE",
    "REACH",
    "REACH_CAUSES",
    "REACH_MAX_LINKS",
    "SCHEMAS",
    "ApiError",
    "ApiErrorCode",
    "Field",
    "Schema",
    "Signer",
    "b64decode_sig",
    "error_body",
    "join_message",
    "receipt_message",
    "request_message",
    "sign_request",
]

API_PREFIX = "/api/v1"
HDR_PEER = "X-Distro-Peer"
HDR_TIME = "X-Distro-Time"
HDR_NONCE = "X-Distro-Nonce"
HDR_SIGNATURE = "X-Distro-Signature"


class ApiErrorCode(enum.Enum):
    """Why the coordinator refused a call. The value is the code in the JSON error body."""

    MALFORMED = "malformed"  # body is not a JSON object / not UTF-8
    INVALID_FIELD = "invalid_field"  # a field is missing, of the wrong type or out of range
    UNSUPPORTED_MEDIA = "unsupported_media_type"  # Content-Type is not application/json
    UNAUTHENTICATED = "unauthenticated"  # no operator token / no request signature
    BAD_TOKEN = "bad_operator_token"  # operator token present but wrong
    BAD_SIGNATURE = "bad_signature"  # a signature that does not verify, or a malformed peer id
    STALE_REQUEST = "stale_request"  # signed time outside the accepted window: re-sign and retry
    REPLAYED = "replayed_request"  # the nonce was already used
    UNKNOWN_SESSION = (
        "unknown_session"  # session id unknown or expired (e.g. after a restart): open a new one
    )
    NOT_ADMITTED = "not_admitted"  # the peer has not joined this run (or has left): join first
    EVICTED = "evicted"  # the operator evicted this peer
    BAD_JOIN_TOKEN = "bad_join_token"  # the run needs a join token and this one is missing/used/wrong
    CHALLENGE_EXPIRED = "challenge_expired"  # unknown or expired admission challenge: ask for a new one
    NOT_FOUND = "not_found"  # no such run / shard / route
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"  # e.g. a run with this id exists
    LEASE_LOST = "lease_lost"  # the lease expired and the shard went to another node
    RUN_CLOSED = "run_closed"  # the run accepts no more work
    TOO_LARGE = "too_large"  # body over the route's size limit
    RATE_LIMITED = "rate_limited"  # over this client's request rate: wait Retry-After seconds
    INTERNAL = "internal"  # a bug: the coordinator's log says more
    UNAVAILABLE = "unavailable"  # shutting down or storage failed: retry later

    @property
    def http_status(self) -> int:
        return _STATUS[self]


_STATUS: dict[ApiErrorCode, int] = {
    ApiErrorCode.MALFORMED: 400,
    ApiErrorCode.INVALID_FIELD: 400,
    ApiErrorCode.UNSUPPORTED_MEDIA: 415,
    ApiErrorCode.UNAUTHENTICATED: 401,
    ApiErrorCode.BAD_TOKEN: 403,
    ApiErrorCode.BAD_SIGNATURE: 403,
    ApiErrorCode.STALE_REQUEST: 403,
    ApiErrorCode.REPLAYED: 403,
    ApiErrorCode.UNKNOWN_SESSION: 401,
    ApiErrorCode.NOT_ADMITTED: 403,
    ApiErrorCode.EVICTED: 403,
    ApiErrorCode.BAD_JOIN_TOKEN: 403,
    ApiErrorCode.CHALLENGE_EXPIRED: 403,
    ApiErrorCode.NOT_FOUND: 404,
    ApiErrorCode.METHOD_NOT_ALLOWED: 405,
    ApiErrorCode.CONFLICT: 409,
    ApiErrorCode.LEASE_LOST: 409,
    ApiErrorCode.RUN_CLOSED: 409,
    ApiErrorCode.TOO_LARGE: 413,
    ApiErrorCode.RATE_LIMITED: 429,
    ApiErrorCode.INTERNAL: 500,
    ApiErrorCode.UNAVAILABLE: 503,
}


class ApiError(ProtocolError):
    """An API call refused. ``code`` decides the HTTP status; ``field`` names the bad field."""

    def __init__(self, code: ApiErrorCode, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.field)


def error_body(code: ApiErrorCode, message: str, field: str | None = None) -> dict[str, Any]:
    """The JSON error body every 4xx/5xx carries: ``{"error": {"code", "message", "field"?}}``."""
    err: dict[str, Any] = {"code": code.value, "message": message}
    if field is not None:
        err["field"] = field
    return {"error": err}


# --------------------------------------------------------------------------- signed forms


class Signer(Protocol):
    """What signs: :class:`distronet.protocol.identity.Identity` fits."""

    @property
    def peer_id_b58(self) -> str: ...

    def sign(self, data: bytes) -> bytes: ...


def request_message(method: str, path: str, timestamp_ms: int, nonce: str, body: bytes) -> bytes:
    """The bytes a node signs for one HTTP request (path includes the query string, if any)."""
    digest = hashlib.sha256(body).hexdigest()
    return f"DISTRO-REQ-V1\n{method.upper()}\n{path}\n{timestamp_ms}\n{nonce}\n{digest}".encode()


def sign_request(
    signer: Signer,
    method: str,
    path: str,
    body: bytes,
    *,
    now_ms: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The four signature headers for one request. Cost: one Ed25519 signature (~30 µs)."""
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    nonce = secrets.token_urlsafe(12) if nonce is None else nonce
    sig = signer.sign(request_message(method, path, ts, nonce, body))
    return {
        HDR_PEER: signer.peer_id_b58,
        HDR_TIME: str(ts),
        HDR_NONCE: nonce,
        HDR_SIGNATURE: base64.b64encode(sig).decode(),
    }


def join_message(run_id: str, peer_id_b58: str, challenge: str) -> bytes:
    """The bytes a node signs to prove it owns its key when it joins a run."""
    return f"DISTRO-JOIN-V1\n{run_id}\n{peer_id_b58}\n{challenge}".encode()


def receipt_message(run_id: str, step: int, producer_b58: str, payload_sha256: str) -> bytes:
    """The bytes an acceptor signs to vouch it received and accepted ``producer``'s packet."""
    return f"DISTRO-RECEIPT-V1\n{run_id}\n{step}\n{producer_b58}\n{payload_sha256.lower()}".encode()


def b64decode_sig(text: str) -> bytes:
    """Decode a base64 signature (64 bytes). Raises ApiError(BAD_SIGNATURE) on anything else."""
    if not isinstance(text, str) or len(text) != 88:
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, "signature must be 88 characters of base64")
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, "signature is not base64") from None
    if len(raw) != 64:
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, "signature must be 64 bytes")
    return raw


# --------------------------------------------------------------------------- schemas

_MAX_FREEFORM_NODES = 2048
_MAX_FREEFORM_DEPTH = 8


def _freeform_ok(value: Any, depth: int, budget: list[int]) -> bool:
    """True when a free-form JSON value stays within depth and size bounds."""
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_FREEFORM_DEPTH:
        return False
    if isinstance(value, dict):
        return all(
            isinstance(k, str) and len(k) <= 128 and _freeform_ok(v, depth + 1, budget)
            for k, v in value.items()
        )
    if isinstance(value, list):
        return all(_freeform_ok(v, depth + 1, budget) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= 4096
    return value is None or isinstance(value, (bool, int))


@dataclass(frozen=True)
class Field:
    """One JSON field: its kind and bounds. ``kind`` is str|int|float|bool|list|object|any."""

    name: str
    kind: str
    required: bool = True
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None  # strings: characters; lists: items
    pattern: str | None = None
    enum: tuple[str, ...] | None = None
    items: Field | Schema | None = None  # list items
    schema: Schema | None = None  # nested object
    fill: bool = True  # an absent, optional nested object: its schema's defaults (False: None)
    description: str = ""

    def check(self, value: Any, where: str) -> Any:
        """Return the validated value; raise ApiError(INVALID_FIELD) naming ``where``."""
        k = self.kind
        if k == "str":
            if not isinstance(value, str):
                raise _bad(where, "must be a string")
            if self.max_length is not None and len(value) > self.max_length:
                raise _bad(where, f"longer than {self.max_length} characters")
            if self.pattern is not None and not _compiled(self.pattern).fullmatch(value):
                raise _bad(where, f"must match {self.pattern}")
            if self.enum is not None and value not in self.enum:
                raise _bad(where, f"must be one of {', '.join(self.enum)}")
            return value
        if k == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(where, "must be an integer")
            self._range(value, where)
            return value
        if k == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _bad(where, "must be a number")
            if not math.isfinite(value):
                raise _bad(where, "must be finite")
            self._range(value, where)
            return float(value)
        if k == "bool":
            if not isinstance(value, bool):
                raise _bad(where, "must be true or false")
            return value
        if k == "list":
            if not isinstance(value, list):
                raise _bad(where, "must be a list")
            if self.max_length is not None and len(value) > self.max_length:
                raise _bad(where, f"more than {self.max_length} items")
            assert self.items is not None
            items = self.items
            if isinstance(items, Schema):
                return [items.validate(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return [items.check(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if k == "object":
            if self.schema is not None:
                return self.schema.validate(value, where)
            if not isinstance(value, dict) or not _freeform_ok(value, 0, [_MAX_FREEFORM_NODES]):
                raise _bad(where, "must be a JSON object of bounded size and depth, finite numbers")
            return value
        raise AssertionError(f"unknown field kind {k}")

    def _range(self, value: float, where: str) -> None:
        if self.minimum is not None and value < self.minimum:
            raise _bad(where, f"must be >= {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise _bad(where, f"must be <= {self.maximum:g}")

    def json_schema(self) -> dict[str, Any]:
        """This field as JSON Schema (OpenAPI 3.1 dialect)."""
        types = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array"}
        out: dict[str, Any]
        if self.kind == "object":
            out = self.schema.json_schema() if self.schema is not None else {"type": "object"}
        else:
            out = {"type": types[self.kind]}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.max_length is not None:
            out["maxLength" if self.kind == "str" else "maxItems"] = self.max_length
        if self.pattern is not None:
            out["pattern"] = f"^{self.pattern}$"
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.items is not None:
            out["items"] = self.items.json_schema()
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Schema:
    """A JSON object with named fields; unknown fields are refused (strict)."""

    name: str
    fields: tuple[Field, ...]
    extra: Callable[[dict[str, Any], str], None] | None = field(default=None, compare=False)
    _known: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_known", frozenset(f.name for f in self.fields))

    def validate(self, obj: Any, where: str = "body") -> dict[str, Any]:
        """A new dict with every field checked and defaults filled. Raises ApiError."""
        if not isinstance(obj, dict):
            raise _bad(where, "must be a JSON object")
        known = self._known
        for key in obj:
            if key not in known:
                raise _bad(f"{where}.{str(key)[:64]}", "unknown field")
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.name in obj:
                out[f.name] = f.check(obj[f.name], f"{where}.{f.name}")
            elif f.required:
                raise _bad(f"{where}.{f.name}", "is required")
            elif f.schema is not None and f.fill:
                out[f.name] = f.schema.validate({}, f"{where}.{f.name}")
            else:
                out[f.name] = copy.copy(f.default)
        if self.extra is not None:
            self.extra(out, where)
        return out

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": [f.name for f in self.fields if f.required],
            "properties": {f.name: f.json_schema() for f in self.fields},
        }


def _bad(where: str, why: str) -> ApiError:
    return ApiError(ApiErrorCode.INVALID_FIELD, f"{where} {why}", field=where)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(p: str) -> re.Pattern[str]:
    c = _PATTERNS.get(p)
    if c is None:
        c = _PATTERNS[p] = re.compile(p)
    return c


PEER_RE = r"[1-9A-HJ-NP-Za-km-z]{32,64}"
SLUG_RE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
HEX64_RE = r"[0-9a-f]{64}"
TOKEN_RE = r"[A-Za-z0-9_-]{8,128}"
SIG_RE = r"[A-Za-z0-9+/]{86}=="
MADDR_RE = r"/[\x21-\x7e]{1,255}"
MAX_SHARDS = 1_000_000
MADDR = Field("multiaddr", "str", pattern=MADDR_RE)
RELAY_RE = r"/[\x21-\x7e]{1,200}/p2p/[1-9A-HJ-NP-Za-km-z]{32,64}"  # a full multiaddr: ends in /p2p/<id>
MAX_RUN_RELAYS = 8


_TOKENIZER_FIELDS = ("vocab_size", "eos_id", "tokenizer_file", "tokenizer_sha256")


def _manifest_extra(m: dict[str, Any], where: str) -> None:
    for name in _TOKENIZER_FIELDS:  # absent (a version 1 manifest): left out, as before version 2
        if m.get(name) is None:
            m.pop(name, None)
    if m["version"] == 2:  # a tokenizers JSON file (node/data/manifest.py): all four fields
        for name in _TOKENIZER_FIELDS:
            if m.get(name) is None:
                raise _bad(f"{where}.{name}", "is required in a version 2 manifest")
        if m["eos_id"] >= m["vocab_size"]:
            raise _bad(f"{where}.eos_id", "must be below vocab_size")
        cap = {"uint8": 2**8, "uint16": 2**16}.get(m["dtype"], 2**31)
        if m["vocab_size"] > cap:
            raise _bad(f"{where}.vocab_size", f"does not fit dtype {m['dtype']}")
    ids: set[str] = set()
    for i, s in enumerate(m["shards"]):
        if (s["path"] is None) == (s["url"] is None):
            raise _bad(f"{where}.shards[{i}]", "needs exactly one of path or url")
        if s["path"] is not None and (s["path"].startswith("/") or ".." in s["path"].split("/")):
            raise _bad(f"{where}.shards[{i}].path", "must be relative, without '..'")
        if s["id"] in ids:
            raise _bad(f"{where}.shards[{i}].id", "duplicate shard id")
        ids.add(s["id"])
    if not ids:
        raise _bad(f"{where}.shards", "must list at least one shard")


SHARD = Schema(
    "Shard",
    (
        Field("id", "str", pattern=SLUG_RE),
        Field("path", "str", required=False, max_length=512, pattern=r"[A-Za-z0-9._/-]+"),
        Field("url", "str", required=False, max_length=2048, pattern=r"https?://[\x21-\x7e]+"),
        Field("sha256", "str", pattern=HEX64_RE),
        Field("tokens", "int", minimum=1, maximum=2**40),
        Field("bytes", "int", minimum=1, maximum=2**42),
    ),
)
MANIFEST = Schema(
    "Manifest",
    (
        Field("version", "int", minimum=1, maximum=2),
        Field("tokenizer", "str", max_length=64),
        Field("dtype", "str", enum=("uint8", "uint16", "uint32")),
        Field("vocab_size", "int", required=False, minimum=1, maximum=2**31),
        Field("eos_id", "int", required=False, minimum=0, maximum=2**31 - 1),
        Field("tokenizer_file", "str", required=False, pattern=SLUG_RE),
        Field("tokenizer_sha256", "str", required=False, pattern=HEX64_RE),
        Field("shards", "list", max_length=MAX_SHARDS, items=SHARD),
    ),
    extra=_manifest_extra,
)
DATA = Schema(
    "DataConfig",
    (
        Field("manifest", "object", schema=MANIFEST),
        Field("epochs", "int", required=False, default=1, minimum=1, maximum=1000),
        Field("lease_ttl_s", "float", required=False, default=600.0, minimum=1, maximum=86400),
        Field("max_leases_per_node", "int", required=False, default=4, minimum=1, maximum=64),
    ),
    extra=lambda d, w: _units_bound(d, w),
)


def _units_bound(d: dict[str, Any], where: str) -> None:
    if len(d["manifest"]["shards"]) * d["epochs"] > 10 * MAX_SHARDS:
        raise _bad(f"{where}.epochs", f"shards x epochs is over {10 * MAX_SHARDS}")


BANDWIDTH = Schema(
    "Bandwidth",
    (
        Field("up_bps", "int", required=False, default=10_000_000, minimum=1000, maximum=10**12),
        Field("down_bps", "int", required=False, default=100_000_000, minimum=1000, maximum=10**12),
    ),
)
ADMISSION = Schema(
    "Admission",
    (Field("policy", "str", required=False, default="open", enum=("open", "token")),),
)
# What earns credit and what a node's reported step may be (docs/decisions/verified-credit.md).
# ``min_steps`` 0 trusts a lease completion by itself (a run without receipts, e.g. a benchmark).
CREDIT = Schema(
    "Credit",
    (
        Field("min_steps", "int", required=False, default=1, minimum=0, maximum=100_000),
        Field("min_acceptors", "int", required=False, default=1, minimum=1, maximum=16),
        Field("step_slack", "int", required=False, default=64, minimum=0, maximum=1_000_000),
        Field("max_step_rate", "float", required=False, default=20.0, minimum=0, maximum=10_000),
    ),
)
CREATE_RUN = Schema(
    "CreateRun",
    (
        Field("id", "str", pattern=SLUG_RE),
        Field("model", "object", required=False, default={}),
        Field("optimizer", "object", required=False, default={}),
        Field("exchange", "object", required=False, default={}),
        Field("data", "object", schema=DATA),
        Field("bandwidth", "object", required=False, schema=BANDWIDTH),
        Field("admission", "object", required=False, schema=ADMISSION),
        Field("credit", "object", required=False, schema=CREDIT),
        Field(
            "relays",
            "list",
            required=False,
            default=[],
            max_length=MAX_RUN_RELAYS,
            items=Field("relay", "str", pattern=RELAY_RE),
            description="circuit relays (distro-node relay) handed to joining nodes",
        ),
        Field("heartbeat_interval_s", "float", required=False, default=5.0, minimum=0.1, maximum=3600),
        Field("node_timeout_s", "float", required=False, default=30.0, minimum=1, maximum=86400),
    ),
)
CREATE_TOKENS = Schema(
    "CreateJoinTokens",
    (
        Field("count", "int", required=False, default=1, minimum=1, maximum=1000),
        Field("uses", "int", required=False, default=1, minimum=1, maximum=1_000_000),
        Field("expires_in_s", "float", required=False, default=7 * 86400.0, minimum=1, maximum=10**8),
    ),
)
EVICT = Schema("Evict", (Field("reason", "str", required=False, default="", max_length=256),))
CHALLENGE = Schema("ChallengeRequest", (Field("peer_id", "str", pattern=PEER_RE),))
JOIN = Schema(
    "JoinRequest",
    (
        Field("peer_id", "str", pattern=PEER_RE),
        Field("challenge", "str", pattern=TOKEN_RE),
        Field("signature", "str", pattern=SIG_RE),
        Field("join_token", "str", required=False, pattern=TOKEN_RE),
        Field(
            "multiaddrs",
            "list",
            required=False,
            default=[],
            max_length=16,
            items=Field("m", "str", pattern=MADDR_RE),
        ),
        Field("agent", "str", required=False, default="", max_length=128),
    ),
)
LEASE = Schema(
    "LeaseRequest",
    (
        Field(
            "want", "int", required=False, default=1, minimum=0, maximum=64, description="0: list held leases"
        ),
    ),
)
LEASE_TOKEN = Schema("LeaseTokenRequest", (Field("lease_token", "str", pattern=TOKEN_RE),))
REACH_MAX_LINKS = 4096  # connected peers counted per route in a heartbeat's ``reach``
# How the node reaches its peers (node/swarm/reach.py) and, when it reaches none, why
# (node/swarm/diagnose.py's causes; "" while it reaches one).
REACH_CAUSES = ("no_relay", "alone", "firewall", "symmetric_nat", "unreachable")
REACH = Schema(
    "Reach",
    (
        Field("direct", "int", minimum=0, maximum=REACH_MAX_LINKS),
        Field("hole_punched", "int", minimum=0, maximum=REACH_MAX_LINKS),
        Field("relayed", "int", minimum=0, maximum=REACH_MAX_LINKS),
        Field("diagnosis", "str", required=False, default="", enum=("", *REACH_CAUSES)),
    ),
)
HEARTBEAT = Schema(
    "HeartbeatRequest",
    (
        Field("step", "int", minimum=0, maximum=2**53),
        Field("loss", "float", required=False, minimum=0, maximum=1e6),
        Field("multiaddrs", "list", required=False, max_length=16, items=MADDR),
        Field("reach", "object", required=False, schema=REACH, fill=False),
    ),
)
RECEIPT = Schema(
    "Receipt",
    (
        Field("step", "int", minimum=0, maximum=2**53),
        Field("producer", "str", pattern=PEER_RE),
        Field("acceptor", "str", pattern=PEER_RE),
        Field("payload_sha256", "str", pattern=HEX64_RE),
        Field("signature", "str", pattern=SIG_RE),
    ),
)
RECEIPTS = Schema("ReceiptsRequest", (Field("receipts", "list", max_length=128, items=RECEIPT),))
EMPTY = Schema("Empty", ())

SCHEMAS: Mapping[str, Schema] = {
    s.name: s
    for s in (
        SHARD, MANIFEST, DATA, BANDWIDTH, ADMISSION, CREDIT, CREATE_RUN, CREATE_TOKENS, EVICT,
        CHALLENGE, JOIN, LEASE, LEASE_TOKEN, REACH, HEARTBEAT, RECEIPT, RECEIPTS, EMPTY,
    )
}  # fmt: skip
