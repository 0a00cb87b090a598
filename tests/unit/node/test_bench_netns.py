"""`bench/netns`: the sliding-window peak, input checks, and (as root) shaped veths that count bytes."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.node.bench import network
from distronet.node.bench.netns import (
    LinkShape,
    NetnsError,
    ShapedNet,
    max_window_bytes,
    missing_requirements,
)
from distronet.protocol.errors import ConfigError


def _brute(samples: list[tuple[float, int]], window: float) -> int:
    return max(
        (b[1] - a[1] for i, a in enumerate(samples) for b in samples[i:] if b[0] - a[0] <= window + 1e-9),
        default=0,
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 3.0), st.integers(0, 10_000)), min_size=1, max_size=40))
def test_max_window_bytes_matches_brute_force(steps: list[tuple[float, int]]) -> None:
    t, total, samples = 0.0, 0, []
    for dt, n in steps:
        t, total = t + dt, total + n
        samples.append((t, total))
    peak = max_window_bytes(samples, 5.0)
    assert peak.nbytes == _brute(samples, 5.0)
    assert peak.span_s <= 5.0 + 1e-9


def test_bad_shapes_and_names_are_refused() -> None:
    with pytest.raises(ConfigError):
        LinkShape(up="fast")
    with pytest.raises(NetnsError):
        LinkShape(delay_ms=-1.0)
    with pytest.raises(NetnsError):
        ShapedNet(2, LinkShape(), prefix="has-dash")
    with pytest.raises(NetnsError):
        ShapedNet(0, LinkShape())


def test_bench_network_registers_its_flags() -> None:
    parser = argparse.ArgumentParser()
    network.add_parser(parser.add_subparsers())
    args = parser.parse_args(["network", "--json", "--quick", "--up", "2mbit", "--skip-join"])
    assert args.func is network.run and args.json and args.quick and args.up == "2mbit" and args.skip_join


SENDER = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5601), timeout=10)
end = time.monotonic() + 1.0
while time.monotonic() < end:
    s.sendall(b"x" * 65536)
s.close()
"""

RECEIVER = """
import socket, sys
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], 5601))
srv.listen(1)
print("ready", flush=True)
c, _ = srv.accept()
n = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    n += len(b)
print(n, flush=True)
"""


