"""Newcomer state sync: a state blob fetched from several donors in verified chunks, resumably.

A donor ``offer``s a serialised state (parameters + the step they belong to) as fixed-size chunks
in its own content store (or ``serve_from`` a source: the state is snapshotted, serialised,
hashed and signed only when a peer asks for it, at most once per step; a node steps several
times a second, peers ask rarely), served over their own pull protocol, and answers manifest
requests on ``STATE_MANIFEST_PROTOCOL`` with a signed :class:`StateManifest` (step, size,
sha256 of the whole blob and of each chunk). A newcomer :func:`fetch_state`\\ s: it asks every
candidate donor for its manifest and adopts only a root (step, sha256) that a quorum of distinct,
admitted donors agree on (:func:`choose_root`; docs/decisions/state-quorum.md): a lone donor
claiming a far newer step, or a minority offering another state, is never chosen. Then it pulls the chunks
spread over those donors (at most ``per_donor`` chunks in flight at each,
so no donor is overloaded), retrying a failed chunk at another donor. Every chunk is hash-checked
and, with a ``cache_dir``, written there as soon as it verifies, so a restarted fetch resumes.

Donors that step at their own pace are rarely at one step when asked, and two honest donors a
step apart offer two states, neither with a quorum (in a two-donor swarm that can repeat at every
retry). So the ask names a step, a rendezvous: the newcomer asks for the state at a step a few
past the one a quorum of the peers vouch for (``resync.RENDEZVOUS_AHEAD``), and each donor
answers with its state at that boundary: kept, taken now if it rests there, or taken when its
training reaches it (``Replica.state_at``), within ``RENDEZVOUS_WAIT_S`` and
``MAX_RENDEZVOUS_STEPS`` steps of its own; else (past it, or asked too far ahead) with the state
it holds now, as for an ask of step 0.

Wire: ``distronet.protocol.state`` (docs/protocol.md §14.5): the manifest ask is 12 bytes (a
magic and the step wanted), its answer a status, a length and the signed msgpack manifest;
chunks travel on the pull wire under ``STATE_PULL_PROTOCOL``. Both are served through the
swarm's servicer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from distronet.node.swarm.errors import PullError, PullTimeout, StreamError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.pull import ContentStore, Puller
from distronet.node.swarm.servicer import StreamCall, StreamRoute, StreamServicer, ask
from distronet.node.swarm.stack import Swarm
from distronet.protocol.errors import ProtocolError, RejectCode, Rejected
from distronet.protocol.identity import Identity, peer_id_to_b58
from distronet.protocol.limits import DEFAULT_STREAM_LIMITS
from distronet.protocol.state import (
    STATE_ANSWER_HEADER_BYTES,
    STATE_ASK_BYTES,
    STATE_MANIFEST_PROTOCOL,
    STATE_PULL_PROTOCOL,
    StateManifest,
    decode_state_answer_length,
    decode_state_ask,
    encode_state_answer,
    encode_state_ask,
    open_state_manifest,
    seal_state_manifest,
)

__all__ = [
    "MAX_CHUNKS",
    "MAX_MANIFEST_BYTES",
    "MAX_RENDEZVOUS_STEPS",
    "RENDEZVOUS_WAIT_S",
    "STATE_MANIFEST_PROTOCOL",
    "STATE_PULL_PROTOCOL",
    "NoNewerState",
    "NoQuorum",
    "StateDonor",
    "StateManifest",
    "ask_manifest",
    "choose_root",
    "describe",
    "fetch_state",
]

MAX_MANIFEST_BYTES = DEFAULT_STREAM_LIMITS.max_state_manifest_bytes
MAX_CHUNKS = DEFAULT_STREAM_LIMITS.max_state_chunks
_SERVE_TIMEOUT_S = 10.0
RENDEZVOUS_WAIT_S = 5.0  # the longest a donor waits for its training to reach a step asked for
MAX_RENDEZVOUS_STEPS = 8  # the furthest past its own step a donor waits for (a liar's far step is not)
Progress = Callable[[int, int], None]
Snapshot = Callable[[], Awaitable[tuple[int, bytes]]]
"""``await snapshot()`` -> ``(step, blob)``: the owner's state at one consistent moment."""
SnapshotAt = Callable[[int], Awaitable[tuple[int, bytes] | None]]
"""``await at(step)`` -> ``(step, blob)`` at that step's boundary, or None once past it
(``Replica.state_at``)."""


