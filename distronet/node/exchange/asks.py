"""The exchange's direct asks on ``MANIFEST_PULL_PROTOCOL``: a better-ranked producer's manifest
(gossip may have lost it), serving ours, and replaying a round another replica decided.

``AsyncSwarmExchange`` (``swarm.py``) inherits these; the asks are in their own module so the
round's life cycle stays readable there. Wire forms: ``protocol/manifest_ask.py``; served
through the swarm's servicer (:meth:`ManifestAsks._serve_asks`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from distronet.node.exchange.base import Round, RoundUnavailable
from distronet.node.exchange.manifest_ask import GONE, manifest_route, request_decided, request_manifest
from distronet.node.exchange.types import ExchangeConfig, RoundState
from distronet.node.swarm.control import peer_id
from distronet.node.swarm.servicer import StreamServicer
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import peer_id_to_b58
from distronet.protocol.manifest import RoundManifest, encode_manifest

if TYPE_CHECKING:
    from distronet.node.swarm.admission import Admission
    from distronet.node.swarm.stack import Swarm

__all__ = ["ManifestAsks"]


class ManifestAsks:
    """Mixin of ``AsyncSwarmExchange``: what it needs is declared here, set there."""

    swarm: Swarm
    config: ExchangeConfig
    admission: Admission
    rejected: Counter[RejectCode]
    _rounds: dict[int, RoundState]
    _newest: int

    @property
    def peer_id(self) -> bytes:
        raise NotImplementedError

    def _round(self, step: int, *, local: bool) -> RoundState | None:
        raise NotImplementedError

    def _rank(self, step: int, peer: bytes) -> bytes:
        raise NotImplementedError

    def _open_manifest(self, data: bytes) -> RoundManifest:
        raise NotImplementedError

    def _accept_manifest(self, data: bytes, sender: bytes) -> None:
        raise NotImplementedError

    async def _fill(self, step: int, state: RoundState, manifest: RoundManifest, also: bytes = b"") -> Round:
        raise NotImplementedError

    async def _ask_better(self, step: int, state: RoundState, ranked: list[bytes], tries: int = 3) -> None:
        """Pull the manifest straight from up to ``tries`` producers ranked above the best we hold."""
        best = min((self._rank(step, m.leader) for m in state.manifests.values()), default=None)
        better = [p for p in ranked if p != self.peer_id and (best is None or self._rank(step, p) < best)]
        for peer in better[:tries]:
            got = await self._ask_manifest(step, peer, min(2.0, 4 * self.config.manifest_grace_s))
            if got and peer in state.manifests:
                return

    async def _ask_manifest(self, step: int, peer: bytes, timeout: float) -> bool:
        """Ask ``peer`` for the manifest it sealed for ``step`` and accept it; True when a valid
        one came (a bad one is counted in ``rejected``)."""
        data = await request_manifest(self.swarm.host.control_path, peer_id(peer), step, timeout)
        if data is None:
            return False
        try:
            self._accept_manifest(data, peer)
        except Rejected as e:
            self.rejected[e.code] += 1
            return False
        return True

    async def _serve_asks(self) -> StreamServicer:
        """Serve ``MANIFEST_PULL_PROTOCOL`` from this exchange's rounds; the servicer returned
        stops it (``close``). Raises DaemonError when p2pd refuses or is late."""

        def sealed(step: int) -> bytes | None:
            state = self._rounds.get(step)
            return None if state is None else state.sealed

        def decided(step: int) -> bytes | None:
            state = self._rounds.get(step)
            if state is None:
                return GONE if step <= self._newest - self.config.retention else None
            return None if state.adopted is None else encode_manifest(state.adopted)

        servicer = StreamServicer(self.swarm.host)
        await servicer.add(manifest_route(sealed, lambda: self._newest, decided))
        return servicer

    async def replay(self, step: int, sources: list[bytes], timeout: float) -> Round | None:
        """The accepted set the first of ``sources`` that answers applied for ``step``, its frames
        pulled (``node/catchup/replay.py``); None when that peer has not decided it (yet). Raises
        ``RoundUnavailable`` when the step is older than our window or the peer's, when no source
        answers with a valid manifest, or when a listed frame cannot be pulled."""
        held = self._rounds.get(step)
        if held is not None and held.decided is not None:
            return held.decided
        for peer in sources:
            if not self.admission.admits(peer):  # a round replayed only from admitted peers
                continue
            data = await request_decided(self.swarm.host.control_path, peer_id(peer), step, timeout)
            if data == GONE:
                raise RoundUnavailable(f"step {step} is older than {peer_id_to_b58(peer)}'s window")
            if data == b"":
                return None
            if data is None:
                continue
            try:
                man = self._open_manifest(data)
            except Rejected as e:
                self.rejected[e.code] += 1
                continue
            if not self.admission.admits(man.leader):
                self.rejected[RejectCode.NOT_ADMITTED] += 1
                continue
            if man.step == step:  # only now the round opens here: a probe at the tip opens none,
                state = self._round(step, local=True)  # whose deadline would then run from now
                if state is None:
                    raise RoundUnavailable(f"step {step} is older than the retention window")
                state.frozen = True
                state.decided, state.adopted = await self._fill(step, state, man, peer), man
                return state.decided
        raise RoundUnavailable(f"step {step}: none of {len(sources)} peer(s) gave the round it applied")
