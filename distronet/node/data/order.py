"""Reproducible data order: which (B, T) windows a peer trains on at each step.

A peer's batch at step ``t`` is a pure function of ``(seed, shard id, peer, t)``: window
starts are drawn from a PCG64 stream keyed by ``SeedSequence([seed, shard key, peer, t])``.
Only PCG64's raw 64-bit output is used (start = raw mod number of starts), never a
``Generator`` method, because numpy fixes the raw stream but not the algorithms behind
``Generator.integers``; so two machines with any numpy version draw the same windows. Random
access by step means a restarted peer resumes its order without replaying it. The modulo bias
is below 2**-40 for any shard under a terabyte.

Validation windows are evenly spaced over the held-out tokens, the same for every optimizer
and every peer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from distronet.protocol.errors import ConfigError

__all__ = ["BatchOrder", "shard_key", "validation_windows", "windows_to_xy"]


def shard_key(shard_id: str) -> tuple[int, int]:
    """Two 32-bit words from sha256(shard id): the shard's part of the order's seed."""
    h = hashlib.sha256(shard_id.encode("utf-8")).digest()
    return int.from_bytes(h[0:4], "little"), int.from_bytes(h[4:8], "little")


def windows_to_xy(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split windows ``(B, T + 1)`` into inputs ``(B, T)`` and next-token targets ``(B, T)``, int64."""
    w = windows.astype(np.int64, copy=False)
    return w[:, :-1], w[:, 1:]


@dataclass(frozen=True)
class BatchOrder:
    """The order one peer reads one shard in.

    ``tokens`` is the shard (1-D uint8/uint16 array), ``batch`` windows of ``seq_len + 1``
    tokens are drawn per step (``seq_len`` inputs and the targets shifted by one).
    """

    tokens: np.ndarray
    shard_id: str
    seed: int
    peer: int
    batch: int
    seq_len: int

    def __post_init__(self) -> None:
        if self.tokens.ndim != 1:
            raise ConfigError(f"shard {self.shard_id!r}: tokens must be 1-D, got shape {self.tokens.shape}")
        if self.seed < 0 or self.peer < 0:
            raise ConfigError(f"seed and peer must be >= 0, got seed={self.seed} peer={self.peer}")
        if self.batch < 1 or self.seq_len < 1:
            raise ConfigError(f"batch and seq_len must be >= 1, got {self.batch}, {self.seq_len}")
        if self.tokens.size < self.seq_len + 1:
            raise ConfigError(
                f"shard {self.shard_id!r} holds {self.tokens.size} tokens, fewer than one window of "
                f"{self.seq_len + 1}"
            )

    def starts(self, step: int) -> np.ndarray:
        """Window start offsets ``(batch,)`` int64 for ``step`` (>= 0)."""
        if step < 0:
            raise ConfigError(f"step must be >= 0, got {step}")
        lo, hi = shard_key(self.shard_id)
        seq = np.random.SeedSequence([self.seed, lo, hi, self.peer, step])
        raw = np.random.PCG64(seq).random_raw(self.batch)  # (batch,) uint64, stable across numpy versions
        n_starts = self.tokens.size - self.seq_len  # a window of seq_len + 1 fits at 0 .. n_starts - 1
        return (raw % np.uint64(n_starts)).astype(np.int64)

    def windows(self, step: int) -> np.ndarray:
        """The batch at ``step`` as windows ``(batch, seq_len + 1)`` of the shard's dtype."""
        offsets = self.starts(step)[:, None] + np.arange(self.seq_len + 1)  # (B, T + 1)
        return self.tokens[offsets]

    def xy(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets ``(batch, seq_len)`` int64 for ``step``."""
        return windows_to_xy(self.windows(step))


def validation_windows(tokens: np.ndarray, count: int, seq_len: int) -> np.ndarray:
    """``count`` windows ``(count, seq_len + 1)`` evenly spaced over ``tokens`` (deterministic).

    Windows do not overlap when ``tokens`` holds at least ``count * (seq_len + 1)`` tokens.
    """
    if count < 1 or seq_len < 1:
        raise ConfigError(f"count and seq_len must be >= 1, got {count}, {seq_len}")
    last = tokens.size - (seq_len + 1)
    if last < 0:
        raise ConfigError(f"{tokens.size} validation tokens are fewer than one window of {seq_len + 1}")
    starts = np.linspace(0, last, count).astype(np.int64)  # (count,)
    windows: np.ndarray = tokens[starts[:, None] + np.arange(seq_len + 1)]  # (count, T + 1)
    return windows