Admitted = Callable[[bytes], bool]
"""``admitted(peer_id)``: whether a peer holds this run's admission credential (issue 17)."""


class NoNewerState(PullError):
    """The donors offer states, but none newer than the step the caller already holds."""


class NoQuorum(PullError):
    """No state is offered by a quorum of distinct admitted donors: nothing is adopted (retry)."""


def _retrieve(fut: asyncio.Future[None]) -> None:
    """Mark a background build's failure as seen (its waiters got it, or had given up)."""
    if not fut.cancelled():
        fut.exception()


@dataclass(frozen=True)
class _Prepared:
    """An offer hashed and signed, not yet installed in the store."""

    manifest: StateManifest
    packed: bytes
    parts: tuple[tuple[bytes, bytes], ...]  # (sha256, chunk bytes)


def _prepare(ident: Identity, run: str, step: int, blob: bytes, chunk_bytes: int) -> _Prepared:
    """Chunk, hash and sign ``blob`` (pure: safe in a worker thread). Raises ValueError
    (``EncodeError``: empty, or over the state limits)."""
    if not blob or -(-len(blob) // chunk_bytes) > MAX_CHUNKS:
        raise ValueError(f"state of {len(blob)} bytes does not fit {MAX_CHUNKS} chunks of {chunk_bytes}")
    view = memoryview(blob)
    parts = tuple(
        (hashlib.sha256(view[o : o + chunk_bytes]).digest(), blob[o : o + chunk_bytes])
        for o in range(0, len(blob), chunk_bytes)
    )
    manifest, packed = seal_state_manifest(ident, run, step, blob, chunk_bytes, [d for d, _ in parts])
    return _Prepared(manifest, packed, parts)


class StateDonor:
    """Serves this node's latest state to newcomers. Build with :meth:`create`; call :meth:`offer`
    or :meth:`serve_from`. Use from the event loop's thread only."""

    def __init__(self, swarm: Swarm, puller: Puller, *, chunk_bytes: int = 4 * 2**20, keep: int = 2) -> None:
        self.swarm, self.puller = swarm, puller
        self.chunk_bytes, self.keep = chunk_bytes, max(keep, 1)
        self._manifest: bytes | None = None
        self._current: StateManifest | None = None
        self._installed: list[int] = []  # steps of the offers whose chunks are in the store, oldest first
        self._kept: dict[int, bytes] = {}  # the packed manifests of those offers, by step
        self._source: tuple[Callable[[], int], Snapshot] | None = None
        self._at: SnapshotAt | None = None
        self._building: asyncio.Future[None] | None = None
        self._meeting: dict[int, asyncio.Future[None]] = {}  # rendezvous builds, by step
        self.built = 0  # states snapshotted on request, serialised and hashed (tests, metrics)
        self.servicer = StreamServicer(swarm.host)

    @classmethod
    async def create(cls, swarm: Swarm, *, max_bytes: int = 8 * 2**30) -> StateDonor:
        puller = await Puller.create(
            swarm.host, ContentStore(max_bytes), swarm.bandwidth, protocol=STATE_PULL_PROTOCOL
        )
        self = cls(swarm, puller)
        await self.servicer.add(self.route())
        return self

    def route(self) -> StreamRoute:
        """``STATE_MANIFEST_PROTOCOL``: one 12-byte ask a stream; building the offer may take
        ``_SERVE_TIMEOUT_S``, sending the manifest as long again."""
        return StreamRoute(
            STATE_MANIFEST_PROTOCOL, STATE_ASK_BYTES, self._answer, _SERVE_TIMEOUT_S, 3 * _SERVE_TIMEOUT_S
        )

    def offer(self, step: int, blob: bytes, *, chunk_bytes: int | None = None) -> StateManifest:
        """Offer ``blob`` of ``step`` from now on (cost: two sha256 passes). The chunks of the last
        ``keep`` offers stay servable, so a newcomer that read the manifest just before this call
        can still fetch it (memory: up to ``keep`` states). Raises ValueError for an empty blob."""
        ident: Identity = self.swarm.identity
        prepared = _prepare(ident, self.swarm.run_id, step, blob, chunk_bytes or self.chunk_bytes)
        return self._install(prepared, now=True)

    def serve_from(self, step: Callable[[], int], snapshot: Snapshot, at: SnapshotAt | None = None) -> None:
        """Offer the owner's state on request from now on. ``step()`` is the step of the state the
        owner holds now (cheap, called per request); ``await snapshot()`` returns ``(step, blob)``
        of a consistent moment (e.g. the next step boundary). A request finds the offer current
        when its step equals ``step()``; else the first one snapshots, hashes (worker thread)
        and signs, and concurrent requests share that build. ``at``: the state at a given
        step's boundary (``Replica.state_at``), for the asks that name one (module doc); without
        it they are answered as asks for now. Cost when nobody asks: none."""
        self._source, self._at = (step, snapshot), at

    async def current(self) -> StateManifest | None:
        """The manifest of the newest state offered (with a source whose step moved past the
        installed offer, a new one is snapshotted and built now); None before any offer.

        Raises what the snapshot raises; ValueError for an empty blob.
        """
        if self._source is not None and (self._current is None or self._current.step != self._source[0]()):
            if self._building is None or self._building.done():
                self._building = asyncio.ensure_future(self._build(self._source[1]))
                self._building.add_done_callback(_retrieve)
            await asyncio.shield(self._building)
        return self._current

    async def _build(self, snapshot: Snapshot) -> None:
        step, blob = await snapshot()
        ident: Identity = self.swarm.identity
        prepared = await asyncio.to_thread(_prepare, ident, self.swarm.run_id, step, blob, self.chunk_bytes)
        if self._current is None or self._current.step <= step:
            self._install(prepared)
            self.built += 1

    async def at(self, step: int) -> bytes | None:
        """The packed manifest of our state at ``step`` (module doc: the rendezvous), or None
        when we cannot offer that step (past it and not kept, too far ahead, not reached in
        ``RENDEZVOUS_WAIT_S``, or no ``at`` source). Concurrent asks share one build."""
        if step in self._kept:
            return self._kept[step]
        if self._at is None or self._source is None:
            return None
        if not 0 <= step - self._source[0]() <= MAX_RENDEZVOUS_STEPS:
            return None
        if step not in self._meeting:
            self._meeting[step] = asyncio.ensure_future(self._build_at(self._at, step))
            self._meeting[step].add_done_callback(_retrieve)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._meeting[step]), RENDEZVOUS_WAIT_S)
        return self._kept.get(step)

    async def _build_at(self, at: SnapshotAt, step: int) -> None:
        try:
            got = await asyncio.wait_for(at(step), RENDEZVOUS_WAIT_S)
            if got is None:
                return
            ident: Identity = self.swarm.identity
            prepared = await asyncio.to_thread(_prepare, ident, self.swarm.run_id, *got, self.chunk_bytes)
            self._install(prepared)
            self.built += 1
        finally:
            self._meeting.pop(step, None)

    def _install(self, prepared: _Prepared, *, now: bool = False) -> StateManifest:
        """Serve ``prepared``: as the offer of now when ``now`` or no later step's offer is in;
        the ``keep`` newest offers (and the one of now) stay servable."""
        step, store = prepared.manifest.step, self.puller.store
        steps = sorted({*self._installed, step})
        self._installed = sorted({*steps[-self.keep :], step}) if now else steps[-self.keep :]
        store.evict_before(min(self._installed))
        self._kept = {s: m for s, m in self._kept.items() if s in self._installed}
        if step in self._installed:
            for digest, data in prepared.parts:
                store.put(data, step, digest=digest)
            self._kept[step] = prepared.packed
        if now or self._current is None or self._current.step <= step:
            self._manifest, self._current = prepared.packed, prepared.manifest
        return prepared.manifest

    async def _answer(self, call: StreamCall) -> bytes:
        """The manifest of the state at the step asked for, else of the one offered now, or
        none. Raises Rejected for a request that is no ask."""
        step = decode_state_ask(call.request)
        with contextlib.suppress(Exception):  # a snapshot that cannot be built: offer none
            if step and (packed := await self.at(step)) is not None:
                return encode_state_answer(packed)
            await asyncio.wait_for(self.current(), _SERVE_TIMEOUT_S)
        return encode_state_answer(self._manifest)

    async def close(self) -> None:
        await self.puller.close()
        await self.servicer.close()


