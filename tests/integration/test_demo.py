"""`make demo` as a newcomer runs it: the real demo process, unbounded, stopped with Ctrl-C.

Steps:
 1. start ``python -m distronet.node.demo`` without ``DEMO_STEPS`` (train until Ctrl-C);
 2. its first line is the dashboard's URL;
 3. wait (deadline, no sleep) until the nodes have trained a step (any step line: a fast step
    may go unprinted), and note every descendant
    process (coordinator, 3 nodes, their p2pd);
 4. SIGINT to the demo alone: it exits 0 after printing the summary table, and none of the
    descendants is left.
``DEMO_STEPS=3`` (the scripted form) stops by itself after step 2 with exit 0.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from distronet.node.demo import steps_from_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FIRST_STEP_S = 120.0  # 60 s on an idle 2-core machine; the test shares its cores with others


def _lines(proc: subprocess.Popen[str]) -> tuple[queue.Queue[str | None], threading.Thread]:
    """The process's stdout, line by line (None at its end), read on the returned thread."""
    out: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line.rstrip("\n"))
        out.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return out, reader


def _wait_line(lines: queue.Queue[str | None], want: str, timeout: float, seen: list[str]) -> str:
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line with {want!r} within {timeout:.0f} s; got:\n" + "\n".join(seen))
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"the demo ended before a line with {want!r}; got:\n" + "\n".join(seen))
        seen.append(line)
        if want in line:
            return line


def test_unbounded_demo_trains_until_sigint_then_exits_clean() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DEMO_STEPS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    t0 = time.monotonic()
    demo = subprocess.Popen(
        [sys.executable, "-m", "distronet.node.demo"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(demo)
    seen: list[str] = []
    family: list[psutil.Process] = []
    try:
        first = _wait_line(lines, "", 60.0, seen)
        assert first.startswith("dashboard: http://127.0.0.1:") and first.endswith("/dashboard/?run=demo")
        # the demo prints what its nodes' status files say every tick, so a fast step can go unprinted:
        # any step line means the swarm trains
        _wait_line(lines, "  loss ", FIRST_STEP_S, seen)
        first_step_s = time.monotonic() - t0
        family = psutil.Process(demo.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in family)
        assert names.count("distronet.node.cli join") == 3 and "distronet.coordinator.cli" in names
        demo.send_signal(signal.SIGINT)
        assert demo.wait(90) == 0, "\n".join(seen)
        _wait_line(lines, "demo OK (interrupted)", 10.0, seen)
        text = "\n".join(seen)
        assert "node  peer      steps" in text and "replicas bit-identical at step" in text
        _gone, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, f"left behind: {alive}"
        print(f"first step {first_step_s:.1f} s after start")
    finally:
        for p in [*family, psutil.Process(demo.pid)] if demo.poll() is None else family:
            if p.is_running():
                p.kill()
        demo.wait(10)
        reader.join(10)
        assert demo.stdout is not None
        demo.stdout.close()


def test_scripted_demo_stops_by_itself_after_demo_steps() -> None:
    env = {
        **os.environ,
        "DEMO_STEPS": "3",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    out = subprocess.run(
        [sys.executable, "-m", "distronet.node.demo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=FIRST_STEP_S + 60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("dashboard: http://127.0.0.1:")
    assert "  loss " in out.stdout and "demo OK (3 steps)" in out.stdout  # a fast step may go unprinted
    # the English corpus where Debian's fortunes are installed (CI installs them), else the code one
    english = Path("/usr/share/games/fortunes").is_dir()
    assert ("on the English fortunes" in out.stdout) == english, out.stdout


def test_demo_steps_from_the_environment() -> None:
    assert steps_from_env({}) is None and steps_from_env({"DEMO_STEPS": "0"}) is None
    assert steps_from_env({"DEMO_STEPS": " 12 "}) == 12
    for bad in ("x", "-1"):
        with pytest.raises(SystemExit, match="DEMO_STEPS"):
            steps_from_env({"DEMO_STEPS": bad})
