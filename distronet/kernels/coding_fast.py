"""The compiled payload decoder: a cached plan per payload structure plus a compiled walk (numba).

Packets of one run share their structure: the same tensors at the same k and codings, so the
same header, class table and tensor table (docs/protocol-payload.md §2 steps 1-2; the bucket-code
parameters of steps 3-4 are each encoder's own choice and are read per packet). Everything the
decoder derives from that prefix (offsets, value sections, per-tensor modes, rank tables, scale
ranges, limit checks) is computed once, by :mod:`coding_table`'s reader, kept in a :class:`_Plan`
keyed by the prefix's exact bits, and reused for every payload that starts with the same bits
and is long enough for the prefix's length checks to pass as they did. What varies per packet,
the index bodies, scale codes, sign bits and values, is read by one compiled call
(:mod:`coding_jit`, :mod:`coding_jit_sum`), straight from the payload's bytes (no copy).

Per packet this costs a prefix comparison, the bucket-code parameters and the compiled walk
(O(bits + coefficients)), instead of dozens of numpy calls per tensor.

Contract: :func:`decode_compiled` returns exactly what
:func:`~distronet.kernels.coding_reference.decode_reference` returns, bit for bit, or None for
anything it does not accept (every payload the reference rejects, and nothing else the tests
find); the caller then lets the reference decide, with its exact code and message. Whether the
walk is compiled in this process is :func:`~distronet.kernels.jit_state.use_jit` (set by
:func:`~distronet.kernels.jit_state.mark_warm`); numba is imported
on the first compiled decode, not with this module. This module writes no files; numba keeps its
own cache in :func:`jit_cache_dir`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from distronet.kernels.coding_bits import BitReader
from distronet.kernels.coding_bucket import check_params
from distronet.kernels.coding_index import fixed_width
from distronet.kernels.coding_payload import FlatPayload
from distronet.kernels.coding_table import VALUE_BITS, VALUE_BYTES, Table, read_header, read_table
from distronet.kernels.coding_values import Q_MAX, Q_MIN, SCALE_BMAX
from distronet.protocol.errors import Rejected
from distronet.protocol.limits import Limits

__all__ = ["decode_compiled", "jit_cache_dir", "jit_stamp"]

_PLANS_KEEP = 16
_FP32, _FP16, _BF16, _INT8, _SIGN1 = 1, 2, 3, 4, 5
_ENTROPY = 2
# the numba-compiled modules
_JIT_MODULES = ("coding_jit", "coding_jit_index", "coding_jit_sum", "decode_jit", "topk_jit")


class _Refused(Exception):
    """The walk or the plan did not accept the payload (the reference judges it)."""


_REFUSED = (_Refused, Rejected, IndexError, ValueError, OverflowError)


@functools.cache
def _jit() -> ModuleType:
    """:mod:`coding_jit`, imported on first use (importing numba takes ~0.5 s)."""
    from distronet.kernels import coding_jit

    return coding_jit


@dataclass(frozen=True, eq=False)
class _Plan:
    """Everything a payload's prefix (header .. parameters) implies; see the module doc."""

    layouts: tuple[tuple[int, int], ...]
    limits: Limits
    head: bytes  # the prefix's whole bytes
    mask: int  # high bits of the next byte that still belong to the prefix
    bits: int
    min_len: int
    params_at: int  # bit where the bucket-code parameters start (from the payload's first byte)
    groups: tuple[tuple[int, int], ...]  # (chunk size, bmax) of each entropy group, ascending
    has_scales: bool
    vbytes: int
    ids: np.ndarray
    n: np.ndarray
    k: np.ndarray
    cn: np.ndarray
    offsets: np.ndarray
    mode: np.ndarray
    grp: np.ndarray
    scaled: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    n_signs: int
    vtab: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # per tensor, see coding_jit.walk

    def matches(self, data: bytes) -> bool:
        cut = len(self.head)
        return (
            len(data) >= self.min_len
            and data.startswith(self.head)
            and (not self.mask or data[cut] & self.mask == self.bits)
        )


