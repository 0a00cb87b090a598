"""Session-wide fixtures: a reaper that kills any child process a test leaves behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psutil
import pytest


@pytest.fixture(autouse=True, scope="session")
def _reap_children() -> Iterator[None]:
    yield
    me = psutil.Process(os.getpid())
    children = me.children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(children, timeout=10)
