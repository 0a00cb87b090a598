"""A pull gives each source a share of the time left, so a stalled producer cannot use it all."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from distronet.node.swarm.errors import PullTimeout
from distronet.node.swarm.pull import ContentStore, Puller


class _Peer:
    def __init__(self, name: str) -> None:
        self.name = name

    def to_base58(self) -> str:
        return self.name


ME = _Peer("me")


def _puller(fetch: Any) -> Puller:
    p = object.__new__(Puller)
    p.store, p.host = ContentStore(), SimpleNamespace(peer_id=ME)  # type: ignore[assignment]
    p.fetch = fetch  # type: ignore[method-assign]
    return p


async def test_a_stalled_first_source_leaves_time_for_the_next() -> None:
    asked: list[tuple[str, float]] = []

    async def fetch(peer: _Peer, digest: bytes, *, timeout: float, **_: Any) -> bytes:
        asked.append((peer.name, timeout))
        if peer.name == "stalled":  # a SIGSTOPped producer: the stream opens, nothing comes
            await asyncio.sleep(timeout)
            raise PullTimeout(f"{peer.name} took over {timeout:.2f} s")
        return b"frame"

    puller = _puller(fetch)
    t0 = time.monotonic()
    sources = [_Peer("stalled"), ME, _Peer("good")]
    got = await puller.pull(b"d" * 32, sources, max_bytes=10, timeout=1.0)
    assert got == b"frame"
    assert [name for name, _ in asked] == ["stalled", "good"]  # ourselves skipped
    assert asked[0][1] == pytest.approx(0.5, abs=0.05)  # half the time for the first of two sources
    assert time.monotonic() - t0 < 0.9


async def test_every_source_stalled_is_a_timeout() -> None:
    async def fetch(peer: _Peer, digest: bytes, *, timeout: float, **_: Any) -> bytes:
        await asyncio.sleep(timeout)
        raise PullTimeout(f"{peer.name} took over {timeout:.2f} s")

    with pytest.raises(PullTimeout) as err:
        await _puller(fetch).pull(b"d" * 32, [_Peer("a"), _Peer("b"), _Peer("c")], max_bytes=10, timeout=0.3)
    assert set(err.value.causes) == {"a", "b", "c"}


async def test_a_fetch_ending_in_an_error_after_its_pull_stopped_waiting_logs_nothing() -> None:
    # when a pull is cancelled (a round's gather cancels the rest once one frame failed), the
    # fetch it waited on can still end in an error of its own (here: while it winds down);
    # wait_for has stopped listening by then, and asyncio used to log "Task exception was never
    # retrieved" for it (seen in chaos 3's node logs)
    import gc

    from distronet.node.swarm.errors import PullError

    async def failing(*_: Any) -> bytes:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise PullError("stream reset while closing") from None
        return b""

    p = object.__new__(Puller)
    p.store = ContentStore()
    p._fetch = failing  # type: ignore[method-assign]
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx))
    try:
        outer = asyncio.ensure_future(p.fetch(_Peer("a"), b"d" * 32, max_bytes=10, timeout=5.0))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        del outer
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert not [c for c in unretrieved if "never retrieved" in str(c.get("message"))], unretrieved