def _value_table(t: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per tensor: value coding, byte offset in the value section, first row in the scales
    (scaled codings), bit offset among the sign bits (SIGN1); tensor order, as on the wire."""

    def starts(sizes: np.ndarray) -> np.ndarray:
        out: np.ndarray = (np.cumsum(sizes) - sizes).astype(np.int64)
        return out

    nk = t.n * t.k
    scaled = (t.vc == _INT8) | (t.vc == _SIGN1)
    return (
        t.vc.astype(np.int64),
        starts(nk * VALUE_BYTES[t.vc]),
        starts(np.where(scaled, t.n, 0)),
        starts(np.where(t.vc == _SIGN1, nk, 0)),
    )


def _build(data: bytes, layouts: tuple[tuple[int, int], ...], limits: Limits) -> _Plan:
    """Read the prefix with the one table reader (the reference's checks) and keep what it implies."""
    count, classes, rest = read_header(data, layouts, limits)
    head_len = len(data) - len(rest)
    br = BitReader(rest, "payload bit stream")
    t = read_table(br, count, classes, layouts, limits)
    nk = t.n * t.k
    vbytes = int((nk * VALUE_BYTES[t.vc]).sum())
    if vbytes > len(rest):
        raise _Refused
    br.limit(len(rest) - vbytes)
    entropy = (t.ic == _ENTROPY) & (t.k < t.cn)
    groups = sorted(set(t.cn[entropy].tolist()))
    sc = (t.vc == _INT8) | (t.vc == _SIGN1)
    end = 8 * head_len + br.pos
    value_bits = int((nk * VALUE_BITS[t.vc]).sum())
    offsets = np.zeros(nk.size + 1, dtype=np.int64)
    np.cumsum(nk, out=offsets[1:])
    step = np.where((t.vc[sc] == _SIGN1) & (t.k[sc] < 16), 4, 1)
    cut, rem = divmod(end, 8)
    mask = (0xFF << (8 - rem)) & 0xFF if rem else 0
    return _Plan(
        layouts=layouts,
        limits=limits,
        head=bytes(data[:cut]),
        mask=mask,
        bits=data[cut] & mask if mask else 0,
        min_len=head_len + max(math.ceil(value_bits / 8), vbytes + math.ceil(br.pos / 8)),
        params_at=end,
        groups=tuple((c, fixed_width(c)) for c in groups),
        has_scales=bool(sc.any()),
        vbytes=vbytes,
        ids=t.ids,
        n=t.n,
        k=t.k,
        cn=t.cn,
        offsets=offsets,
        mode=np.where(t.k == t.cn, 0, np.where(t.ic == _ENTROPY, 2, 1)),
        grp=np.searchsorted(np.array(groups, dtype=np.int64), t.cn),
        scaled=(t.n[sc], -(-Q_MIN // step), Q_MAX // step, step),
        n_signs=int(nk[t.vc == _SIGN1].sum()),
        vtab=_value_table(t),
    )


class _Plans:
    """The last few plans (any layouts), most recent first; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: OrderedDict[int, _Plan] = OrderedDict()

    def find(self, data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits) -> _Plan:
        with self._lock:
            plans = list(reversed(self._plans.values()))
        key: tuple[tuple[int, int], ...] | None = None
        for plan in plans:
            if plan.limits is limits and plan.matches(data):
                if key is None:
                    key = tuple(layouts)
                if plan.layouts == key:
                    with self._lock:
                        if id(plan) in self._plans:
                            self._plans.move_to_end(id(plan))
                    return plan
        plan = _build(data, key if key is not None else tuple(layouts), limits)
        with self._lock:
            self._plans[id(plan)] = plan
            while len(self._plans) > _PLANS_KEEP:
                self._plans.popitem(last=False)
        return plan


_PLANS = _Plans()


def _params(
    plan: _Plan, data: bytes, nbits: int
) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray], tuple[int, int]]:
    """This payload's bucket-code parameters (they differ between peers: each encoder picks its
    own): (bit after them, the walk's tables, scale parameters). Raises as the reference does."""
    at = plan.params_at
    end = at + 14 * len(plan.groups) + (7 if plan.has_scales else 0)
    if end > nbits:
        raise _Refused
    a = at >> 3
    b = (end + 7) >> 3
    x = int.from_bytes(data[a:b], "big") >> (8 * b - end)
    left = end - at
    keys = []
    for cn, bmax in plan.groups:
        left -= 14
        v = (x >> left) & 0x3FFF
        b0a, wa, b0b, wb = v >> 10, (v >> 7) & 7, (v >> 3) & 15, v & 7
        check_params(b0a, wa, bmax, "payload bit stream")
        check_params(b0b, wb, bmax, "payload bit stream")
        keys.append((cn, b0a, wa, b0b, wb))
    scale = (0, 0)
    if plan.has_scales:
        v = x & 0x7F
        scale = (v >> 3, v & 7)
        check_params(*scale, SCALE_BMAX, "payload bit stream")
    return end, _jit().walk_tables(tuple(keys)), scale


def _decode(plan: _Plan, data: bytes) -> FlatPayload:
    """One payload by its plan; raises ``_Refused`` when the walk refuses it (values included)."""
    nbits = 8 * (len(data) - plan.vbytes)
    start, tables, scale_params = _params(plan, data, nbits)
    status, idx, val = _jit().walk(
        np.frombuffer(data, dtype=np.uint8), nbits, start, plan.n, plan.k, plan.cn, plan.mode,
        plan.grp, tables, plan.offsets, plan.scaled, scale_params, plan.n_signs,
        len(data) - plan.vbytes, plan.vtab,
    )  # fmt: skip
    if status != _jit().OK:
        raise _Refused
    return FlatPayload(plan.ids, plan.n, plan.k, plan.cn, plan.offsets, idx, val)


def jit_cache_dir() -> Path:
    """The folder where numba caches the compiled walk (beside the compiled modules)."""
    return Path(__file__).parent / "__pycache__"


def jit_stamp() -> str:
    """Which compiled sources, numba and Python a cache in :func:`jit_cache_dir` was built from:
    equal stamps mean the cached code fits this process. Raises OSError or
    ``importlib.metadata.PackageNotFoundError`` when that cannot be told."""
    files = [Path(__file__).with_name(f"{name}.py").stat() for name in _JIT_MODULES]
    numba_version = importlib.metadata.version("numba")
    sources = ":".join(f"{st.st_mtime_ns}:{st.st_size}" for st in files)
    return f"{Path(__file__).parent}:{sources}:{numba_version}:{sys.version_info[:3]}"


def decode_compiled(data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits) -> FlatPayload | None:
    """Decode a payload by its plan and the compiled walk, whether or not :func:`use_jit` says so
    (the first call compiles or loads the walk). Returns None for a payload it does not accept
    (module doc); raises KernelError if ``layouts`` itself is out of limits. Cost: for a payload
    structure seen recently, one compiled pass over the bit stream plus a few array copies;
    otherwise also the prefix's read (~0.1-0.3 ms)."""
    data = bytes(data)
    if len(data) > limits.max_payload_bytes:
        return None
    try:
        return _decode(_PLANS.find(data, layouts, limits), data)
    except _REFUSED:
        return None
