"""The route table and the request context: what every way in (the aiohttp app,
:mod:`.hotpath`) and every operation (:mod:`.handlers`) share.

:data:`ROUTES` lists each API route once (method, path, auth, body schema, size limit);
:class:`Ctx` is what the pipeline hands an operation; :class:`Served` is the part of the
running application an operation may use (:class:`~.app.CoordinatorApp` is one). Nothing here
imports the app, so the app, the handlers and the OpenAPI builder import this module and not
each other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from distronet.protocol import coordinator_api as api
from distronet.protocol.coordinator_api import API_PREFIX, ApiError, ApiErrorCode, Schema
from distronet.protocol.coordinator_session import SESSION

if TYPE_CHECKING:
    from distronet.coordinator.events import EventBus
    from distronet.coordinator.groupcommit import GroupCommitter
    from distronet.coordinator.metrics import Metrics
    from distronet.coordinator.service import Coordinator
    from distronet.coordinator.sessions import SessionTable

__all__ = ["HOT", "JSON", "ROUTES", "Ctx", "Route", "Served", "encode_json", "parse_json"]

JSON = "application/json"
HOT = ("heartbeat", "lease", "renew", "complete")  # nearly all traffic: :mod:`.hotpath` serves them


@dataclass(frozen=True)
class Route:
    """One API route. ``auth`` is none|operator|signed; ``limit`` is node|operator|probe (body size).

    A ``signed`` route also takes a session MAC in place of the signature unless ``mac`` is False
    (opening a session needs the peer key itself).
    """

    method: str
    path: str
    name: str
    auth: str
    schema: Schema | None
    summary: str
    limit: str = "node"
    raw: bool = False  # the handler builds its own response (SSE, files, metrics)
    mac: bool = True

    @property
    def full_path(self) -> str:
        return self.path if self.path.startswith("/metrics") else API_PREFIX + self.path


@dataclass(slots=True)
class Ctx:
    """What the pipeline hands an operation: the request, its path parameters (``run_id``,
    ``unit``, ...), its validated body, the authenticated peer (signed routes) and, for a POST
    route without a schema, the body's bytes as read (``data``, within the route's limit)."""

    request: web.BaseRequest | None  # None on the hot path (those handlers never read it)
    params: Mapping[str, str]
    body: dict[str, Any]
    peer: str | None
    data: bytes = b""


class Served(Protocol):
    """What an operation may use of the running application."""

    svc: Coordinator
    committer: GroupCommitter
    events: EventBus
    metrics: Metrics
    sessions: SessionTable
    clock: Callable[[], float]
    closing: bool
    openapi: dict[str, Any]

    def freeze_heap(self) -> None:
        """Hide the long-lived objects alive now from the cyclic GC (see the app)."""


R = Route
# Hot routes first: aiohttp tries routes in registration order.
ROUTES: list[Route] = [
    R("POST", "/runs/{run_id}/heartbeat", "heartbeat", "signed", api.HEARTBEAT, "Liveness, step, loss."),
    R("POST", "/runs/{run_id}/leases", "lease", "signed", api.LEASE, "Lease shards."),
    R("POST", "/runs/{run_id}/leases/{unit}/renew", "renew", "signed", api.LEASE_TOKEN, "Renew a lease."),
    R(
        "POST",
        "/runs/{run_id}/leases/{unit}/complete",
        "complete",
        "signed",
        api.LEASE_TOKEN,
        "Complete a lease.",
    ),
    R("GET", "/openapi.json", "openapi", "none", None, "This document."),
    R("GET", "/health", "health", "none", None, "Liveness and storage state."),
    R("GET", "/runs", "list_runs", "none", None, "Ids of every run."),
    R("POST", "/runs", "create_run", "operator", api.CREATE_RUN, "Create a run.", limit="operator"),
    R("GET", "/runs/{run_id}", "get_run", "none", None, "A run's definition and progress (what join reads)."),
    R("POST", "/runs/{run_id}/close", "close_run", "operator", api.EMPTY, "Stop leasing new shards."),
    R(
        "POST",
        "/runs/{run_id}/join-tokens",
        "join_tokens",
        "operator",
        api.CREATE_TOKENS,
        "Mint join tokens.",
    ),
    R("POST", "/runs/{run_id}/nodes/{peer_id}/evict", "evict", "operator", api.EVICT, "Evict a node."),
    R("GET", "/runs/{run_id}/nodes", "nodes", "none", None, "Every node of the run."),
    R("GET", "/runs/{run_id}/leaderboard", "leaderboard", "none", None, "Contribution ledger, best first."),
    R("GET", "/runs/{run_id}/events", "events", "none", None, "Server-sent events of the run.", raw=True),
    R(
        "GET",
        "/runs/{run_id}/shards/{shard_id}",
        "shard",
        "none",
        None,
        "A data shard (HTTP Range).",
        raw=True,
    ),
    R(
        "GET",
        "/runs/{run_id}/tokenizer.json",
        "tokenizer",
        "none",
        None,
        "The run's tokenizers JSON file (its sha256 is the run's data.tokenizer_sha256).",
        raw=True,
    ),
    R("GET", "/runs/{run_id}/leases/{unit}", "lease_state", "none", None, "The state of one shard unit."),
    R(
        "POST",
        "/runs/{run_id}/challenge",
        "challenge",
        "none",
        api.CHALLENGE,
        "A challenge to sign for join.",
    ),
    R("POST", "/runs/{run_id}/join", "join", "none", api.JOIN, "Join with a signed challenge."),
    R(
        "POST",
        "/runs/{run_id}/session",
        "session",
        "signed",
        SESSION,
        "Open a session: X25519 key exchange signed with the peer key; later calls carry an HMAC.",
        mac=False,
    ),
    R("POST", "/runs/{run_id}/receipts", "receipts", "signed", api.RECEIPTS, "Signed packet receipts."),
    R("POST", "/runs/{run_id}/leave", "leave", "signed", api.EMPTY, "Leave the run, giving leases back."),
    R(
        "GET",
        "/runs/{run_id}/probe",
        "probe_down",
        "none",
        None,
        "?bytes=N (1..MAX_PROBE_BYTES) bytes of noise, to time a download (distro-node doctor).",
        raw=True,
    ),
    R(
        "POST",
        "/runs/{run_id}/probe",
        "probe_up",
        "none",
        None,
        "A body of at most MAX_PROBE_BYTES, counted and dropped, to time an upload (distro-node doctor).",
        limit="probe",
        raw=True,
    ),
    R("GET", "/metrics", "metrics", "none", None, "Prometheus metrics.", raw=True),
]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: json.loads/json.dumps with options build a new decoder/encoder on every call.
_DECODE = json.JSONDecoder(parse_constant=_no_constant).decode
encode_json = json.JSONEncoder(separators=(",", ":")).encode


def parse_json(body: bytes) -> Any:
    """The JSON value of a request body (``{}`` when empty). Raises ApiError(MALFORMED)."""
    if not body:
        return {}
    try:
        return _DECODE(body.decode())
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ApiError(ApiErrorCode.MALFORMED, "body is not valid JSON (UTF-8, no NaN/Infinity)") from None
