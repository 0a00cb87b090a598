"""The compiled payload decoder (coding_fast + coding_jit) against the reference decoder, the oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distronet.kernels import coding_fast, jit_state
from distronet.kernels.coding import (
    EncodedTensor,
    FlatPayload,
    IndexCoding,
    ValueCoding,
    decode_payload,
    encode_payload,
    encode_tensor,
    use_jit,
    warm,
)
from distronet.kernels.coding_reference import decode_reference
from distronet.protocol.errors import Rejected
from distronet.protocol.limits import DEFAULT_LIMITS


@pytest.fixture(autouse=True, scope="module")
def _warm() -> None:
    """The public decoder takes the compiled path in these tests (as a node after start-up)."""
    assert warm(), "numba is a dependency: the compiled decoder must be available"


def test_numba_is_present() -> None:
    """numba is a dependency: without it every test here would test the reference twice."""
    assert jit_state.HAVE_JIT and use_jit()


CHUNKS = [1, 7, 9, 49, 64, 256, 4096]
Layouts = list[tuple[int, int]]


def _tensors(rng: np.random.Generator, layouts: Layouts, codings: dict[int, tuple[int, int, int]]) -> bytes:
    """A payload over ``layouts``; ``codings[tid] = (value coding, index coding, k)`` (absent: skipped)."""
    coded: list[EncodedTensor] = []
    for tid, (vc, ic, k) in codings.items():
        n, cn = layouts[tid]
        weight = (1.0 + np.arange(cn)) if rng.random() < 0.5 else np.ones(cn)
        idx = np.sort(np.argsort(rng.random((n, cn)) * weight, axis=1)[:, :k], axis=1).astype(np.int64)
        val = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-6, 1, (n, 1))).astype(np.float32)
        if rng.random() < 0.05:
            val[:] = 0
        coded.append(encode_tensor(tid, idx, val, cn, ValueCoding(vc), IndexCoding(ic))[0])
    return encode_payload(coded)


def _structure(rng: np.random.Generator) -> tuple[Layouts, dict[int, tuple[int, int, int]]]:
    layouts = [(int(rng.integers(1, 9)), int(rng.choice(CHUNKS))) for _ in range(int(rng.integers(1, 12)))]
    codings = {}
    for tid, (_n, cn) in enumerate(layouts):
        if rng.random() < 0.3:
            continue
        k = min(cn, int(rng.choice([1, 2, 4, 32, cn])))
        codings[tid] = (int(rng.integers(1, 6)), int(rng.integers(1, 3)), k)
    while len({c for c in codings.values()}) > 15:
        codings.pop(next(iter(codings)))
    return layouts, codings


def _compiled_only(data: bytes, layouts: Layouts) -> FlatPayload | None:
    """The compiled path itself, no fallback (None where it refuses)."""
    return coding_fast.decode_compiled(data, layouts, DEFAULT_LIMITS)


def _same(a: list, b: list) -> bool:  # type: ignore[type-arg]
    return len(a) == len(b) and all(
        x.tensor_id == y.tensor_id and np.array_equal(x.idx, y.idx) and x.val.tobytes() == y.val.tobytes()
        for x, y in zip(a, b, strict=True)
    )


def _check(data: bytes, layouts: Layouts) -> bool:
    """The compiled path and the public decoder agree with the reference; True if it accepts."""
    try:
        ref: list | None = decode_reference(data, layouts).tensors()  # type: ignore[type-arg]
        code = None
    except Rejected as e:
        ref, code = None, e.code
    fast = _compiled_only(data, layouts)
    if ref is None:
        assert fast is None, f"the compiled path accepted a payload the reference rejects ({code})"
        with pytest.raises(Rejected) as info:
            decode_payload(data, layouts)
        assert info.value.code == code
        return False
    assert fast is not None and _same(fast.tensors(), ref)  # it accepts every valid payload itself
    assert _same(decode_payload(data, layouts).tensors(), ref)
    return True


def _mutate(rng: np.random.Generator, data: bytes, after: int) -> bytes:
    """1-3 bit flips, truncations or inserted bytes, at or after byte ``after``."""
    d = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        op, lo = int(rng.integers(0, 3)), min(after, len(d))
        if op == 0 and len(d) > lo:
            d[int(rng.integers(lo, len(d)))] ^= 1 << int(rng.integers(0, 8))
        elif op == 1 and len(d) > lo + 1:
            del d[int(rng.integers(lo, len(d))) :]
        else:
            d.insert(int(rng.integers(lo, len(d) + 1)), int(rng.integers(0, 256)))
    return bytes(d)


def test_compiled_path_equals_reference_on_valid_and_mutated_payloads() -> None:
    """Several payloads per structure (so plans are reused), each mutated anywhere and in its body."""
    rng = np.random.default_rng(11)
    for _ in range(30):
        layouts, codings = _structure(rng)
        for _ in range(3):
            data = _tensors(rng, layouts, codings)
            assert _check(data, layouts)
            head = len(coding_fast._PLANS.find(data, layouts, DEFAULT_LIMITS).head)
            for _ in range(6):
                _check(_mutate(rng, data, 0), layouts)
                _check(_mutate(rng, data, head), layouts)  # same prefix: the cached plan is used


def test_plan_is_reused_and_length_checked() -> None:
    rng = np.random.default_rng(3)
    layouts = [(4, 4096), (3, 64), (2, 64)]
    codings = {0: (5, 2, 32), 1: (4, 2, 4), 2: (1, 1, 8)}
    a, b = (_tensors(rng, layouts, codings) for _ in range(2))
    pa = coding_fast._PLANS.find(a, layouts, DEFAULT_LIMITS)
    assert coding_fast._PLANS.find(b, layouts, DEFAULT_LIMITS) is pa  # same structure, own parameters
    for cut in range(1, len(a)):  # every truncation: rejected exactly as the reference does
        _check(a[:cut], layouts)
    assert _check(a, [*layouts, (1, 16)])  # other layouts: another plan, same result


def test_falls_back_to_the_reference_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    layouts, codings = [(3, 64), (2, 4096)], {0: (2, 2, 4), 1: (5, 1, 32)}
    data = _tensors(rng, layouts, codings)
    want = decode_payload(data, layouts).tensors()
    monkeypatch.setattr(jit_state, "HAVE_JIT", False)
    assert not use_jit()
    monkeypatch.setattr(coding_fast, "decode_compiled", None)  # would raise if it were called
    assert _same(decode_payload(data, layouts).tensors(), want)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
)
def test_hypothesis_edits_agree_with_reference(seed: int, edits: list[tuple[int, int]]) -> None:
    """Byte overwrites anywhere in a valid payload: same verdict and bits as the reference."""
    rng = np.random.default_rng(seed)
    layouts, codings = _structure(rng)
    data = bytearray(_tensors(rng, layouts, codings))
    for at, byte in edits:
        if data:
            data[at % len(data)] = byte
    _check(bytes(data), layouts)


def _cache_dir_files() -> list[str]:
    """The cache folder's files but numba's own (``.nbi``/``.nbc``) and the files other processes
    write there while being written (``<name>.tmp.<id>``: numba's and node's marker's, from
    another xdist worker's test)."""
    return sorted(
        p.name
        for p in coding_fast.jit_cache_dir().iterdir()
        if not p.name.endswith((".nbi", ".nbc")) and ".tmp." not in p.name
    )


def test_warm_compiles_the_walk_and_writes_no_file() -> None:
    before = _cache_dir_files()
    assert warm() is True
    assert use_jit()
    after = _cache_dir_files()
    assert after == before  # only numba's own cache files (.nbi/.nbc) may appear
    assert coding_fast.jit_stamp() == coding_fast.jit_stamp()  # stable: what node's marker keeps


def test_flat_layout_and_views() -> None:
    rng = np.random.default_rng(7)
    idx = np.sort(np.argsort(rng.random((3, 64)), axis=1)[:, :4], axis=1).astype(np.int64)
    val = rng.standard_normal((3, 4)).astype(np.float32)
    a, deq_a = encode_tensor(0, idx, val, 64, ValueCoding.SIGN1, IndexCoding.ENTROPY)
    b, deq_b = encode_tensor(2, idx[:2], val[:2], 64, ValueCoding.FP32, IndexCoding.FIXED)
    data, layouts = encode_payload([b, a]), [(3, 64), (5, 16), (2, 64)]
    for flat in (decode_payload(data, layouts), decode_reference(data, layouts)):
        assert flat.tensor_ids.tolist() == [0, 2] and flat.k.tolist() == [4, 4] and flat.n.tolist() == [3, 2]
        assert flat.cn.tolist() == [64, 64]
        assert flat.offsets.tolist() == [0, 12, 20]
        assert flat.idx.dtype == np.int64 and flat.val.dtype == np.float32
        np.testing.assert_array_equal(flat.idx, np.concatenate([idx.ravel(), idx[:2].ravel()]))
        assert flat.val.tobytes() == np.concatenate([deq_a.ravel(), deq_b.ravel()]).tobytes()
        t0, t2 = flat.tensors()
        assert t0.idx.shape == (3, 4) and t2.val.shape == (2, 4)
    for empty in (
        decode_payload(encode_payload([]), [(1, 4)]),
        decode_reference(encode_payload([]), [(1, 4)]),
    ):
        assert empty.idx.size == 0 and empty.tensors() == []


def test_the_stamp_covers_every_compiled_module() -> None:
    """A module of numba code left out of the stamp would let a node trust a cache built from
    its older source."""
    folder = Path(coding_fast.__file__).parent
    marks = ("\n@compiled", "\n@inlined")
    compiled = {p.stem for p in folder.glob("*.py") if any(m in p.read_text() for m in marks)}
    assert compiled and compiled <= set(coding_fast._JIT_MODULES)
