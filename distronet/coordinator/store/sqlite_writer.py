"""The SQLite writer, in a process of its own: commits never wait for the event loop's GIL.

On a thread of the coordinator's process, every statement of a commit gave the GIL back while
SQLite worked and had to take it back from the busy event-loop thread afterwards. Under load
that stretched commits from under a millisecond to 20-57 ms with 4-8 ms of CPU in them, and
every call of the batch waited for it. A process has its own interpreter: only a CPU core can
delay it.

Parent side: :class:`WriterProcess` (used by :class:`~.sqlite.SqliteStore`) starts
this module's :func:`main` in a new interpreter (``PATH SYNC PARENT_PID REQ_FD RESP_FD``),
sends each batch as one frame and hands the answer to the batch's ``done`` callback from an
event-loop reader (no thread, no future). Child side: :func:`main` opens the database with the
same pragmas as the parent (:func:`.sqlite_db.connect`), runs the periodic checkpointer,
commits frames strictly in order and answers each with its timing.

Frames, both ways: a 4-byte big-endian length, then msgpack. Request ``[seq, [[table, [row,
...]], ...]]``; answer ``[seq, error or None, thread_start, statements_done, commit_done,
thread_cpu]`` (``seq`` 0: the start-up answer). Only the parent writes to the child's pipe, but
lengths, tables and row widths are still checked before use.

Lifetime: the child ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; the
parent decides when to stop and closes the pipe, and the child exits after committing what it
was sent). On Linux it asks for SIGKILL when its parent dies, so a SIGKILLed coordinator leaves
no writer behind to hold the database; elsewhere it exits at the end of the pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO

import msgpack

from distronet.coordinator.store.base import TABLES, StoreError
from distronet.coordinator.store.sqlite_db import CHECKPOINT_EVERY_S, Checkpointer, Work, commit_rows, connect
from distronet.coordinator.trace import TRACE

__all__ = ["EXIT_TIMEOUT_S", "MAX_FRAME", "WriterProcess", "main"]

MAX_FRAME = 1 << 30  # one batch; a run of 200,000 shards is ~40 MB
START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 30.0
Timing = tuple[float, float, float, float]
Done = Callable[[BaseException | None], None]


# The child's command: not ``-m`` (the store package imports this module first, and runpy
# would then run a second copy of it).
_CHILD = f"import sys; from {__name__} import main; sys.exit(main(sys.argv[1:]))"


def _frame(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


class WriterProcess:
    """The parent's handle on one writer child. ``spawn`` (in the loop's thread), then
    ``wait_ready`` and at the end ``close`` block (run them off the loop); ``submit`` and the
    answers run in the event loop of the first ``submit``."""

    def __init__(self, path: str, synchronous: str) -> None:
        self.path, self.synchronous = path, synchronous
        self.proc: subprocess.Popen[bytes] | None = None
        self._req = self._resp = -1
        self._buf = bytearray()
        self._pending: deque[tuple[int, Done, Callable[[Timing], None] | None]] = deque()
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Event | None = None
        self.broken: StoreError | None = None

    # ------------------------------------------------------------------ start / stop

    def spawn(self) -> None:
        """Start the child. Call from the thread that lives longest (the event loop's): Linux
        kills the child when the thread that started it ends. Then :meth:`wait_ready`."""
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        cmd = [sys.executable, "-c", _CHILD, self.path, self.synchronous, str(os.getpid())]
        try:
            self.proc = subprocess.Popen(
                [*cmd, str(req_r), str(resp_w)], stdin=subprocess.DEVNULL, pass_fds=(req_r, resp_w)
            )
        except OSError as e:
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise StoreError(f"cannot start the SQLite writer process: {e}") from e
        os.close(req_r)
        os.close(resp_w)
        self._req, self._resp = req_w, resp_r

    def wait_ready(self) -> None:
        """Block until the child has opened the database. Raises StoreError (the child is gone)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            answers = self._parse()
            if answers:
                err = answers[0][1]
                if err is not None:
                    self._reap()
                    raise StoreError(str(err))
                break
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._resp], [], [], left)[0]:
                self._reap(kill=True)
                raise StoreError(f"the SQLite writer process did not start within {START_TIMEOUT_S:.0f} s")
            chunk = os.read(self._resp, 1 << 16)
            if not chunk:
                code = self._reap()
                raise StoreError(f"the SQLite writer process exited at start (code {code})")
            self._buf += chunk
        os.set_blocking(self._resp, False)

    def _reap(self, kill: bool = False) -> int | None:
        for fd in (self._req, self._resp):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._req = self._resp = -1
        if self.proc is None:
            return None
        if kill:
            self.proc.kill()
        try:
            return self.proc.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    async def drain(self) -> None:
        """Wait until every submitted batch is answered (or the child is gone)."""
        while self._pending and self.broken is None and self._idle is not None:
            self._idle.clear()
            await self._idle.wait()

    def close(self) -> int | None:
        """Close the pipe (the child commits what it was sent, then exits) and wait for the
        child; kill it after EXIT_TIMEOUT_S. Call after :meth:`detach` (from the loop)."""
        return self._reap()

    def detach(self) -> None:
        """Stop reading answers (in the loop, before :meth:`close`); a batch still unanswered
        (the child hung past :meth:`drain`'s wait) fails with StoreError."""
        if self._pending:
            self._fail(StoreError("the SQLite writer was closed with batches unanswered"))
        if self._loop is not None and self._resp >= 0:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._resp)
        self._loop = None

    # ------------------------------------------------------------------ commits

    def submit(self, work: Work, done: Done, on_timing: Callable[[Timing], None] | None = None) -> None:
        """Send one batch; ``done(None)`` (or ``done(StoreError)``) runs in this loop once the child
        has committed it. Batches commit in submission order. Raises StoreError when the child is
        gone (nothing was sent then)."""
        if self.broken is not None:
            raise self.broken
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._idle = asyncio.Event()
            self._loop.add_reader(self._resp, self._readable)
        self._seq += 1
        data = memoryview(_frame([self._seq, work]))
        if len(data) - 4 > MAX_FRAME:
            raise StoreError(f"a batch of {len(data)} bytes is over the writer's limit of {MAX_FRAME}")
        try:
            while data:
                data = data[os.write(self._req, data) :]
        except OSError as e:
            self._fail(StoreError(f"the SQLite writer process is gone: {e}"))
            raise self.broken from e  # type: ignore[misc]
        self._pending.append((self._seq, done, on_timing))

    def _parse(self) -> list[list[Any]]:
        out = []
        while len(self._buf) >= 4:
            n = int.from_bytes(self._buf[:4], "big")
            if n > MAX_FRAME:
                raise StoreError(f"the SQLite writer sent a frame of {n} bytes")
            if len(self._buf) < 4 + n:
                break
            msg = msgpack.unpackb(bytes(self._buf[4 : 4 + n]), raw=False)
            del self._buf[: 4 + n]
            if not isinstance(msg, list) or len(msg) != 6:
                raise StoreError("the SQLite writer sent a malformed answer")
            out.append(msg)
        return out

    def _readable(self) -> None:
        try:
            chunk = os.read(self._resp, 1 << 16)
        except BlockingIOError:
            return
        except OSError as e:
            self._fail(StoreError(f"the SQLite writer process is gone: {e}"))
            return
        if not chunk:
            code = self.proc.poll() if self.proc is not None else None
            self._fail(StoreError(f"the SQLite writer process exited (code {code})"))
            return
        self._buf += chunk
        try:
            answers = self._parse()
        except (StoreError, ValueError) as e:
            self._fail(StoreError(str(e)))
            return
        for seq, err, *timing in answers:
            if not self._pending or self._pending[0][0] != seq:
                self._fail(StoreError(f"the SQLite writer answered batch {seq} out of order"))
                return
            _, done, on_timing = self._pending.popleft()
            if on_timing is not None:
                on_timing((float(timing[0]), float(timing[1]), float(timing[2]), float(timing[3])))
            done(None if err is None else StoreError(str(err)))
        if not self._pending and self._idle is not None:
            self._idle.set()

    def _fail(self, err: StoreError) -> None:
        """The child is gone or talks nonsense: fail every batch still waiting."""
        if self.broken is None:
            self.broken = err
        pending, self._pending = self._pending, deque()
        self.detach()
        for _, done, _ in pending:
            done(err)
        if self._idle is not None:
            self._idle.set()


