"""Shared fixtures: a reaper that kills any child process a test leaves behind; one torch thread;
MLX required (skip locally, fail under CI). And the pytest-xdist groups (``make test`` runs the
suite on two workers; docs/decisions/parallel-tests.md): see :func:`pytest_collection_modifyitems`."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections.abc import Iterator

import psutil
import pytest
import torch

# Tests that share a host-wide resource no fixture can give each xdist worker its own copy of:
# network namespaces, veths, bridges and their subnets (``netns``), and NAT namespaces (``nat``);
# and the chaos tests, each several node processes training at once for about a minute, which
# would halve each other's CPU (two never overlap: the other worker runs lighter tests meanwhile).
# Every test with one of these markers lands in one xdist group, so no two ever run at once.
SERIAL_MARKERS = ("netns", "nat", "chaos")
SERIAL_GROUP = "host-network-and-chaos"


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test uses a fixture (its event loop included) shared by its module or class."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "class") for defs in info.name2fixturedefs.values() for d in defs)


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, torch's intra-op pool gets this worker's share of the cores: with two
    workers on two cores each pool of two threads would spin against the other worker's (an
    in-process swarm test ran past its 5-minute timeout so, on a machine loaded by others too)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 0:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups off the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """xdist groups (used by ``--dist loadgroup``; without xdist a group marker does nothing):

    - ``host-network-and-chaos``: every test marked ``netns``, ``nat`` or ``chaos``
      (:data:`SERIAL_MARKERS`).
    - one group per module for a module whose tests share a module- or class-scoped fixture
      (a p2pd swarm, a module's event loop), so that fixture is set up once, on one worker.

    A test's own ``xdist_group`` marker is kept."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if any(item.get_closest_marker(m) is not None for m in SERIAL_MARKERS):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
        elif _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


_groups_dropped: list[str] = []  # why, when this worker's xdist ignored the groups


@pytest.hookimpl(trylast=True)  # after xdist's, which appends "@<group>" to a grouped test's id
def pytest_collection_finish(session: pytest.Session) -> None:
    """Notice when this pytest/xdist pair dropped the groups (pyproject's pin on pytest): the
    grouped tests would then run side by side, so each of them fails instead (in setup)."""
    if not getattr(session.config.option, "loadgroup", False):
        return  # not a --dist loadgroup worker
    if any("@" not in i.nodeid for i in session.items if i.get_closest_marker("xdist_group") is not None):
        _groups_dropped.append(
            f"pytest-xdist {importlib.metadata.version('pytest-xdist')} with pytest {pytest.__version__} "
            "ignores xdist_group (see the pytest pin in pyproject.toml)"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _groups_dropped and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(_groups_dropped[0], pytrace=False)


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
