"""The project's error tree, rooted in one error.

    DistroError                      every error this project raises on purpose
    ├── ProtocolError                a message broke the wire protocol
    │   └── Rejected                 a peer's message refused, with a RejectCode
    ├── KernelError                  bad arguments to a numeric kernel (shapes, k, chunk)
    ├── ConfigError                  a configuration value a user gave is invalid
    └── (each package adds its own subtree: CoordinatorError, NodeError, ...)

Errors carry context (run id, peer id, step) where they have it, and the message says what
to do next when a user can act on it.
"""

from __future__ import annotations

__all__ = ["ConfigError", "DistroError", "KernelError", "ProtocolError"]


class DistroError(Exception):
    """Root of every error distro-node raises on purpose."""


class ProtocolError(DistroError):
    """A message broke the wire protocol."""


class KernelError(DistroError, ValueError):
    """Bad arguments to a numeric kernel: a shape, chunk size, k or coding it cannot handle."""


class ConfigError(DistroError, ValueError):
    """A configuration value given by a user or an operator is invalid."""
