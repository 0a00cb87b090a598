"""The operator dashboard in a real headless Chromium against a real coordinator process.

Steps:
 1. start `distro-coordinator serve --run run.toml` (4 shard units) as a process on a free port;
 2. open ``/dashboard`` (redirected to ``/dashboard/``): the run is chosen by itself, the event
    stream connects ("live"), the shard bar shows 4 pending units, no peer;
 3. node A (a real Ed25519 identity, the node's real client) signs its challenge and joins: its
    row appears, live, with no reload;
 4. A leases a unit and heartbeats step 5, loss 3.25: the step, the loss chart's first point and
    A's row update; node B joins (its row appears) and the page shows the lease (1 leased, 3 pending);
    A's heartbeat also reported its reach (2 direct, 1 hole-punched, 1 relayed peer): its reach
    cell says so, B's says "–" until B heartbeats that it reaches nobody (no relay), then shows
    that diagnosis;
 5. A completes its unit: 1 done, 0 leased; the leaderboard ranks A first with 100 tokens, 1 shard;
 6. A heartbeats step 9, loss 2.5 until the coordinator emits a second loss point (it averages
    reports over half a second): the chart has 2 points, the step reads 9;
 7. B leaves, the operator evicts A: their rows say left and evicted; the event list has shown
    every kind of event that happened;
 8. no console error, no page error, and no request left the page's origin;
 9. the coordinator is stopped (SIGTERM) and started again on the same port and database: the
    page says it is reconnecting, then live again, and a node C that joins the restarted
    coordinator (whose event ids start again from 1) appears; console errors in this step are
    only the failed requests of the outage itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from distronet.node.daemon.coordinator_client import CoordinatorClient
from distronet.protocol.identity import Identity

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_ID = "web"
OPERATOR_TOKEN = "browser-test-token"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
WAIT_MS = 10_000
OUTAGE_ERROR = re.compile(r"ERR_CONNECTION_REFUSED|ERR_CONNECTION_RESET|ERR_EMPTY_RESPONSE|status of 503")


def _need_chromium() -> Any:
    """The Playwright module; skips (locally) or fails (under CI) when Chromium or Playwright is absent."""
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append("chromium (apt-get install chromium)")
    try:
        import playwright.async_api as pw
    except ImportError:
        pw = None
        missing.append("playwright (pip install -e '.[dev]')")
    if missing:
        reason = "the dashboard browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(reason + "; .ci/run installs them", pytrace=False)
        pytest.skip(f"missing service: Chromium/Playwright not installed here ({reason})")
    return pw


def _write_run(tmp: Path) -> Path:
    shards = [
        {"id": f"s{i}", "url": f"https://data.invalid/s{i}", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
        for i in range(4)
    ]
    (tmp / "manifest.json").write_text(
        json.dumps({"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards})
    )
    run = tmp / "run.toml"
    run.write_text(
        f'id = "{RUN_ID}"\nheartbeat_interval_s = 1.0\nnode_timeout_s = 60.0\n'
        '[data]\nmanifest = "manifest.json"\nlease_ttl_s = 600\nmax_leases_per_node = 1\n'
        "[credit]\nmin_steps = 0\n"  # trusted completions: this test sends no receipts
    )
    return run


@dataclass
class Coordinator:
    tmp: Path
    run: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 30.0) -> None:
        port_file = self.tmp / "port"
        port_file.unlink(missing_ok=True)
        log = self.tmp / f"coordinator{len(self.log)}.log"
        self.log.append(log)
        cmd = [sys.executable, "-m", "distronet.coordinator.cli", "serve", "--port", str(self.port),
               "--port-file", str(port_file), "--data-dir", str(self.tmp / "state"),
               "--operator-token", OPERATOR_TOKEN, "--run", str(self.run), "--sqlite-sync", "NORMAL",
               "--sweep-interval-s", "0.2", "--log-level", "WARNING"]  # fmt: skip
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip().isdigit()):
            if self.proc.poll() is not None:
                raise AssertionError(f"the coordinator exited at start:\n{log.read_text()[-2000:]}")
            assert time.monotonic() < deadline, f"the coordinator did not start within {timeout:.0f} s"
            await asyncio.sleep(0.02)
        self.port = int(port_file.read_text())

    def stop(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    c = Coordinator(tmp_path, _write_run(tmp_path))
    await c.start()
    try:
        yield c
    finally:
        c.stop()


@dataclass
class PageWatch:
    """What the page logged and fetched."""

    origin: str
    console_errors: list[tuple[str, str]] = field(default_factory=list)  # (phase, text)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    phase: str = "main"

    def on_console(self, kind: str, text: str) -> None:
        if kind == "error":
            self.console_errors.append((self.phase, text))


async def _until(page: Any, js: str, arg: Any, what: str, timeout_ms: int = WAIT_MS) -> None:
    """Wait for the predicate ``js(arg)`` in the page; on timeout, fail with what the page shows."""
    try:
        await page.wait_for_function(js, arg=arg, timeout=timeout_ms, polling=50)
    except Exception as e:
        if type(e).__name__ != "TimeoutError":
            raise
        shown = await page.evaluate(
            "() => ['conn','message','step','loss-latest','shards-done','shards-leased','shards-pending']"
            ".map(id => id + '=' + (document.getElementById(id) || {}).textContent).join(' | ')"
            " + ' | peers: ' + document.querySelector('#peers tbody').innerText"
            " + ' | board: ' + document.querySelector('#leaderboard tbody').innerText"
            " + ' | points=' + document.getElementById('loss-chart').dataset.points"
        )
        raise AssertionError(f"timed out after {timeout_ms} ms waiting for {what}; shown: {shown}") from None


def _text_is(id_: str) -> str:
    return f"(want) => (document.getElementById('{id_}').textContent || '').trim() === want"


ROW_STATE = "([peer, state]) => { const r = document.querySelector(`#peers tr[data-peer='${peer}']`); return !!r && r.dataset.state === state; }"  # noqa: E501
ROW_STEP = "([peer, step]) => { const r = document.querySelector(`#peers tr[data-peer='${peer}'] td.step`); return !!r && r.textContent === step; }"  # noqa: E501
ROW_REACH = "([peer, text]) => { const r = document.querySelector(`#peers tr[data-peer='${peer}'] td.reach`); return !!r && r.textContent === text; }"  # noqa: E501
POINTS_AT_LEAST = "(n) => Number(document.getElementById('loss-chart').dataset.points) >= n"
CONN_IS = "(s) => document.getElementById('conn').dataset.state === s"
BOARD_FIRST = (
    "([peer, tokens, shards]) => { const r = document.querySelector('#leaderboard tbody tr');"
    " return !!r && r.dataset.peer === peer && r.querySelector('td.tokens').textContent === tokens"
    " && r.querySelector('td.shards').textContent === shards; }"
)


async def _evict(base: str, peer: str) -> None:
    async with aiohttp.ClientSession() as s:
        url = f"{base}/api/v1/runs/{RUN_ID}/nodes/{peer}/evict"
        headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        async with s.post(url, json={"reason": "browser test"}, headers=headers) as r:
            assert r.status == 200, await r.text()


async def test_dashboard_follows_a_run_live_and_reconnects(coordinator: Coordinator) -> None:
    pw = _need_chromium()
    base = coordinator.url
    watch = PageWatch(origin=base)
    a, b, c = Identity.generate(), Identity.generate(), Identity.generate()
    async with pw.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            ctx = await browser.new_context(service_workers="block")

            async def refuse(route: Any) -> None:
                watch.foreign.append(route.request.url)
                await route.abort()

            await ctx.route(lambda url: not url.startswith(base + "/"), refuse)
            page = await ctx.new_page()
            page.on("console", lambda m: watch.on_console(m.type, m.text))
            page.on("pageerror", lambda e: watch.page_errors.append(str(e)))
            page.on("request", lambda r: watch.requests.append(r.url))

            # 2. the page comes up by itself on the only run
            resp = await page.goto(base + "/dashboard")
            assert resp is not None and resp.ok and page.url == base + "/dashboard/"
            await _until(page, CONN_IS, "live", "the event stream to connect")
            await _until(page, _text_is("shards-pending"), "4", "4 pending shard units")
            assert await page.locator("#run-select").input_value() == RUN_ID

            async with CoordinatorClient(base, RUN_ID, a) as ca, CoordinatorClient(base, RUN_ID, b) as cb:
                # 3. a node joins
                await ca.join(agent="browser-test/A")
                await _until(page, ROW_STATE, [a.peer_id_b58, "active"], "A's row, active")
                await _until(page, _text_is("peers-live"), "1", "1 live peer")

                # 4. a lease, a step and a loss; a second node
                (lease,) = await ca.lease(1)
                await ca.heartbeat(5, loss=3.25, reach={"direct": 2, "hole_punched": 1, "relayed": 1})
                await _until(page, _text_is("step"), "5", "step 5")
                await _until(page, POINTS_AT_LEAST, 1, "the first loss point")
                await _until(page, _text_is("loss-latest"), "3.2500", "loss 3.25")
                await _until(page, ROW_STEP, [a.peer_id_b58, "5"], "A's row at step 5")
                await cb.join(agent="browser-test/B")
                await _until(page, ROW_STATE, [b.peer_id_b58, "active"], "B's row, active")
                # 4b. the reach column: A's routes; B, behind a blocked relay, reaches nobody
                await _until(
                    page, ROW_REACH, [a.peer_id_b58, "2 direct · 1 punched · 1 relayed"], "A's reach"
                )
                await _until(page, ROW_REACH, [b.peer_id_b58, "–"], "B's reach, not reported yet")
                await cb.heartbeat(
                    0, reach={"direct": 0, "hole_punched": 0, "relayed": 0, "diagnosis": "no_relay"}
                )
                shown = "0 direct · 0 relayed reaches nobody: no relay"
                await _until(page, ROW_REACH, [b.peer_id_b58, shown], "B's reach with its diagnosis")
                cause = f"#peers tr[data-peer='{b.peer_id_b58}'] td.reach .diagnosis"
                assert await page.get_attribute(cause, "data-cause") == "no_relay"
                await _until(page, _text_is("shards-leased"), "1", "1 leased unit")
                await _until(page, _text_is("shards-pending"), "3", "3 pending units")

                # 5. the unit is completed: shard counts and the ledger
                done = await ca.complete(lease)
                assert done is not None and done["credited"]
                await _until(page, _text_is("shards-done"), "1", "1 completed unit")
                await _until(page, _text_is("shards-leased"), "0", "no leased unit")
                await _until(page, BOARD_FIRST, [a.peer_id_b58, "100", "1"], "A first on the leaderboard")

                # 6. a second loss point (the coordinator emits the mean of each half second)
                deadline = time.monotonic() + 10
                while not await page.evaluate(POINTS_AT_LEAST, 2):
                    assert time.monotonic() < deadline, "no second loss point within 10 s"
                    await ca.heartbeat(9, loss=2.5)
                    with_points = page.wait_for_function(POINTS_AT_LEAST, arg=2, timeout=700, polling=50)
                    try:
                        await with_points
                    except Exception as e:
                        if type(e).__name__ != "TimeoutError":
                            raise
                await _until(page, _text_is("step"), "9", "step 9")
                await _until(page, _text_is("loss-latest"), "2.5000", "loss 2.5")

                # 7. leave and evict
                await cb.leave()
                await _until(page, ROW_STATE, [b.peer_id_b58, "left"], "B's row, left")
                await _evict(base, a.peer_id_b58)
                await _until(page, ROW_STATE, [a.peer_id_b58, "evicted"], "A's row, evicted")
                await _until(page, _text_is("peers-live"), "0", "no live peer")
            kinds = set(await page.eval_on_selector_all("#events li", "els => els.map(e => e.dataset.type)"))
            want = {"peer_joined", "step_progress", "loss", "shard_completed", "peer_left", "peer_evicted"}
            assert want <= kinds, kinds

            # 8. clean console, nothing from elsewhere
            assert watch.page_errors == []
            assert watch.console_errors == []
            assert watch.foreign == []
            assert watch.requests and all(u.startswith(base + "/") for u in watch.requests)

            # 9. the coordinator restarts; the page reconnects and follows the new process
            watch.phase = "outage"
            assert coordinator.stop() == 0
            await _until(page, CONN_IS, "reconnecting", "the page to notice the outage")
            await coordinator.start()
            await _until(page, CONN_IS, "live", "the page to reconnect", timeout_ms=20_000)
            async with CoordinatorClient(base, RUN_ID, c) as cc:
                await cc.join(agent="browser-test/C")
                watch.phase = "after"
                await _until(page, ROW_STATE, [c.peer_id_b58, "active"], "C's row after the restart")
            assert watch.page_errors == []
            assert [t for ph, t in watch.console_errors if ph != "outage" or not OUTAGE_ERROR.search(t)] == []
            assert watch.foreign == []
            await ctx.close()
        finally:
            await browser.close()
