"""Whether the compiled (numba) kernels are in use in this process: one flag, set once.

Every kernel module that has a compiled path asks :func:`use_jit`; :func:`mark_warm` is called
once the compiled code is known to be ready (compiled here, or in numba's on-disk cache). Until
then the numpy/torch paths run, so a process never stalls for a first compile on a packet's
path. This module imports nothing of distronet's, so any kernel module may import it.
"""

from __future__ import annotations

import importlib.util
import threading

__all__ = ["HAVE_JIT", "mark_warm", "use_jit"]

HAVE_JIT = importlib.util.find_spec("numba") is not None
_WARM = threading.Event()  # set by mark_warm(): the compiled paths are in use in this process


def mark_warm() -> None:
    """Use the compiled paths from now on in this process: call it once they have been compiled
    here, or when numba's on-disk cache is known to hold them (the first call then loads, ~1 s)."""
    _WARM.set()


def use_jit() -> bool:
    """Whether the compiled paths run now: numba is there and :func:`mark_warm` was called.
    Until then the reference paths run: a process never stalls for the first compile (~10-40 s)."""
    return HAVE_JIT and _WARM.is_set()
