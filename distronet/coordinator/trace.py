"""Where a slow call's time goes: an opt-in timeline of hot calls, commits, GC and loop stalls.

Off unless the environment names a file: ``DISTRO_COORD_TRACE=/path/trace.json``. Then the
coordinator records, with ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, so comparable with
a load generator's timestamps in another process):

- per hot call: when its first bytes reached the event loop, when its handling started and
  ended, which group commit it waited for, when its answer was written, its peer and nonce
  (to match the generator's record of the same call);
- per group commit: when the writer took the batch, when the SQLite writer started it, ran its
  statements, finished ``COMMIT`` (the fsync), when the loop saw it done, and its rows;
- every cyclic-GC pass (generation, start, duration, thread CPU, objects collected) via
  ``gc.callbacks``;
- event-loop stalls: a 1 ms ticker's lateness when over 2 ms, and the event-loop thread's CPU
  time meanwhile (near the lateness: our own code ran that long; near 0: the thread waited for
  a CPU or the GIL);
- the checkpointer's passes (start, duration) if it runs in the traced process; it runs in
  the SQLite writer child, which does not trace, so a served coordinator records none.

:func:`dump` writes it all as one JSON object (at :meth:`CoordinatorApp.close`). Cost while
off: one attribute test per call site.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
from typing import Any

__all__ = ["TRACE", "Trace"]

ENV = "DISTRO_COORD_TRACE"
STALL_TICK_S = 0.001
STALL_REPORT_S = 0.002


class Trace:
    """Collects the timeline; every method is cheap and safe from any thread (list appends)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.on = path is not None
        self.calls: list[tuple[Any, ...]] = []
        self.commits: list[tuple[Any, ...]] = []
        self.gcs: list[tuple[int, float, float, float, int]] = []
        self.stalls: list[tuple[float, float, float]] = []
        self.checkpoints: list[tuple[float, float]] = []
        self._gc_t0 = self._gc_c0 = 0.0
        self._ticker: asyncio.Task[None] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Hook the GC and start the stall ticker (inside the running loop)."""
        if not self.on or self._ticker is not None:
            return
        gc.callbacks.append(self._gc)
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="trace-ticker")

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0, self._gc_c0 = time.perf_counter(), time.thread_time()
        else:
            t, c = time.perf_counter() - self._gc_t0, time.thread_time() - self._gc_c0
            self.gcs.append(
                (int(info.get("generation", -1)), self._gc_t0, t, c, int(info.get("collected", 0)))
            )

    async def _tick(self) -> None:
        clock, cpu = time.perf_counter, time.thread_time
        while True:
            t, c = clock(), cpu()
            await asyncio.sleep(STALL_TICK_S)
            late = clock() - t - STALL_TICK_S
            if late > STALL_REPORT_S:
                self.stalls.append((t, late, cpu() - c))

    def call(self, *fields: Any) -> None:
        self.calls.append(fields)

    def commit(self, *fields: Any) -> None:
        self.commits.append(fields)

    def checkpoint(self, t0: float, seconds: float) -> None:
        self.checkpoints.append((t0, seconds))

    def dump(self) -> None:
        """Write the timeline to the file (once); stop the hooks."""
        if not self.on or self.path is None:
            return
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        with self._lock:
            data = {
                "calls_fields": [
                    "route", "recv", "start", "handled", "batch", "written", "status", "peer", "nonce",
                ],
                "calls": self.calls,
                "commits_fields": [
                    "batch", "picked", "thread_start", "statements_done", "commit_done", "thread_cpu",
                    "loop_back", "rows",
                ],
                "commits": self.commits,
                "gc": self.gcs,
                "stalls": self.stalls,
                "checkpoints": self.checkpoints,
                "young_types": _census(),
            }  # fmt: skip
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
            self.on = False


def _census() -> list[tuple[str, int]]:
    """The 20 commonest types among the objects the cyclic GC still tracks (not frozen)."""
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        name = type(obj).__name__
        counts[name] = counts.get(name, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:20]


TRACE = Trace(os.environ.get(ENV) or None)
"""The process's trace (off unless ``DISTRO_COORD_TRACE`` names a file)."""
