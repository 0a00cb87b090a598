"""Catch-up's refusal of a state it was handed (``state.py``, ``guard_state.py``)::

    ConfigError (protocol.errors)
    └── StateRefused    a state blob, or a checkpoint's guard history, is malformed or does not
                        fit this run's model, optimizer and robustness settings

A leaf module, so that the blob (``state.py``) and the guard's history (``guard_state.py``) share
it without importing each other.
"""

from __future__ import annotations

from distronet.protocol.errors import ConfigError

__all__ = ["StateRefused"]


class StateRefused(ConfigError):
    """A peer's state blob is malformed or does not fit this run's model and optimizer."""