async def ask_manifest(swarm: Swarm, donor: PeerID, timeout: float, *, at: int = 0) -> StateManifest | None:
    """The signed state manifest ``donor`` offers for step ``at`` (0: now; module doc), or None
    when it offers none, does not answer within ``timeout`` seconds, or answers with one that
    does not verify."""

    async def read(reader: asyncio.StreamReader) -> StateManifest | None:
        n = decode_state_answer_length(await reader.readexactly(STATE_ANSWER_HEADER_BYTES))
        if n is None:
            return None
        data = await reader.readexactly(n)
        return open_state_manifest(data, run_id=swarm.run_id, sender=donor.to_bytes())

    try:
        ask_bytes = encode_state_ask(at)
        return await ask(swarm.host.control_path, donor, STATE_MANIFEST_PROTOCOL, ask_bytes, read, timeout)
    except (StreamError, ProtocolError):  # late, unreachable, no handler, or a bad manifest
        return None


async def fetch_state(
    swarm: Swarm,
    donors: Sequence[PeerID],
    *,
    timeout: float = 600.0,
    per_donor: int = 2,
    cache_dir: str | os.PathLike[str] | None = None,
    max_size: int = 16 * 2**30,
    progress: Progress | None = None,
    newer_than: int | None = None,
    quorum: int = 2,
    admitted: Admitted | None = None,
    max_step: int | None = None,
    bound: Callable[[], Awaitable[int | None]] | None = None,
    at: int = 0,
) -> tuple[StateManifest, bytes]:
    """Fetch the state a quorum of the ``donors`` agree on (:func:`choose_root`); returns its
    manifest and the blob.

    Only distinct donors that ``admitted`` accepts (all, without it) are asked; the root needs
    ``min(quorum, donors asked)`` of them; an offer past ``max_step`` (the newest step the swarm
    is known to have reached) does not count, nor one past what ``bound()`` returns (None: no
    bound) when awaited *after* the offers came: the steps the peers vouch for then, so an
    honest donor's offer is never past it however fast the swarm steps, and a liar's far step
    is. ``at``: the step whose state the donors are asked for (the rendezvous, module doc; 0:
    the state each holds now). With ``newer_than``, only the manifests are asked for when the
    agreed state is not above it (``NoNewerState``): nothing is downloaded for a state the
    caller would not adopt.

    Raises: NoNewerState, NoQuorum (no root has a quorum: retry later), PullError (no donor
    offers a state, or a chunk no donor could deliver), PullTimeout (``timeout`` passed;
    verified chunks stay in ``cache_dir`` for a resume).
    """
    deadline = time.monotonic() + timeout
    unique = list({d.to_bytes(): d for d in donors}.values())  # one vote per peer id
    if admitted is not None:
        unique = [d for d in unique if admitted(d.to_bytes())]
    asked = await asyncio.gather(*(ask_manifest(swarm, d, min(30.0, timeout), at=at) for d in unique))
    offers = [m for m in asked if m is not None and m.size <= max_size]
    if not offers:
        raise PullError(f"none of {len(donors)} donor(s) offered a state")
    if bound is not None and (vouched := await bound()) is not None:
        max_step = vouched if max_step is None else min(max_step, vouched)
    manifest = choose_root(offers, quorum=min(quorum, len(unique)), max_step=max_step)
    if newer_than is not None and manifest.step <= newer_than:
        raise NoNewerState(
            f"the state {len(offers)} donor(s) agree on is at step {manifest.step} <= {newer_than}"
        )
    sources = [PeerID(m.peer_id) for m in offers if m.root == manifest.root and m.chunks == manifest.chunks]
    cache = Path(cache_dir) if cache_dir is not None else None
    chunks = _load_cached(cache, manifest)
    done = sum(len(c) for c in chunks.values())
    if progress:
        progress(done, manifest.size)
    puller = Puller(
        swarm.host, ContentStore(2**62), swarm.bandwidth, serve_timeout_s=0, protocol=STATE_PULL_PROTOCOL
    )
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(manifest.chunks)):
        if i not in chunks:
            queue.put_nowait(i)
    failures: Counter[int] = Counter()

    async def worker(slot: int) -> None:
        nonlocal done
        while not queue.empty():
            i = queue.get_nowait()
            order = sources[slot % len(sources) :] + sources[: slot % len(sources)]
            donor = order[failures[i] % len(order)]
            try:
                n, left = manifest.chunk_size(i), max(0.1, deadline - time.monotonic())
                data = await puller.fetch(donor, manifest.chunks[i], max_bytes=n, size=n, timeout=left)
            except (PullError, Rejected) as e:
                failures[i] += 1
                if isinstance(e, PullTimeout):
                    raise
                if failures[i] >= 2 * len(sources):
                    raise PullError(f"state chunk {i} could not be fetched: {e}") from e
                queue.put_nowait(i)
                continue
            puller.store.evict_before(2**63)  # chunks live in `chunks` (and on disk), not in the store
            chunks[i] = data
            _save_cached(cache, manifest.chunks[i], data)
            done += len(data)
            if progress:
                progress(done, manifest.size)

    tasks = [asyncio.ensure_future(worker(s)) for s in range(per_donor * len(sources))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    blob = b"".join(chunks[i] for i in range(len(manifest.chunks)))
    if hashlib.sha256(blob).digest() != manifest.sha256:
        raise Rejected(RejectCode.MALFORMED, "state sha256 differs from the manifest")
    return manifest, blob


def choose_root(
    offers: Sequence[StateManifest], *, quorum: int, max_step: int | None = None
) -> StateManifest:
    """The manifest of the root (step, sha256) that most distinct donors offer, if at least
    ``quorum`` of them do (ties: the newer step, then the smaller sha, the same on every node).

    One vote per signer; offers past ``max_step`` are void. The newest step alone decides
    nothing, so a donor lying about its step (or serving a state of its own) is outvoted by
    any honest quorum. Raises NoQuorum. Cost: O(offers).
    """
    by_peer = {m.peer_id: m for m in offers if max_step is None or m.step <= max_step}
    votes = Counter(m.root for m in by_peer.values())
    if not votes:
        steps = sorted(m.step for m in offers)
        raise NoQuorum(f"none of {len(offers)} state offer(s) (steps {steps}) is at or below step {max_step}")
    root = min(votes, key=lambda r: (-votes[r], -r[0], r[1]))
    if votes[root] < max(1, quorum):
        seen = ", ".join(f"{step}:{sha.hex()[:8]} x{n}" for (step, sha), n in sorted(votes.items()))
        raise NoQuorum(
            f"the best-backed state (step {root[0]}) has {votes[root]} of the {max(1, quorum)} donors needed"
            f" (offers by step:sha256: {seen})"
        )
    return next(m for m in by_peer.values() if m.root == root)


def _load_cached(cache: Path | None, manifest: StateManifest) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    if cache is None:
        return out
    for i, sha in enumerate(manifest.chunks):
        path = cache / sha.hex()
        with contextlib.suppress(OSError):
            if path.stat().st_size == manifest.chunk_size(i):
                data = path.read_bytes()
                if hashlib.sha256(data).digest() == sha:
                    out[i] = data
    return out


def _save_cached(cache: Path | None, sha: bytes, data: bytes) -> None:
    if cache is None:
        return
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".part-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, cache / sha.hex())


def describe(manifest: StateManifest) -> str:
    """One line for logs: step, size, chunk count and signer."""
    who = peer_id_to_b58(manifest.peer_id)
    return f"state step {manifest.step}: {manifest.size} bytes in {len(manifest.chunks)} chunks from {who}"
