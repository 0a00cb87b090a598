"""The coordinator's error subtree.

DistroError
└── CoordinatorError        anything the coordinator raises on purpose
    ├── StoreError          (store.base) the database could not be opened, migrated or written
    └── RunConfigError      a run file (TOML) or run definition is invalid
"""

from __future__ import annotations

from distronet.protocol.errors import ConfigError, DistroError

__all__ = ["CoordinatorError", "RunConfigError"]


class CoordinatorError(DistroError):
    """Anything the coordinator raises on purpose."""


class RunConfigError(CoordinatorError, ConfigError):
    """A run file or run definition is invalid; the message names the field."""
