"""The swarm's error subtree (bad bytes from a peer are ``Rejected``, from the protocol tree).

DistroError
├── ProtocolError
│   └── Rejected            a peer's bytes refused (TOO_LARGE, TRUNCATED, MALFORMED: hash mismatch)
└── SwarmError              the local transport could not do what was asked
    ├── DaemonError         p2pd did not start, died, or a control call ran past its deadline
    ├── GossipError         a gossip publish/subscribe failed, or a message is over the size cap
    ├── PullError           no source delivered the content
    │   ├── PullTimeout     the pull's deadline passed
    │   ├── PullNotFound    the source answered that it does not hold it
    │   ├── PullPruned      the source answered that it held it and dropped it (retention)
    │   └── PullUnreachable no stream to the source could be opened
    ├── StreamError         a one-shot ask (servicer.ask) got no answer: unreachable, late, broken
    └── MembershipError     the DHT could not be joined or a record not stored
"""

from __future__ import annotations

from distronet.protocol.errors import DistroError

__all__ = [
    "DaemonError",
    "GossipError",
    "MembershipError",
    "PullError",
    "PullNotFound",
    "PullPruned",
    "PullTimeout",
    "PullUnreachable",
    "StreamError",
    "SwarmError",
]


class SwarmError(DistroError):
    """Root of the libp2p transport's own failures."""


class DaemonError(SwarmError):
    """p2pd did not start, died, or did not answer a control request in time."""


class GossipError(SwarmError):
    """A gossip request failed, or a message is larger than gossip may carry."""


class PullError(SwarmError):
    """No source delivered the requested content (each source's failure is in ``causes``)."""

    def __init__(self, msg: str, causes: dict[str, BaseException] | None = None) -> None:
        self.causes = dict(causes or {})
        detail = "; ".join(f"{peer}: {type(e).__name__}: {e}" for peer, e in self.causes.items())
        super().__init__(f"{msg} ({detail})" if detail else msg)


class PullTimeout(PullError):
    """A pull's deadline passed before any source delivered."""


class PullNotFound(PullError):
    """The source answered that it does not hold the content (now)."""


class PullPruned(PullError):
    """The source answered that it held the content and has dropped it (past its retention): the
    content existed, so this is no "not here" (``pull.nobody_holds``)."""


class PullUnreachable(PullError):
    """No stream to the source could be opened: it is gone, or refuses the protocol."""


class StreamError(SwarmError):
    """A one-shot ask on a direct stream got no answer: no stream could be opened, the peer was
    silent past the deadline, or the stream broke (bad bytes in an answer are ``Rejected``)."""


class MembershipError(SwarmError):
    """The run's DHT could not be joined, or our membership record could not be stored."""
