"""`distro-node bench coordinator`: lease/heartbeat load against a real coordinator over HTTP.

The load generator is this process; the coordinator is a child process (``serve`` on a
loopback port, SQLite in a temporary folder) unless ``--url`` names a running one. Setup
(create a run with ``--shards`` shards, admit ``--peers`` nodes by signed challenge) is not
timed. Then requests are *scheduled* at ``--rate`` per second (open loop, so a slow server
cannot hide its latency by slowing the generator) over ``--concurrency`` keep-alive
connections, each a freshly authenticated node call: heartbeat (renews the peer's leases),
lease, or complete (of a lease the peer holds); every answer is checked
(:mod:`distronet.node.bench.coordinator_load`). Latency runs from the scheduled time to the
last byte of the answer.

``--auth session`` (default, what the node's client library does): each simulated node opens
a session at setup (one Ed25519-signed X25519 exchange) and MACs every call with HMAC-SHA256.
``--auth signature``: every call carries an Ed25519 signature (pre-signed before each phase).

    distro-node bench coordinator --duration 10 --rate 2500 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distronet.node.bench.coordinator_load import LoadStats, Peer, run_load
from distronet.node.exitcodes import ExitCode

__all__ = ["add_parser", "run_bench"]

TOKEN = "bench-operator-token"
TARGET_RPS = 2000.0  # issue 4: lease/heartbeat calls per second ...
TARGET_P99_MS = 50.0  # ... with p99 under this and zero errors
# Served counts as the offered rate when it is at least this share of it: open-loop scheduling
# serves a hair under the offered rate even when the server keeps up (the window runs from the
# schedule's start to the last answer, so it is longer than the schedule by the last call's
# latency); a server that falls behind builds a queue and misses by far more.
KEPT_UP = 0.99


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench coordinator`."""
    p = sub.add_parser(
        "coordinator", help="load-test a coordinator: lease/heartbeat requests per second, p99"
    )
    p.add_argument("--url", default=None, help="a running coordinator (default: start one with SQLite)")
    p.add_argument("--operator-token", default=TOKEN, help="operator token of --url")
    p.add_argument(
        "--db", default=None, help="database URL for the started coordinator (default: temp SQLite)"
    )
    p.add_argument("--sqlite-sync", default="FULL", choices=["FULL", "NORMAL"])
    p.add_argument("--duration", type=float, default=10.0, help="seconds of timed load")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of untimed load first")
    p.add_argument("--rate", type=float, default=2500.0, help="requests scheduled per second")
    p.add_argument(
        "--concurrency",
        type=int,
        default=256,
        help="keep-alive connections (real nodes each hold their own; with too few, calls that"
        " arrive during a slow commit wait for a free connection and miss the next group commit)",
    )
    p.add_argument(
        "--peers", type=int, default=250, help="simulated nodes (each under the per-peer rate limit)"
    )
    p.add_argument("--shards", type=int, default=200_000)
    p.add_argument(
        "--auth",
        default="session",
        choices=["session", "signature"],
        help="session: HMAC under a per-node session key (default); signature: Ed25519 per call",
    )
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="record where each timed call's time went (server trace + generator records in DIR)"
        " and add a 'trace' breakdown of the slow calls to the output",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        import uvloop

        result = uvloop.run(run_bench(args))
    except ImportError:
        result = asyncio.run(run_bench(args))
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>22}: {v}")
    return int(ExitCode.OK)