@pytest.mark.netns
@pytest.mark.skipif(missing_requirements() is not None, reason=missing_requirements() or "")
def test_node_to_node_bytes_cross_both_veths_at_the_shaped_rate() -> None:
    with ShapedNet(
        2, LinkShape(up="8mbit", down="40mbit", delay_ms=0.0), prefix="dnu", subnet="10.76.0"
    ) as net:
        assert (
            f"{net.ns(0)}" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        )
        before = [net.counters(i) for i in range(2)]
        recv = subprocess.Popen(
            [*net.exec_prefix(1), sys.executable, "-c", RECEIVER, net.node_ip(1)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
            t0 = time.monotonic()
            subprocess.run(
                [*net.exec_prefix(0), sys.executable, "-c", SENDER, net.node_ip(1)], check=True, timeout=30
            )
            got = int(recv.stdout.readline())
            elapsed = time.monotonic() - t0
        finally:
            recv.kill()
            recv.communicate(timeout=10)
        after = [net.counters(i) for i in range(2)]
    sent_up = after[0][0] - before[0][0]
    got_down = after[1][1] - before[1][1]
    assert got <= sent_up and got <= got_down  # every payload byte crossed both veths, headers on top
    assert got / elapsed <= 8e6 / 8 * 1.1  # tbf holds the upload link to 8 mbit
    leftover = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "dnu-br" not in leftover and "dnuh0" not in leftover


def test_bench_network_table_and_json_say_what_was_not_measured() -> None:
    result = {"fraction_of_compute_rate": None, "max_budget_overshoot": -0.1, "join_to_first_accept_s": 12.5}
    table = network._table({**result, "shaped_steps_per_s_per_node": [1.0, float("nan")]})
    assert "not measured" in table and "met" in table and "NOT met" in table and "1.000, -" in table
    assert network._no_nan({"a": [float("nan"), 1.0]}) == {"a": [None, 1.0]}


def test_bench_network_cpu_split_per_step_between_two_polls() -> None:
    from distronet.node.bench.network_run import _Mark, _split

    a = _Mark(t=10.0, step=4, loop=1.0, process=5.0, p2pd=2.0, train=3.0, optimizer=1.5)
    b = _Mark(t=12.0, step=8, loop=1.2, process=5.8, p2pd=2.2, train=3.5, optimizer=1.8)
    rate, c = _split(a, b)
    assert rate == pytest.approx(2.0)
    assert (c.total, c.train, c.optimizer) == pytest.approx((0.25, 0.125, 0.075))
    assert (c.loop, c.other, c.p2pd) == pytest.approx((0.05, 0.025, 0.05))  # other = process - loop - train
    _, jumped = _split(a, _Mark(12.0, 4, 1.2, 5.8, 2.2, 3.5, 1.8))  # no step moved: nothing per step
    assert jumped.total != jumped.total
    table = network._table({"fraction_of_compute_rate": None, "max_budget_overshoot": None,
                            "join_to_first_accept_s": None,
                            "shaped_cpu_split": {"train": 0.125, "optimizer": 0.075, "loop": 0.05,
                                                 "other": 0.025, "p2pd": 0.05}})  # fmt: skip
    assert "0.125 (0.075) / 0.050 / 0.025 / 0.050" in table


def test_bench_network_mark_times_the_step_read_not_the_poll() -> None:
    import os
    from types import SimpleNamespace

    from distronet.node.bench.network_run import _mark

    docs = [{"step": 9, "step_time": 1000.5, "cpu_train_s": 3.0, "cpu_optimizer_s": 1.0}, {"step": 2}]
    swarm = SimpleNamespace(status=lambda i: docs[i], nodes=[SimpleNamespace(pid=os.getpid())] * 2)
    m = _mark(swarm, 0, now=2000.0, step=8)  # type: ignore[arg-type]
    assert (m.t, m.step, m.train, m.optimizer) == (1000.5, 9, 3.0, 1.0)  # the status's own step and time
    assert m.process > 0 and m.loop > 0  # this process's CPU, read by psutil
    old = _mark(swarm, 1, now=2000.0, step=2)  # a status without step_time: the poll's time
    assert (old.t, old.step) == (2000.0, 2)


def test_bench_network_fraction_needs_every_nodes_rate() -> None:
    nan = float("nan")
    assert network.swarm_fraction([3.0, 3.2, 3.4, 3.6], 4.0) == pytest.approx(0.825)
    assert network.swarm_fraction([nan, 3.9, nan, nan], 4.0) is None  # one node measured: no swarm rate
    assert network.swarm_fraction([], 4.0) is None and network.swarm_fraction([3.0], 0.0) is None


def test_bench_network_fraction_is_the_median_of_the_measured_repeats() -> None:
    assert network.repeats_fraction([0.8, None, 0.9, 0.95]) == pytest.approx(0.9)
    assert network.repeats_fraction([0.72]) == pytest.approx(0.72)
    assert network.repeats_fraction([None, None]) is None and network.repeats_fraction([]) is None


def test_bench_network_table_shows_each_swarm_run() -> None:
    row = network._list([[3.1, 3.2], [2.9, float("nan")]], ".1f")
    assert row == "3.1, 3.2 | 2.9, -"
    assert network._list([0.81, None], ".2f") == "0.81, -" and network._list([], "d") == "-"


def test_bench_network_empties_a_measurements_folder_before_reuse(tmp_path: Path) -> None:
    # a node started where an earlier run left its checkpoint resumes from it: nothing is timed
    stale = tmp_path / "shaped" / "node0" / "checkpoint.safetensors"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"step 35")
    assert network._fresh(tmp_path / "shaped") == tmp_path / "shaped"
    assert (tmp_path / "shaped").is_dir() and not any((tmp_path / "shaped").iterdir())
    assert network._fresh(tmp_path / "join").is_dir()  # a new folder is made