# ---------------------------------------------------------------------- child


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the parent dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit(0)


def _read_exact(f: BinaryIO, n: int) -> bytes | None:
    data = f.read(n)
    if len(data) < n:
        return None
    return data


def _checked(work: Any) -> Work:
    """The request's work list, shape-checked against :data:`TABLES`. Raises StoreError."""
    if not isinstance(work, list):
        raise StoreError("malformed batch")
    out: Work = []
    for item in work:
        if not (isinstance(item, list) and len(item) == 2 and item[0] in TABLES):
            raise StoreError("malformed batch entry")
        table, rows = item
        width = len(TABLES[table][0])
        if not isinstance(rows, list) or any(not isinstance(r, list) or len(r) != width for r in rows):
            raise StoreError(f"malformed rows for {table}")
        out.append((table, rows))
    return out


def main(argv: list[str]) -> int:
    """The child: ``PATH SYNC PARENT_PID REQ_FD RESP_FD``. Exit 0 at the end of the pipe."""
    path, synchronous, parent, req_fd, resp_fd = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    TRACE.on = False  # inherited DISTRO_COORD_TRACE: nothing dumps a child's trace
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent)

    def answer(seq: int, err: str | None, timing: Timing = (0.0, 0.0, 0.0, 0.0)) -> None:
        data = memoryview(_frame([seq, err, *timing]))
        while data:
            data = data[os.write(resp_fd, data) :]

    try:
        conn = connect(path, synchronous)
    except StoreError as e:
        answer(0, str(e))
        return 1
    checkpointer = Checkpointer(path, synchronous, CHECKPOINT_EVERY_S)
    checkpointer.start()
    answer(0, None)
    with os.fdopen(req_fd, "rb") as f:
        while True:
            head = _read_exact(f, 4)
            if head is None:
                break
            n = int.from_bytes(head, "big")
            if n > MAX_FRAME:
                answer(-1, f"frame of {n} bytes is over the limit")
                break
            body = _read_exact(f, n)
            if body is None:
                break
            seq, work = msgpack.unpackb(body, raw=False)
            try:
                timing = commit_rows(conn, _checked(work))
            except StoreError as e:
                answer(seq, str(e))
                continue
            answer(seq, None, timing)
    checkpointer.stop()
    conn.close()
    return 0