async def _start_server(args: argparse.Namespace, tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = Path(tmp) / "port"
    cmd = [
        sys.executable,
        "-m",
        "distronet.coordinator.cli",
        "serve",
        "--port",
        "0",
        "--port-file",
        str(port_file),
    ]
    cmd += ["--data-dir", tmp, "--operator-token", args.operator_token, "--sqlite-sync", args.sqlite_sync]
    cmd += ["--log-level", "WARNING"]
    cmd += ["--max-conns-per-ip", str(args.concurrency + 16)]  # every connection is from loopback
    if args.db:
        cmd += ["--db", args.db]
    env = dict(os.environ)
    if getattr(args, "trace", None):
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        env["DISTRO_COORD_TRACE"] = str(Path(args.trace) / "server.json")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the coordinator did not start")
        await asyncio.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


async def _setup(url: str, args: argparse.Namespace, run_id: str) -> list[Peer]:
    import aiohttp

    from distronet.node.daemon.coordinator_client import CoordinatorClient
    from distronet.protocol.identity import Identity

    shards = [
        {
            "id": f"s{i}",
            "url": f"https://data.invalid/{i}",
            "sha256": "0" * 64,
            "tokens": 65536,
            "bytes": 65536,
        }
        for i in range(args.shards)
    ]
    spec = {
        "id": run_id,
        "data": {"manifest": {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards}},
        "credit": {"min_steps": 0},  # completions are trusted: no receipts here
    }
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            url + "/api/v1/runs", json=spec, headers={"Authorization": f"Bearer {args.operator_token}"}
        )
        if r.status not in (200, 201):
            raise RuntimeError(f"cannot create the run: {r.status} {await r.text()}")
    peers = [Peer(Identity.generate()) for _ in range(max(args.peers, int(args.rate / 10) + 1))]

    async def join(p: Peer) -> None:
        async with CoordinatorClient(url, run_id, p.ident) as c:
            for _ in range(20):  # the per-IP limit on challenge/join paces admissions
                try:
                    await c.join(multiaddrs=["/ip4/127.0.0.1/tcp/4001"])
                    return
                except Exception:
                    await asyncio.sleep(0.5)
            raise RuntimeError("join failed")

    for i in range(0, len(peers), 20):
        await asyncio.gather(*(join(p) for p in peers[i : i + 20]))
    if args.auth == "session":
        async with aiohttp.ClientSession() as s:
            for i in range(0, len(peers), 20):
                await asyncio.gather(*(_open_session(s, url, run_id, p) for p in peers[i : i + 20]))
    return peers


async def _open_session(s: Any, url: str, run_id: str, p: Peer) -> None:
    """One signed X25519 exchange, as the node's client library does it."""
    from distronet.protocol.coordinator_api import sign_request
    from distronet.protocol.coordinator_session import SessionKey, derive_session_key, new_ephemeral

    priv, pub = new_ephemeral()
    path = f"/api/v1/runs/{run_id}/session"
    body = json.dumps({"x25519": pub}).encode()
    headers = {**sign_request(p.ident, "POST", path, body), "Content-Type": "application/json"}
    async with s.post(url + path, data=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"cannot open a session: {r.status} {await r.text()}")
        ans = await r.json()
    peer = p.ident.peer_id_b58
    key = derive_session_key(
        priv, ans["x25519"], run_id=run_id, peer_id_b58=peer, session_id=ans["session_id"],
        client_public_b64=pub, server_public_b64=ans["x25519"],
    )  # fmt: skip
    p.session = SessionKey(peer, ans["session_id"], key)


async def _load(
    url: str, run_id: str, peers: list[Peer], args: argparse.Namespace, seconds: float, trace: bool = False
) -> LoadStats:
    """One phase of load with the cyclic GC paused: the generator's own collections would show
    up as the server's latency (its per-request garbage is acyclic and freed by refcounting)."""
    gc.disable()
    try:
        return await run_load(
            url,
            run_id,
            peers,
            rate=args.rate,
            seconds=seconds,
            concurrency=args.concurrency,
            auth=args.auth,
            trace=trace,
        )
    finally:
        gc.enable()


def _verify_us() -> float:
    """Median µs of one Ed25519 verify here and now: how loaded this machine is (~60 µs when idle)."""
    from distronet.protocol.identity import Identity, verify

    ident = Identity.generate()
    msg = b"x" * 200
    sig = ident.sign(msg)
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200):
            verify(ident.peer_id, msg, sig)
        runs.append((time.perf_counter() - t) / 200 * 1e6)
    return sorted(runs)[2]


