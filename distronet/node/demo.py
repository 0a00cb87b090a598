"""`make demo`: a real local swarm — a coordinator and 3 `distro-node join` processes on loopback.

It prints the dashboard's URL first, then the nodes train the built-in GPT (shrunk so a laptop
CPU does a step in well under a second) on the built-in English corpus (Debian's fortunes; the
code corpus where they are not installed) until Ctrl-C (SIGINT, or
SIGTERM), printing each step's status. Then every node is stopped (SIGTERM: it finishes its
step, saves, leaves the run, stops its p2pd), the coordinator too, and a summary table shows per
node: steps, first and last loss, parameter digest, bytes up/down and exit code; exit code 0 when
every process stopped cleanly and the replicas are bit-identical. ``DEMO_STEPS=N`` stops by itself
after N steps instead (the scripted form). Deadlines everywhere: a node that does not start, step
or stop in time fails the demo with a message saying which, and exit code 1. A second Ctrl-C
while it stops kills what is left (exit 130).

The children run in their own session, so a terminal's Ctrl-C reaches only the demo, which
stops them in order (a node takes a second signal as "exit now").

:class:`LocalSwarm` is the harness the integration and chaos tests use too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "LocalSwarm",
    "SwarmFailure",
    "common_digests",
    "main",
    "steps_from_env",
    "wait_identical",
    "wait_until",
    "write_run",
]

TINY_MODEL = {
    "arch": "gpt",
    "depth": 2,
    "width": 64,
    "heads": 4,
    "context": 64,
    "seed": 1,
    "batch": 8,
    "seq_len": 64,
}


_CORPUS_NAMES = {
    "english": "English fortunes (Debian's fortunes package)",
    "code": "standard library's source (apt-get install fortunes for English)",
}


class SwarmFailure(RuntimeError):
    """A local swarm process did not do what it should in time; the message says which."""


def write_run(
    folder: Path,
    run_id: str = "demo",
    *,
    shards: int = 6,
    shard_tokens: int = 20_000,
    model: dict[str, Any] | None = None,
    round_deadline_s: float = 0.6,
    lr: float = 3e-3,
    lease_ttl_s: float = 60.0,
    node_timeout_s: float = 15.0,
    corpus: str = "code",
) -> Path:
    """Shards of a built-in corpus (``corpus``: "code", the standard library's source, or
    "english", Debian's fortunes), their manifest and a run TOML under ``folder``; the TOML's path.

    A shard of ``shard_tokens`` tokens lasts ``shard_tokens // (batch * seq_len)`` steps; a lease
    not renewed (by heartbeats) for ``lease_ttl_s`` seconds expires and is reissued.
    """
    from distronet.node.data import load_builtin_corpus
    from distronet.node.data.english import load_english_corpus

    if corpus not in ("code", "english"):
        raise ValueError(f"corpus must be 'code' or 'english', not {corpus!r}")
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    tokens = (load_english_corpus() if corpus == "english" else load_builtin_corpus()).train
    entries = []
    for i in range(shards):
        raw = tokens[i * shard_tokens : (i + 1) * shard_tokens].astype("uint8").tobytes()
        (data / f"train-{i:04d}.bin").write_bytes(raw)
        sha = hashlib.sha256(raw).hexdigest()
        name = f"train-{i:04d}"
        entries.append(
            {"id": name, "path": f"{name}.bin", "sha256": sha, "tokens": len(raw), "bytes": len(raw)}
        )
    (data / "manifest.json").write_text(
        json.dumps({"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": entries})
    )
    m = model or TINY_MODEL
    model_toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in m.items())
    run = folder / "run.toml"
    run.write_text(
        f'id = "{run_id}"\nheartbeat_interval_s = 2.0\nnode_timeout_s = {node_timeout_s}\n'
        f"[model]\n{model_toml}\n"
        f'[optimizer]\nname = "distro"\npreset = "ours_k32"\nlr = {lr}\nchunk = 32\nk = 8\n'
        f'[exchange]\nstrategy = "all-gather"\nround_deadline_s = {round_deadline_s}\n'
        "manifest_grace_s = 0.2\nmanifest_wait_s = 1.5\npull_timeout_s = 10.0\n"
        f'[data]\nmanifest = "data/manifest.json"\nepochs = 100\nlease_ttl_s = {lease_ttl_s}\n'
        "max_leases_per_node = 1\n"
        # completions are trusted until nodes send receipts (docs/decisions/verified-credit.md)
        "[credit]\nmin_steps = 0\n"
    )
    return run


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` every 0.1 s; raise ``SwarmFailure`` naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise SwarmFailure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent process dies (``PR_SET_PDEATHSIG``)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))


class LocalSwarm:
    """A coordinator process and node processes in ``folder``. Use as a context manager: on exit,
    anything still running is stopped (SIGTERM, then SIGKILL after a deadline)."""

    def __init__(
        self, folder: Path, run_toml: Path, run_id: str, *, log: bool = False, own_session: bool = False
    ) -> None:
        """``log``: children write to this process's stdout, else to ``folder/<name>.log``;
        ``own_session``: children start in a session of their own (a terminal's Ctrl-C does not
        reach them; the owner stops them)."""
        self.folder, self.run_toml, self.run_id, self.log = folder, run_toml, run_id, log
        self.own_session = own_session
        # A child in a session of its own is out of reach of the terminal's signals, so on Linux
        # it gets SIGTERM from the kernel when this process dies, however it dies (SIGKILL too).
        self._preexec = _die_with_parent if own_session and sys.platform == "linux" else None
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.node_dirs: list[Path] = []
        self._files: list[Any] = []

    def _out(self, name: str) -> Any:
        if self.log:
            return None
        fh = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115  (closed in __exit__)
        self._files.append(fh)
        return fh

    def start_coordinator(
        self, timeout: float = 30.0, *, port: int = 0, host: str = "127.0.0.1", extra: Sequence[str] = ()
    ) -> str:
        """Start (or restart, on the same data folder; pass ``port`` to keep the URL) the coordinator
        on ``host``; ``extra`` are more `distro-coordinator serve` flags."""
        port_file = self.folder / "coordinator.port"
        port_file.unlink(missing_ok=True)
        self.coordinator = subprocess.Popen(
            [sys.executable, "-m", "distronet.coordinator.cli", "serve", "--host", host, "--port", str(port),
             "--port-file", str(port_file), "--data-dir", str(self.folder / "coordinator"),
             "--run", str(self.run_toml), "--operator-token", "demo",
             "--sqlite-sync", "NORMAL", "--log-level", "warning", *extra],
            stdout=self._out("coordinator"), stderr=subprocess.STDOUT, start_new_session=self.own_session,
            preexec_fn=self._preexec,
        )  # fmt: skip

        def up() -> bool:
            if self.coordinator is not None and self.coordinator.poll() is not None:
                raise SwarmFailure(f"the coordinator exited with {self.coordinator.returncode} at start")
            return port_file.exists() and port_file.read_text().strip().isdigit()

        wait_until(up, timeout, "the coordinator's port file")
        self.url = f"http://{host}:{port_file.read_text().strip()}"
        return self.url

    def start_node(self, *extra: str, min_peers: int = 1, status: str = "off") -> int:
        i = len(self.nodes)
        d = self.folder / f"node{i}"
        d.mkdir(exist_ok=True)
        env = {**os.environ, "DISTRO_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "distronet.node.cli", "join", self.run_id, "--coordinator", self.url,
               "--data-dir", str(d), "--listen", "/ip4/127.0.0.1/tcp/0", "--no-nat-traversal",
               "--gossip-heartbeat-s", "0.2", "--min-peers", str(min_peers), "--status", status,
               "--log-level", "warning", "--up", "unlimited", "--down", "unlimited", *extra]  # fmt: skip
        self.nodes.append(
            subprocess.Popen(
                cmd,
                env=env,
                stdout=self._out(f"node{i}"),
                stderr=subprocess.STDOUT,
                start_new_session=self.own_session,
                preexec_fn=self._preexec,
            )
        )
        self.node_dirs.append(d)
        return i

    def api(self, path: str, timeout: float = 10.0) -> Any:
        """GET ``/api/v1{path}`` from the coordinator as JSON (raises ``OSError`` when it is down)."""
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/api/v1{path}", timeout=timeout) as r:
            return json.load(r)

    def status(self, i: int) -> dict[str, Any]:
        """Node ``i``'s status.json ({} before its first write)."""
        path = self.node_dirs[i] / "status.json"
        try:
            doc: dict[str, Any] = json.loads(path.read_text())
            return doc
        except (OSError, ValueError):
            return {}

    def log_tail(self, i: int, lines: int = 40) -> str:
        """The last ``lines`` lines of node ``i``'s log (empty when it logs to stdout): what a
        failed wait reports, so a CI failure names its cause."""
        try:
            text = (self.folder / f"node{i}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_steps(self, nodes: list[int], step: int, timeout: float) -> None:
        """Until each of ``nodes`` has finished ``step``; raises ``SwarmFailure`` if one exits or is late."""

        def ok() -> bool:
            for i in nodes:
                if self.nodes[i].poll() is not None:
                    raise SwarmFailure(
                        f"node {i} exited with {self.nodes[i].returncode}; see {self.folder}/node{i}.log"
                    )
            return all(self.status(i).get("step", -1) >= step for i in nodes)

        wait_until(ok, timeout, f"nodes {nodes} to reach step {step}")

    def stop(self, proc: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> int | None:
        """SIGTERM ``proc`` and wait; SIGKILL after ``timeout``. Its exit code (None if never started)."""
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                raise SwarmFailure(
                    f"process {proc.pid} did not stop within {timeout:.0f} s of SIGTERM"
                ) from None
        return proc.returncode

    def stop_all(self) -> list[int | None]:
        codes = [self.stop(p) for p in self.nodes]
        self.stop(self.coordinator)
        return codes

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in [*self.nodes, self.coordinator]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.nodes, self.coordinator]:
            if p is not None:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        for fh in self._files:
            fh.close()


@contextlib.contextmanager
def _folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="distro-demo-") as d:
        yield Path(d)


def common_digests(swarm: LocalSwarm, nodes: list[int]) -> tuple[int, set[str]]:
    """The newest step every node in ``nodes`` reported a digest for, and the set of digests there
    (one element: bit-identical replicas). (-1, set()) when there is no common step."""
    held = [{int(k): v for k, v in swarm.status(i).get("digests", {}).items()} for i in nodes]
    common = set.intersection(*(set(h) for h in held)) if held else set()
    if not common:
        return -1, set()
    step = max(common)
    return step, {h[step] for h in held}


def wait_identical(swarm: LocalSwarm, nodes: list[int], after: int, timeout: float) -> tuple[int, set[str]]:
    """Until the newest step all ``nodes`` reported a digest for is past ``after`` and they agree
    there (a replica that diverged is repaired by its drift check within ``--drift-every``
    steps). Returns ``common_digests`` as last seen, agreeing or not, once ``timeout`` passes."""
    end = time.monotonic() + timeout
    while True:
        for i in nodes:
            if swarm.nodes[i].poll() is not None:
                raise SwarmFailure(f"node {i} exited with {swarm.nodes[i].returncode}")
        step, digests = common_digests(swarm, nodes)
        if (step > after and len(digests) == 1) or time.monotonic() > end:
            return step, digests
        time.sleep(0.2)


def _summary(swarm: LocalSwarm, codes: list[int | None]) -> str:
    step, digests = common_digests(swarm, list(range(len(codes))))
    rows = [f"node  peer      steps  loss first -> last   digest@{step:<5}  up kB  down kB  exit"]
    for i, code in enumerate(codes):
        s = swarm.status(i)
        losses = s.get("losses") or [float("nan")]
        digest = s.get("digests", {}).get(str(step), "?")[:12]
        rows.append(
            f"{i:<4}  {s.get('peer_id', '?')[-8:]:<8}  {s.get('step', -1) + 1:>5}  "
            f"{losses[0]:>6.3f} -> {losses[-1]:<6.3f}  {digest:<13}  "
            f"{s.get('bytes_up', 0) / 1e3:>5.0f}  {s.get('bytes_down', 0) / 1e3:>7.0f}  {code}"
        )
    same = "yes" if len(digests) == 1 else "NO"
    rows.append(f"replicas bit-identical at step {step}: {same}")
    return "\n".join(rows)


FIRST_STEP_S = 120.0
"""Deadline for every node's first step (start-up: torch, p2pd, the mesh); on an idle 2-core
machine it takes well under 60 s."""
STEP_S = 60.0
"""Deadline for each later step of the slowest node."""


def _print_step(swarm: LocalSwarm, step: int, n_nodes: int) -> None:
    """One line for ``step`` (the slowest node's): each node's loss, peers and upload rate."""
    st = [swarm.status(i) for i in range(n_nodes)]
    loss = " ".join(f"{s.get('loss', float('nan')):.3f}" for s in st)
    peers = " ".join(str(s.get("peers", "?")) for s in st)
    up = " ".join(f"{s.get('up_bps', 0) / 1e3:.0f}" for s in st)
    print(f"  step {step:>4}  loss {loss}  peers {peers}  up kB/s {up}", flush=True)


def _train(swarm: LocalSwarm, steps: int | None, n_nodes: int) -> None:
    """Until every node finished step ``steps - 1`` (``None``: until interrupted), printing each
    step; raises ``SwarmFailure`` when a node exits or misses its deadline."""
    last = -1
    while steps is None or last < steps - 1:
        timeout = FIRST_STEP_S if last < 0 else STEP_S
        swarm.wait_steps(list(range(n_nodes)), last + 1, timeout)
        last = min(swarm.status(i).get("step", -1) for i in range(n_nodes))
        _print_step(swarm, last, n_nodes)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _print_logs(tmp: Path) -> None:
    for log in sorted(tmp.glob("*.log")):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        print(f"--- {log.name} (last lines)\n{tail}", file=sys.stderr)


def main(steps: int | None = None, n_nodes: int = 3) -> int:
    """Run the demo: until SIGINT/SIGTERM (``steps`` None) or ``steps`` steps. 0 when every node
    stopped cleanly with bit-identical replicas, 1 on a failure, 130 on a second interrupt."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored
    signal.signal(signal.SIGTERM, _raise_interrupt)
    interrupted = False
    from distronet.node.data.english import ENGLISH_DIR

    # English where Debian's fortunes are installed (make demo's corpus), else the code corpus
    corpus = "english" if ENGLISH_DIR.is_dir() else "code"
    with _folder() as tmp:
        run = write_run(tmp, "demo", corpus=corpus)
        try:
            with LocalSwarm(tmp, run, "demo", own_session=True) as swarm:
                try:
                    swarm.start_coordinator()
                    print(f"dashboard: {swarm.url}/dashboard/?run=demo", flush=True)
                    until = "Ctrl-C" if steps is None else f"{steps} steps"
                    print(f"distro-node demo: a coordinator and {n_nodes} nodes on loopback train the "
                          f"built-in GPT on the {_CORPUS_NAMES[corpus]} until {until}; per step, "
                          "each node's loss, peers and upload:",
                          flush=True)  # fmt: skip
                    bound = () if steps is None else ("--max-steps", str(steps + 1000))  # no orphan runs on
                    for _ in range(n_nodes):
                        swarm.start_node(*bound, min_peers=n_nodes, status="line")
                    _train(swarm, steps, n_nodes)
                except KeyboardInterrupt:
                    interrupted = True
                    print("\nstopping: SIGTERM to every node, then the coordinator", flush=True)
                codes = swarm.stop_all()
                print("\n" + _summary(swarm, codes), flush=True)
                step, digests = common_digests(swarm, list(range(len(codes))))
                # interrupted before the nodes shared a step: nothing to compare
                identical = len(digests) == 1 or (interrupted and step < 0)
        except SwarmFailure as e:
            print(f"demo FAILED: {e}", file=sys.stderr)
            _print_logs(tmp)
            return 1
        except KeyboardInterrupt:  # a second one while stopping: LocalSwarm's exit killed the rest
            print("\ninterrupted again: stopped what was left", file=sys.stderr)
            return 130
    if any(c != 0 for c in codes) or not identical:
        print(f"demo FAILED: exit codes {codes}, replicas identical: {identical}", file=sys.stderr)
        return 1
    how = "interrupted" if interrupted else f"{steps} steps"
    print(f"\ndemo OK ({how}): every node trained and stopped cleanly (SIGTERM → exit 0).")
    print("The payload codec benchmark is `distro-node bench codec --quick`.")
    return 0


def steps_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """``DEMO_STEPS`` as a step count (``None`` when unset, empty or 0: train until Ctrl-C)."""
    raw = (os.environ if environ is None else environ).get("DEMO_STEPS", "").strip()
    try:
        n = int(raw or "0")
    except ValueError:
        raise SystemExit(f"DEMO_STEPS must be a whole number of steps, got {raw!r}") from None
    if n < 0:
        raise SystemExit(f"DEMO_STEPS must be >= 0, got {n}")
    return n or None


if __name__ == "__main__":
    sys.exit(main(steps_from_env()))
