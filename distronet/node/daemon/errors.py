"""The daemon's errors and its one rule for calls across a process boundary: each has a deadline.

Kept apart from ``node.py`` so that the loops (``loops.py``) and the parts the node is built from
can raise ``NodeError`` without importing the ``Node`` that runs them.

Errors::

    DistroError
    └── NodeError              the node cannot go on; ``exit_code`` says which ``ExitCode``
        └── NodeStateError     a bad state transition (a bug)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from distronet.node.exitcodes import ExitCode
from distronet.protocol.errors import DistroError

__all__ = ["CALL_S", "NodeError", "NodeStateError", "deadline"]

T = TypeVar("T")
CALL_S = 15.0  # deadline of one call to the coordinator or p2pd


class NodeError(DistroError):
    """The node cannot go on. ``exit_code`` is the process exit code to use."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NodeStateError(NodeError):
    """A transition the state machine does not allow (a bug in the caller)."""


async def deadline(aw: Awaitable[T], seconds: float, what: str, code: ExitCode = ExitCode.ERROR) -> T:
    """Await ``aw`` for at most ``seconds``; raise ``NodeError(code)`` naming ``what`` if late."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:
        raise NodeError(f"{what}: no answer within {seconds:.0f} s", code) from None