def _cpu_seconds(proc: subprocess.Popen[bytes] | None) -> tuple[float, float, float]:
    """(user, system, main thread user+system) CPU seconds of the coordinator, its child
    processes (the SQLite writer and its checkpointer) included (Linux /proc; 0s elsewhere)."""
    if proc is None:
        return 0.0, 0.0, 0.0
    tck = os.sysconf("SC_CLK_TCK")

    def read(path: str) -> tuple[float, float]:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / tck, int(fields[12]) / tck

    try:
        user, system = read(f"/proc/{proc.pid}/stat")
        mu, ms = read(f"/proc/{proc.pid}/task/{proc.pid}/stat")
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0, 0.0
    children: list[str] = []
    for task in Path(f"/proc/{proc.pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children += (task / "children").read_text().split()
    for child in children:
        try:
            cu, cs = read(f"/proc/{child}/stat")
        except (OSError, ValueError, IndexError):
            continue
        user, system = user + cu, system + cs
    return user, system, mu + ms


_HOT = ('route="heartbeat"', 'route="lease"', 'route="complete"')


async def _server_stats(url: str) -> list[float]:
    """From the coordinator's /metrics, so far: [group commits, seconds in them, rows,
    heartbeat/lease/complete requests, those of them handled within 50 ms, commits within 20 ms]."""
    import aiohttp

    want = {
        "distro_coordinator_commit_seconds_count": 0,
        "distro_coordinator_commit_seconds_sum": 1,
        "distro_coordinator_commit_rows_sum": 2,
    }
    out = [0.0] * 6
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            name, _, value = line.rpartition(" ")
            if name in want:
                out[want[name]] = float(value)
            elif name == 'distro_coordinator_commit_seconds_bucket{le="0.02"}':
                out[5] = float(value)
            elif name.startswith("distro_coordinator_request_seconds") and any(h in name for h in _HOT):
                if name.startswith("distro_coordinator_request_seconds_count"):
                    out[3] += float(value)
                elif 'le="0.05"' in name:
                    out[4] += float(value)
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Start (or use) a coordinator, load it, and return the figures (see the module docstring)."""
    proc: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="distro-bench-coord-") as tmp:
        try:
            if args.url:
                url = args.url.rstrip("/")
            else:
                proc, url = await _start_server(args, tmp)
            run_id = f"bench-{os.getpid()}-{int(time.time())}"
            peers = await _setup(url, args, run_id)
            gc.collect()
            gc.freeze()  # setup's objects (identities, sessions, clients) never need a collection
            if args.warmup > 0:
                await _load(url, run_id, peers, args, args.warmup)
            verify_us = _verify_us()
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            commits0 = await _server_stats(url)
            cpu0 = _cpu_seconds(proc)
            own0 = time.process_time()
            t0 = time.perf_counter()
            st = await _load(
                url, run_id, peers, args, args.duration, trace=bool(getattr(args, "trace", None))
            )
            elapsed = time.perf_counter() - t0
            cpu1 = _cpu_seconds(proc)
            user, system, main = (b - a for a, b in zip(cpu0, cpu1, strict=True))
            cpu = user + system
            own = time.process_time() - own0
            commits = [b - a for a, b in zip(commits0, await _server_stats(url), strict=True)]
        finally:
            gc.unfreeze()
            if proc is not None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=20)
                if proc.poll() is None:
                    proc.kill()
    total = st.ok + st.errors
    p99 = _pct(st.lat, 0.99) * 1000
    window = st.finished - st.started if st.finished > st.started else elapsed
    rps = st.ok / window
    kept_up = rps >= KEPT_UP * args.rate
    out: dict[str, Any] = {
        "requests": total,
        "requests_per_second": round(rps, 1),
        "target_rate": args.rate,
        "offered_rps": args.rate,
        "kept_up": kept_up,
        "p50_ms": round(_pct(st.lat, 0.50) * 1000, 2),
        "p90_ms": round(_pct(st.lat, 0.90) * 1000, 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(max(st.lat, default=float("nan")) * 1000, 2),
        "send_lag_p99_ms": round(_pct(st.send_lag, 0.99) * 1000, 2),
        "server_over_50ms": int(commits[3] - commits[4]),
        "errors": st.errors,
        "error_codes": st.codes,
        "mix": st.kinds,
        "server_cpu_us_per_request": round(cpu / max(total, 1) * 1e6, 1) if proc is not None else None,
        "server_system_cpu_share": round(system / cpu, 3) if proc is not None and cpu > 0 else None,
        "server_main_thread_cpu_share": round(main / cpu, 3) if proc is not None and cpu > 0 else None,
        "generator_cpu_us_per_request": round(own / max(total, 1) * 1e6, 1),
        "ed25519_verify_us": round(verify_us, 1),
        "commits": int(commits[0]),
        "commit_ms_mean": round(commits[1] / commits[0] * 1000, 2) if commits[0] else None,
        "rows_per_commit": round(commits[2] / commits[0], 1) if commits[0] else None,
        "commits_over_20ms": int(commits[0] - commits[5]),
        "load_average_1m": round(load, 2),
        "peers": len(peers),
        "concurrency": args.concurrency,
        "duration_s": round(window, 2),
        "store": args.db or (f"sqlite (synchronous={args.sqlite_sync})" if not args.url else "remote"),
        "auth": args.auth,
        "target": (
            f"offered >= {TARGET_RPS:.0f}/s, served >= {KEPT_UP} x offered, p99 < {TARGET_P99_MS:.0f} ms,"
            " 0 errors"
        ),
        "meets_target": bool(args.rate >= TARGET_RPS and kept_up and p99 < TARGET_P99_MS and st.errors == 0),
    }
    if getattr(args, "trace", None):
        from distronet.node.bench.coordinator_trace import breakdown

        trace_dir = Path(args.trace)
        (trace_dir / "generator.json").write_text(json.dumps(st.trace))
        server_file = trace_dir / "server.json"
        out["trace"] = breakdown(server_file, st.trace or []) if server_file.exists() else "no server trace"
    return out
