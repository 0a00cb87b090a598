"""``Membership.first_announce``: the first record is tried again when no DHT node stored it
(right after the DHT join the routing table may not reach one yet), and the error comes after
the last try (the node then starts alone). DHT and host are fakes: this is the retry only; the
real DHT is in tests/integration/test_p2p_swarm.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from distronet.node.swarm.errors import MembershipError
from distronet.node.swarm.membership import Membership, MembershipConfig
from distronet.protocol.identity import Identity


class _DHT:
    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.stores = answers, 0

    async def store(self, *args: Any, **kw: Any) -> bool:
        self.stores += 1
        return self.answers.pop(0)


class _Host:
    config = SimpleNamespace(call_timeout_s=5.0)

    async def maddrs(self) -> list[str]:
        return ["/ip4/127.0.0.1/tcp/1"]


def _membership(answers: list[bool]) -> tuple[Membership, _DHT]:
    dht = _DHT(answers)
    return Membership(_Host(), Identity.generate(), dht, MembershipConfig(run_id="r")), dht  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_first_record_nobody_stored_is_tried_again() -> None:
    m, dht = _membership([False, True])
    await m.first_announce()
    assert dht.stores == 2


@pytest.mark.asyncio
async def test_after_the_last_try_the_error_is_raised() -> None:
    m, dht = _membership([False, False])
    with pytest.raises(MembershipError, match="no DHT node stored"):
        await m.first_announce(tries=2)
    assert dht.stores == 2
