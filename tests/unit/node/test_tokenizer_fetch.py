"""A node's copy of the run's tokenizer (``node/data/tokenizer_fetch.py``): fetched once over
HTTP, kept only when its sha256 is the run info's, never kept under its final name otherwise,
and not downloaded again when the data dir already has it. The coordinator here is a real
aiohttp server that can lie (other bytes, an oversized body declared or not, errors)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from distronet.node.config import NodeConfig
from distronet.node.daemon.node import Node, NodeError
from distronet.node.data import tokenizer_fetch as tf
from distronet.node.exitcodes import ExitCode

TOKENIZER = b'{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}\n'
SHA = hashlib.sha256(TOKENIZER).hexdigest()


@dataclass
class FakeCoordinator:
    """Serves ``/api/v1/runs/{run}/tokenizer.json`` with whatever ``answer`` builds; counts hits."""

    url: str = ""
    hits: int = 0
    answer: Callable[[web.Request], web.StreamResponse] = field(
        default=lambda _r: web.Response(body=TOKENIZER, content_type="application/json")
    )


@pytest.fixture
async def coord() -> AsyncIterator[FakeCoordinator]:
    fake = FakeCoordinator()

    async def handler(request: web.Request) -> web.StreamResponse:
        fake.hits += 1
        resp = fake.answer(request)
        if isinstance(resp, web.StreamResponse) and not isinstance(resp, web.Response):
            await resp.prepare(request)  # a streamed answer (no Content-Length)
            for _ in range(4):
                await resp.write(b"x" * 4096)
            await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/runs/{run_id}/tokenizer.json", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    await runner.cleanup()


def _files(data_dir: Path) -> set[str]:
    folder = data_dir / tf.TOKENIZER_DIR
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


async def test_the_runs_tokenizer_is_fetched_verified_and_cached(
    coord: FakeCoordinator, tmp_path: Path
) -> None:
    data = {"tokenizer": "hf", "tokenizer_sha256": SHA}
    path = await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path)
    assert path == tmp_path / "tokenizers" / f"{SHA}.json" and path.read_bytes() == TOKENIZER
    assert coord.hits == 1
    assert tf.run_tokenizer_sha(tmp_path, "r1") == SHA and tf.run_tokenizer_sha(tmp_path, "r2") is None
    assert _files(tmp_path) == {f"{SHA}.json", "run-r1.sha256"}  # no temporary file left
    # a node that has it already does not download it again (a restart, or a second run)
    assert await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path) == path
    assert await tf.ensure_run_tokenizer(coord.url, "r2", data, tmp_path) == path
    assert coord.hits == 1 and tf.run_tokenizer_sha(tmp_path, "r2") == SHA
    # a cached copy that no longer hashes right is fetched again and replaced
    path.write_bytes(TOKENIZER[:-1] + b" ")
    assert tf.cached_tokenizer(tmp_path, SHA) is None
    assert await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path) == path
    assert coord.hits == 2 and path.read_bytes() == TOKENIZER


async def test_a_byte_level_run_has_no_tokenizer_to_fetch(coord: FakeCoordinator, tmp_path: Path) -> None:
    assert await tf.ensure_run_tokenizer(coord.url, "r1", {"tokenizer": "byte"}, tmp_path) is None
    assert coord.hits == 0 and _files(tmp_path) == set()


async def test_a_lying_coordinators_bytes_are_never_kept(coord: FakeCoordinator, tmp_path: Path) -> None:
    """Other bytes than the advertised sha256, a declared size over the limit, and a streamed
    body (no Content-Length) over it: TokenizerMismatch, nothing under the final name, no
    temporary file left behind."""
    data = {"tokenizer_sha256": SHA}
    coord.answer = lambda _r: web.Response(body=TOKENIZER.replace(b'"a"', b'"b"'))
    with pytest.raises(tf.TokenizerMismatch, match="sha256"):
        await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path)
    assert _files(tmp_path) == set()
    coord.answer = lambda _r: web.Response(body=b"x" * 5000)
    with pytest.raises(tf.TokenizerMismatch, match="declares a tokenizer of 5000 bytes"):
        await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path, max_bytes=4096)
    assert _files(tmp_path) == set()
    coord.answer = lambda _r: web.StreamResponse()  # 4 x 4096 bytes, chunked
    with pytest.raises(tf.TokenizerMismatch, match="more than the 10000 byte"):
        await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path, max_bytes=10_000)
    assert _files(tmp_path) == set()
    # the right file arrives once the coordinator stops lying
    coord.answer = lambda _r: web.Response(body=TOKENIZER)
    assert (await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path)) is not None


async def test_refusals_and_outages_are_typed(coord: FakeCoordinator, tmp_path: Path) -> None:
    data = {"tokenizer_sha256": SHA}
    coord.answer = lambda _r: web.json_response(
        {"error": {"code": "not_found", "message": "run r1 has no tokenizer here"}}, status=404
    )
    with pytest.raises(tf.TokenizerNotServed, match="has no tokenizer here"):
        await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path)
    coord.answer = lambda _r: web.Response(status=503)
    with pytest.raises(tf.TokenizerUnavailable, match="503"):
        await tf.ensure_run_tokenizer(coord.url, "r1", data, tmp_path)
    with pytest.raises(tf.TokenizerUnavailable, match="could not be downloaded"):
        await tf.ensure_run_tokenizer("http://127.0.0.1:9", "r1", data, tmp_path)
    with pytest.raises(tf.TokenizerError, match="64 lower-case hex"):
        await tf.ensure_run_tokenizer(coord.url, "r1", {"tokenizer_sha256": "AB" * 32}, tmp_path)
    assert _files(tmp_path) == set()


async def test_the_node_exits_with_a_named_code_on_a_mismatch(coord: FakeCoordinator, tmp_path: Path) -> None:
    """At join (``Node._fetch_tokenizer``): a mismatch is TOKENIZER_MISMATCH, an outage
    COORDINATOR_UNREACHABLE, a coordinator that serves none lets the node go on."""
    node = Node(NodeConfig(run_id="r1", coordinator=coord.url, data_dir=str(tmp_path)))
    node.run_info = {"data": {"tokenizer": "hf", "tokenizer_sha256": SHA}}
    coord.answer = lambda _r: web.Response(body=b"{}")
    with pytest.raises(NodeError, match="sha256") as err:
        await node._fetch_tokenizer()
    assert err.value.exit_code is ExitCode.TOKENIZER_MISMATCH == 8
    coord.answer = lambda _r: web.Response(status=500)
    with pytest.raises(NodeError) as err:
        await node._fetch_tokenizer()
    assert err.value.exit_code is ExitCode.COORDINATOR_UNREACHABLE
    coord.answer = lambda _r: web.json_response({"error": {"code": "not_found", "message": "no"}}, status=404)
    await node._fetch_tokenizer()  # logged; training needs only the shards
    coord.answer = lambda _r: web.Response(body=TOKENIZER)
    await node._fetch_tokenizer()
    assert tf.cached_tokenizer(tmp_path, SHA) == tmp_path / "tokenizers" / f"{SHA}.json"
    await node.close()
