"""`distro-node doctor`'s calls to the coordinator: the run's definition, and the transfer rate.

:func:`fetch_run` reads ``GET /api/v1/runs/{run}`` (a few KB: the data manifest comes
summarised), at most ``MAX_RUN_INFO_BYTES``. :func:`measure_link` times ``probes`` downloads
and uploads of ``probe_bytes`` each through the coordinator's probe
(``GET``/``POST /api/v1/runs/{run}/probe``, docs/protocol.md §11) after one small call that opens
the connection, and reports the median rate each way. Every call has a deadline.

Errors::

    DistroError
    └── DoctorError            ``exit_code`` says which ``ExitCode``
        ├── CoordinatorDown    no answer, a timeout, a 5xx or 429 (exit 3)
        └── RunNotFound        the coordinator has no such run (exit 4)
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import statistics
import time
from typing import Any

import aiohttp

from distronet.node.doctor.verdict import Link
from distronet.node.exitcodes import ExitCode
from distronet.protocol.coordinator_api import API_PREFIX
from distronet.protocol.errors import DistroError
from distronet.protocol.limits import MAX_PROBE_BYTES

__all__ = [
    "MAX_RUN_INFO_BYTES",
    "CoordinatorDown",
    "DoctorError",
    "RunNotFound",
    "fetch_run",
    "measure_link",
]

MAX_RUN_INFO_BYTES = 1 << 20  # a run's definition is a few KB; a larger answer is not one
CALL_TIMEOUT_S = 10.0  # per call; a probe of 4 MiB at 10 Mbit/s takes ~3.4 s


class DoctorError(DistroError):
    """The doctor cannot go on; ``exit_code`` is the process's."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CoordinatorDown(DoctorError):
    def __init__(self, url: str, why: str) -> None:
        super().__init__(
            f"coordinator {url} is unreachable ({why}); check the URL and that it is running",
            ExitCode.COORDINATOR_UNREACHABLE,
        )


class RunNotFound(DoctorError):
    def __init__(self, url: str, run_id: str) -> None:
        super().__init__(
            f"coordinator {url} has no run {run_id!r}; `GET {url}{API_PREFIX}/runs` lists them",
            ExitCode.REJECTED,
        )


async def _read(r: aiohttp.ClientResponse, limit: int) -> bytes:
    if r.content_length is not None and r.content_length > limit:
        raise DoctorError(
            f"the coordinator's answer of {r.content_length} bytes is over {limit}", ExitCode.ERROR
        )
    buf = bytearray()
    async for chunk in r.content.iter_any():
        buf += chunk
        if len(buf) > limit:
            raise DoctorError(f"the coordinator's answer is over {limit} bytes", ExitCode.ERROR)
    return bytes(buf)


async def _call(
    http: aiohttp.ClientSession, url: str, run_id: str, method: str, path: str, **kw: Any
) -> bytes:
    """One call; the body (at most ``MAX_RUN_INFO_BYTES``, or ``MAX_PROBE_BYTES`` for a probe).
    Raises ``CoordinatorDown`` / ``RunNotFound`` / ``DoctorError``."""
    limit = MAX_PROBE_BYTES if path.endswith("/probe") else MAX_RUN_INFO_BYTES
    try:
        async with http.request(method, url + API_PREFIX + path, **kw) as r:
            body = await _read(r, limit)
            status = r.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise CoordinatorDown(url, f"{type(e).__name__}: {e}".rstrip(": ")) from e
    if status < 400:
        return body
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])[:200]
    except (ValueError, KeyError, TypeError):
        code, message = "", body[:200].decode(errors="replace")
    if status == 404 and code == "not_found":
        raise RunNotFound(url, run_id)
    if status >= 500 or status == 429:
        raise CoordinatorDown(url, f"{status} {code}: {message}")
    raise DoctorError(
        f"coordinator {url} refused {method} {path} ({status} {code}): {message}", ExitCode.REJECTED
    )


def _session() -> aiohttp.ClientSession:
    # auto_decompress off: the probe's bytes are timed as they arrive
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S), auto_decompress=False)


async def fetch_run(url: str, run_id: str) -> dict[str, Any]:
    """The run's definition as `distro-node join` reads it. Raises ``DoctorError`` (above)."""
    async with _session() as http:
        body = await _call(http, url, run_id, "GET", f"/runs/{run_id}")
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise DoctorError(f"coordinator {url}: the run's definition is not JSON ({e})", ExitCode.ERROR) from e
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(k), dict) for k in ("model", "optimizer", "exchange")
    ):
        raise DoctorError(
            f"coordinator {url}: run {run_id!r} has no model/optimizer/exchange tables", ExitCode.ERROR
        )
    return doc


async def measure_link(url: str, run_id: str, probe_bytes: int, probes: int) -> Link:
    """Median download and upload rates (payload bytes/s) over ``probes`` transfers of
    ``probe_bytes`` each way; none (``Link.note`` says why) from a coordinator without the probe.
    Raises ``DoctorError`` (above), ``ValueError`` for sizes out of range."""
    if not 1 <= probe_bytes <= MAX_PROBE_BYTES or not 1 <= probes <= 10:
        raise ValueError(f"probe_bytes must be in 1..{MAX_PROBE_BYTES} and probes in 1..10")
    path = f"/runs/{run_id}/probe"
    payload = os.urandom(probe_bytes)  # noise, as the download: nothing on the way compresses it
    down: list[float] = []
    up: list[float] = []
    async with _session() as http:
        try:  # opens the connection
            await _call(http, url, run_id, "GET", path, params={"bytes": "1"})
        except RunNotFound:  # the run was just read: an older coordinator, without the probe
            return Link(url, None, None, 0, 0, "this coordinator serves no transfer probe (an older version)")
        for _ in range(probes):
            t0 = time.perf_counter()
            got = await _call(http, url, run_id, "GET", path, params={"bytes": str(probe_bytes)})
            down.append(len(got) / max(time.perf_counter() - t0, 1e-9))
            t0 = time.perf_counter()
            await _call(http, url, run_id, "POST", path, data=io.BytesIO(payload))
            up.append(probe_bytes / max(time.perf_counter() - t0, 1e-9))
    return Link(url, statistics.median(down), statistics.median(up), probe_bytes, probes)
