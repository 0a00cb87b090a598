"""Shared fixtures: a reaper that kills any child process a test leaves behind; one torch thread;
MLX required (skip locally, fail under CI)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psutil
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _reap_children() -> Iterator[None]:
    yield
    me = psutil.Process(os.getpid())
    children = me.children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(children, timeout=10)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the test (its pool crawls on a loaded 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def require_mlx() -> None:
    """Skip when MLX does not import here; fail instead under CI, where ``.ci/run`` installs the
    ``[mlx]`` extra so the MLX tests must run."""
    from distronet.node.backends import mlx_import_error

    why = mlx_import_error()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"MLX is not installed ({why}); .ci/run installs the [mlx] extra", pytrace=False)
        pytest.skip(f"missing package: MLX not installed here ({why})")
