"""Will the run's model fit this device? :func:`estimate` and :func:`usable_memory`.

Public API (``distro-node join``'s fit check and ``distro-node doctor`` use it; keep it stable):

* :func:`estimate` ``(spec, optimizer=None, *, micro_batch=0, checkpointing=None,
  device="cpu", precision="fp32") -> FitEstimate``: the peak memory of training ``spec`` (a
  :class:`~distronet.node.models.spec.ModelSpec`) with the ``DistroOptimizer`` of ``optimizer``
  (a :class:`~distronet.node.optim.config.DistroConfig`; None: the default preset) at
  ``micro_batch`` windows per pass (0: the run's, ``ModelSpec.pass_rows``), as a typed
  breakdown in bytes. Import-light: no torch, no transformers.
* :func:`usable_memory` ``(device="cpu", cap_bytes=0) -> UsableMemory``: what this device can
  give: the host's available memory (``MemAvailable`` of ``/proc/meminfo``, psutil elsewhere,
  bounded by a cgroup limit when there is one) or, for ``cuda``, ``torch.cuda.mem_get_info``'s
  free bytes (imports torch); ``cap_bytes`` (the node's ``--memory-cap``) bounds either.
* :func:`check_fit` ``(est, usable) -> FitVerdict`` and :meth:`FitVerdict.message`: the verdict
  and what to change (the largest micro-batch that fits, checkpointing, another device).
* :func:`parse_size` ``("4GB") -> int``.

What the estimate counts (``FitEstimate`` fields; ``docs/decisions/fit-estimate.md``), all from the
model's shape (layers, width, heads, head size, MLP width, vocabulary) and the run's pass
(windows x sequence length), nothing fitted to one model:

* ``parameters``, ``gradients``: float32, the parameter shapes of the built model
  (:func:`param_shapes`; the gradients of all of them live from the first backward pass to the
  optimizer step).
* ``optimizer``: the DCT momentum (each tensor's padded chunk layout, ``kernels.layout``), the
  decode's scratch kept between rounds (:data:`DECODE_SCRATCH_FLOATS` a coefficient), and
  what the preset adds: the overlap consensus copy, the outer-momentum buffer, Adam's second
  moment, the ``ema`` guess.
* ``activations``: the peak of one forward + backward pass: every tensor autograd saves for the
  backward pass (per layer, from the block's structure: its norms, projections, attention
  probabilities when the attention is eager, MLP), the logits and their log-softmax (float32),
  and the backward pass's own transients at its start (the gradient of the log-probabilities
  and of the logits); with checkpointing, each block's input plus the larger of the head at the
  start of backward and one block recomputed (its saved tensors and backward transient; the
  head's are freed by then).
* ``codec``: the optimizer step's temporaries (the round's decoded aggregate for every tensor,
  the packet's top-k values and indices, DCT scratch of the largest tensor). The activations
  are freed by then, so the peak holds the larger of ``activations`` and ``codec``, not both.
* ``allocator``: on the CPU, what the C heap keeps beyond the live tensors (``HEAP_RETENTION``
  of the activations; ``HEAP_RETENTION_PASSES`` with several passes a step, measured on glibc;
  with checkpointing, ``HEAP_RETENTION_CHECKPOINTED`` of the un-checkpointed activations that
  live in heap-sized tensors, the forward and the recomputation each sweeping them through the
  heap, tensors of :data:`MMAP_CEILING` or more being mmapped, never retained); 0 on CUDA, where the
  figure held to is torch's count of live tensors.
* ``runtime``: a fixed allowance for what the compute library touches on its first pass
  (kernel code, thread pools; CPU) or its workspace (cuBLAS; CUDA).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distronet.kernels.layout import plan_layout
from distronet.node.models.spec import ModelSpec
from distronet.protocol.errors import ConfigError

if TYPE_CHECKING:
    from distronet.node.optim.config import DistroConfig

__all__ = [
    "FitEstimate",
    "FitVerdict",
    "ModelShape",
    "UsableMemory",
    "check_fit",
    "estimate",
    "human_bytes",
    "model_shape",
    "param_shapes",
    "parse_size",
    "usable_memory",
]

F32 = 4
MiB = 1 << 20
CPU_RUNTIME_BYTES = 48 * MiB  # kernel code and thread-local buffers faulted in by the first pass
DECODE_SCRATCH_FLOATS = 3
"""Floats a DCT coefficient that the decode's per-thread scratch holds between rounds (see
``estimate``): one for the dense inverse, up to two for the sparse one."""
CUDA_RUNTIME_BYTES = 64 * MiB  # cuBLAS workspaces, allocated through torch's caching allocator
HEAP_RETENTION = 0.35
"""CPU: the share of the activation peak glibc's heap keeps beyond the live tensors, from the
third step on, with one pass a step (freed activations below its dynamic mmap threshold, up to
32 MiB, stay in the heap and fragment it). Measured 0.24-0.45 over the GPT and the bench Llama at
two micro-batches each (``tools/fit_check.py`` with and without ``MALLOC_MMAP_THRESHOLD_``;
docs/decisions/fit-estimate.md)."""
HEAP_RETENTION_PASSES = 0.8
"""The same with two or more passes a step (gradient accumulation): measured 0.65-0.94 at 2 and 4
passes, not growing from 2 to 4."""
HEAP_RETENTION_CHECKPOINTED = 0.7
"""With activation checkpointing, as a share of the un-checkpointed activations held in heap-sized
tensors (under :data:`MMAP_CEILING`): the checkpointed forward and the recomputation each sweep
every block's full activations through the heap, though no more than one block's live at once.
Measured 0.57-0.84 over four runs of the Llama (whose 64 MiB vocabulary-wide tensors are
mmapped) and 0.67-0.68 over two of the GPT (all heap-sized); mean 0.68."""
MMAP_CEILING = 32 * MiB
"""glibc's dynamic mmap threshold never rises above this (``DEFAULT_MMAP_THRESHOLD_MAX``, 64-bit):
a tensor this large or larger is always mmapped and handed back to the system when freed, so it
never stays in the heap (while it lives it is resident beside the heap)."""


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the memory of a model depends on, read off its config (:func:`model_shape`).

    ``kind``: ``gpt`` (the built-in GPT), ``llama`` (llama, mistral, qwen2, qwen3: RMSNorm,
    rotary, SwiGLU, eager attention), ``gpt2``. ``q_dim`` = heads x head size, ``kv_dim`` = kv
    heads x head size; ``ffn`` the MLP's inner width; ``qk_norm`` per-head norms on q and k
    (qwen3); ``eager_attention``: attention probabilities (heads x T x T) are kept.
    """

    kind: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qk_norm: bool = False
    eager_attention: bool = True

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


# transformers' defaults for the keys a run's config may leave out (per model_type)
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "tie_word_embeddings": False},
    "mistral": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "qwen2": {"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": False},
    "qwen3": {"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
              "tie_word_embeddings": False},
    "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "tie_word_embeddings": True},
}  # fmt: skip


def _int(cfg: dict[str, Any], key: str, default: Any) -> int:
    v = cfg.get(key)
    if v is None:
        v = default
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"run model.hf: {key} must be a positive integer, got {v!r}")
    return v


def model_shape(spec: ModelSpec) -> ModelShape:
    """The :class:`ModelShape` of the run's model. Raises ``ConfigError`` for a config it cannot read."""
    if spec.gpt is not None:
        g = spec.gpt
        return ModelShape("gpt", g.depth, g.width, g.heads, g.heads, g.width // g.heads, 4 * g.width,
                          g.vocab, g.tie_weights, eager_attention=False)  # fmt: skip
    cfg = spec.hf_config()
    mtype = str(cfg.get("model_type"))
    d = _HF_DEFAULTS.get(mtype)
    if d is None:
        raise ConfigError(f"run model.hf: no memory model for model_type {mtype!r}")
    tied = bool(cfg.get("tie_word_embeddings", d["tie_word_embeddings"]))
    vocab = _int(cfg, "vocab_size", None)
    if mtype == "gpt2":
        e, heads = _int(cfg, "n_embd", d["n_embd"]), _int(cfg, "n_head", d["n_head"])
        inner = _int(cfg, "n_inner", 4 * e)
        return ModelShape("gpt2", _int(cfg, "n_layer", d["n_layer"]), e, heads, heads, e // heads, inner,
                          vocab, tied)  # fmt: skip
    hidden, heads = (
        _int(cfg, "hidden_size", d["hidden_size"]),
        _int(cfg, "num_attention_heads", d["num_attention_heads"]),
    )
    kv = _int(cfg, "num_key_value_heads", d.get("num_key_value_heads", heads))
    head_dim = _int(cfg, "head_dim", d.get("head_dim", hidden // heads))
    return ModelShape("llama", _int(cfg, "num_hidden_layers", d["num_hidden_layers"]), hidden, heads, kv,
                      head_dim, _int(cfg, "intermediate_size", d["intermediate_size"]), vocab, tied,
                      qk_norm=mtype == "qwen3")  # fmt: skip


def param_shapes(spec: ModelSpec) -> list[tuple[int, ...]]:
    """The shapes of the model's distinct parameters (a tied matrix once), as the build makes them."""
    s = model_shape(spec)
    h, v, f = s.hidden, s.vocab, s.ffn
    out: list[tuple[int, ...]] = []
    if s.kind == "gpt":
        assert spec.gpt is not None
        bias = spec.gpt.bias
        out += [(v, h), (spec.gpt.context, h)]
        for _ in range(s.layers):
            out += [(h,)] * (1 + bias) + [(3 * h, h)] + [(3 * h,)] * bias + [(h, h)] + [(h,)] * bias
            out += [(h,)] * (1 + bias) + [(f, h)] + [(f,)] * bias + [(h, f)] + [(h,)] * bias
        out += [(h,)] * (1 + bias)
        if not s.tied:
            out.append((v, h))
        return out
    cfg = spec.hf_config()
    if s.kind == "gpt2":
        out += [(v, h), (spec.context, h)]
        for _ in range(s.layers):  # Conv1D weights are (in, out)
            out += [(h,), (h,), (h, 3 * h), (3 * h,), (h, h), (h,), (h,), (h,), (h, f), (f,), (f, h), (h,)]
        out += [(h,), (h,)]
    else:
        qb = bool(cfg.get("attention_bias", False)) or cfg.get("model_type") == "qwen2"
        ob = bool(cfg.get("attention_bias", False))
        mb = bool(cfg.get("mlp_bias", False))
        q, kv = s.q_dim, s.kv_dim
        out.append((v, h))
        for _ in range(s.layers):
            out += [(q, h), (kv, h), (kv, h)] + ([(q,), (kv,), (kv,)] if qb else [])
            out += [(h, q)] + ([(h,)] if ob else [])
            if s.qk_norm:
                out += [(s.head_dim,), (s.head_dim,)]
            out += [(f, h), (f, h), (h, f)] + ([(f,), (f,), (h,)] if mb else [])
            out += [(h,), (h,)]
        out.append((h,))
    if not s.tied:
        out.append((v, h))
    return out


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _layer_floats(s: ModelShape, seq: int, rows: int) -> tuple[float, float]:
    """Floats per token that autograd keeps for one block, and the block's backward transient
    (the gradients of its widest activations while they are computed)."""
    h, f, t = s.hidden, s.ffn, seq
    if s.kind == "gpt":
        # ln_1 in/out, q|k|v, attention out and its re-assembly, residual, ln_2 in/out: 8h; fc out
        # and gelu out: 2f; flash attention keeps a logsumexp per head; two norms a mean and rstd
        saved: float = 8 * h + 2 * f + s.heads + 4
    elif s.kind == "llama":
        # two RMSNorms (input and normalised product, 2h each) and their outputs (h each); rotated
        # q, repeated k and v, attention out: 4 q_dim; gate, silu, up, product: 4f; probs: heads x T
        saved = 6 * h + 4 * s.q_dim + 4 * f + s.heads * t + 2
        if s.qk_norm:
            saved += 2 * s.q_dim + 2 * s.kv_dim + s.heads + s.kv_heads
    else:  # gpt2, eager attention with p = 0 dropouts (they still keep a mask and an output)
        saved = 10 * h + 2 * f + 2.25 * s.heads * t + 0.75 * h + 0.25 * f + 4
    transient = 2 * max(f, h, s.heads * t if s.eager_attention else 0)
    return saved, transient


def _mmapped_floats(s: ModelShape, seq: int, rows: int) -> float:
    """Floats per token of the un-checkpointed peak (:func:`_layer_floats` for every block, the
    head and its backward transient) held in tensors of at least :data:`MMAP_CEILING` bytes,
    which glibc mmaps: the head's vocabulary-wide tensors (the log-softmax and the two gradients
    at the start of backward), a block's MLP-wide tensors and its attention probabilities."""
    tokens = rows * seq

    def big(width: float) -> bool:
        return F32 * tokens * width >= MMAP_CEILING

    out = 3.0 * s.vocab if big(s.vocab) else 0.0
    mlp = {"gpt": 2, "llama": 4}.get(s.kind, 2.25)  # MLP-wide tensors a block saves
    per_layer = mlp * s.ffn if big(s.ffn) else 0.0
    if s.eager_attention and big(s.heads * seq):
        per_layer += (2.25 if s.kind == "gpt2" else 1) * s.heads * seq
    return out + s.layers * per_layer


def _head_floats(s: ModelShape, seq: int, rows: int) -> float:
    """Floats per token kept outside the blocks: the final norm (input, output), the
    log-softmax of the logits, the ids and targets (int64), the rotary tables."""
    extra = 2 * s.head_dim / rows if s.kind == "llama" else 0.0
    return 3 * s.hidden + s.vocab + 1 + 4 + extra


@dataclasses.dataclass(frozen=True)
class FitEstimate:
    """Peak memory of one node's training, in bytes (module docstring for what each counts).

    ``total`` = parameters + gradients + optimizer + max(activations + allocator, codec) + runtime."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    codec: int
    allocator: int
    runtime: int
    micro_batch: int
    seq_len: int
    checkpointing: bool
    device: str
    precision: str
    n_parameters: int

    @property
    def total(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.optimizer
            + max(self.activations + self.allocator, self.codec)
            + self.runtime
        )

    def breakdown(self) -> str:
        """One line: each part and the total, in human units."""
        parts = ("parameters", "gradients", "optimizer", "activations", "allocator", "codec", "runtime")
        body = ", ".join(f"{p} {human_bytes(getattr(self, p))}" for p in parts)
        return f"{body}; peak {human_bytes(self.total)}"


def estimate(
    spec: ModelSpec,
    optimizer: DistroConfig | None = None,
    *,
    micro_batch: int = 0,
    checkpointing: bool | None = None,
    device: str = "cpu",
    precision: str = "fp32",
) -> FitEstimate:
    """Peak memory of training ``spec`` on ``device`` (module docstring). ``micro_batch``: the
    node's own (0: the run's); ``checkpointing`` None: the run's. Raises ``ConfigError``."""
    if optimizer is None:
        from distronet.node.optim.config import preset

        optimizer = preset("ours_k32")
    if micro_batch < 0:
        raise ConfigError(f"micro_batch must be >= 0, got {micro_batch}")
    if precision not in ("fp32", "bf16"):
        raise ConfigError(f"precision must be fp32 or bf16 here (resolved), got {precision!r}")
    s = model_shape(spec)
    rows = spec.pass_rows(micro_batch)
    seq = spec.seq_len
    ckpt = spec.checkpointing if checkpointing is None else (checkpointing or spec.checkpointing)
    shapes = param_shapes(spec)
    n_params = sum(_numel(x) for x in shapes)
    layouts = [plan_layout(tuple(x), optimizer.extraction.chunk) for x in shapes]
    coeffs = sum(lay.n_chunks * lay.chunk_numel for lay in layouts)
    params = grads = F32 * n_params

    state = F32 * coeffs  # DCT momentum
    # the decode's scratch, kept per thread from round to round (``kernels.workspace``): the dense
    # inverse's first product (one float a coefficient), the sparse inverse's factors and product
    # (at most two a coefficient); held through the next forward and backward, so not a temporary
    state += DECODE_SCRATCH_FLOATS * F32 * coeffs
    if optimizer.overlap.enabled:
        state += F32 * n_params  # consensus copy
        if optimizer.overlap.predict == "ema":
            state += F32 * n_params
    if optimizer.update.outer_momentum:
        state += F32 * n_params
    rules = {optimizer.update.rule.value, optimizer.update.fallback.value}
    if "adam" in rules:
        state += F32 * n_params

    tokens = rows * seq
    saved, transient = _layer_floats(s, seq, rows)
    head = _head_floats(s, seq, rows)
    # at the start of backward: the log-softmax's input gradient and the loss's, both B x T x V
    head_transient = 2 * s.vocab
    full = F32 * tokens * (s.layers * saved + head + max(transient, head_transient))  # no checkpointing
    if ckpt:
        # each block keeps its input only; the peak is either the start of backward (the head's
        # saved tensors and its gradients) or, once the head's are freed, one block recomputed
        # (its saved tensors, its backward transient, the gradient flowing into it)
        at_head = head + head_transient
        in_block = saved + transient + s.hidden
        act = F32 * tokens * (s.layers * s.hidden + max(at_head, in_block))
    else:
        act = full
    if precision == "bf16":
        # autocast keeps bf16 copies of the weights for backward, and matmul outputs in bf16
        act = int(act * 0.75) + 2 * n_params
    passes = -(-(spec.global_batch or spec.batch) // rows)

    largest = max(lay.n_chunks * lay.chunk_numel for lay in layouts)
    k = max(optimizer.extraction.k, optimizer.extraction.k_start)
    kept = sum(lay.n_chunks * min(k, lay.chunk_numel) for lay in layouts)
    # decoded aggregate of every tensor, this step's sent top-k (fp32 value + int64 index) kept
    # until its round is applied, the applied updates (overlap), DCT scratch of the largest tensor
    codec = F32 * coeffs + 12 * kept + 3 * F32 * largest
    if optimizer.overlap.enabled:
        codec += F32 * n_params
    runtime = CUDA_RUNTIME_BYTES if device == "cuda" else CPU_RUNTIME_BYTES
    if device == "cuda":
        heap = 0
    elif ckpt:
        # the checkpointed forward and the recomputation each sweep every block's full
        # activations through the heap; only what lives in heap-sized tensors (under glibc's
        # mmap ceiling) can stay behind there
        churn = full - F32 * tokens * _mmapped_floats(s, seq, rows)
        heap = int(HEAP_RETENTION_CHECKPOINTED * churn)
    else:
        heap = int((HEAP_RETENTION_PASSES if passes > 1 else HEAP_RETENTION) * act)
    return FitEstimate(
        params, grads, int(state), int(act), int(codec), heap, runtime, rows, seq, ckpt, device, precision,
        n_params,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class UsableMemory:
    """What the device can give training, in bytes, and where that figure came from."""

    bytes: int
    source: str


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def _cgroup_left() -> int | None:
    """A cgroup v2 memory limit's headroom (``memory.max`` - ``memory.current``), if limited."""
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        current = int((base / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit():
        return None
    return max(0, int(limit) - current)


def usable_memory(device: str = "cpu", cap_bytes: int = 0) -> UsableMemory:
    """What ``device`` (``cpu``, ``cuda``, ``mps``, ``mlx``; the latter two share the host's memory)
    can give, bounded by ``cap_bytes`` when it is > 0 (module docstring). Raises
    ``ConfigError`` for a negative cap."""
    if cap_bytes < 0:
        raise ConfigError(f"memory cap must be >= 0, got {cap_bytes}")
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        have, source = int(free), "free CUDA memory (torch.cuda.mem_get_info)"
    else:
        avail = _meminfo_available()
        source = "MemAvailable (/proc/meminfo)"
        if avail is None:
            import psutil

            avail, source = int(psutil.virtual_memory().available), "available memory (psutil)"
        left = _cgroup_left()
        if left is not None and left < avail:
            avail, source = left, "the cgroup's memory.max headroom"
        have = avail
    if cap_bytes and cap_bytes < have:
        return UsableMemory(cap_bytes, "the node's memory cap (--memory-cap)")
    return UsableMemory(have, source)


@dataclasses.dataclass(frozen=True)
class FitVerdict:
    """:func:`check_fit`'s answer: ``fits``, and what would fit when it does not."""

    fits: bool
    estimate: FitEstimate
    usable: UsableMemory
    largest_micro_batch: int  # the largest pass that fits as configured (0: not even one window)
    fits_with_checkpointing: bool

    def message(self) -> str:
        """What needs how much, what this node has, and what to change."""
        e, u = self.estimate, self.usable
        head = (
            f"the run's model needs about {human_bytes(e.total)} on {e.device} at micro-batch "
            f"{e.micro_batch} x {e.seq_len} tokens{' with checkpointing' if e.checkpointing else ''} "
            f"({e.breakdown()}), but this node has {human_bytes(u.bytes)} ({u.source})"
        )
        if self.fits:
            return head.replace(", but this node has", "; this node has")
        fixes: list[str] = []
        if self.largest_micro_batch:
            fixes.append(f"a micro-batch of at most {self.largest_micro_batch} (--micro-batch "
                         f"{self.largest_micro_batch})")  # fmt: skip
        if not e.checkpointing and self.fits_with_checkpointing:
            fixes.append("activation checkpointing (--activation-checkpointing)")
        fixes.append("a device with more memory (or a higher --memory-cap)")
        return f"{head}; to fit, use " + ", or ".join(fixes) + " (--no-fit-check skips this check)"


def check_fit(
    spec: ModelSpec,
    usable: UsableMemory,
    optimizer: DistroConfig | None = None,
    *,
    micro_batch: int = 0,
    checkpointing: bool | None = None,
    device: str = "cpu",
    precision: str = "fp32",
) -> FitVerdict:
    """Whether :func:`estimate` fits in ``usable``; when not, the largest micro-batch that does and
    whether checkpointing would."""
    kw: dict[str, Any] = {"checkpointing": checkpointing, "device": device, "precision": precision}
    est = estimate(spec, optimizer, micro_batch=micro_batch, **kw)
    if est.total <= usable.bytes:
        return FitVerdict(True, est, usable, est.micro_batch, True)
    lo, hi = 0, est.micro_batch  # the largest micro-batch in [1, hi) that fits: bisection
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate(spec, optimizer, micro_batch=mid, **kw).total <= usable.bytes:
            lo = mid
        else:
            hi = mid
    with_ckpt = estimate(spec, optimizer, micro_batch=micro_batch, **{**kw, "checkpointing": True})
    return FitVerdict(False, est, usable, lo, with_ckpt.total <= usable.bytes)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4,
          "tib": 1024**4}  # fmt: skip


def parse_size(text: str) -> int:
    """Bytes of a size such as ``512MiB``, ``4GB``, ``1.5g``, ``1000`` (decimal units, ``*iB``
    binary). Raises ``ConfigError``."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ConfigError(f"not a size: {text!r} (e.g. 512MiB, 4GB)")
    return int(float(m.group(1)) * _UNITS[unit])


def human_bytes(n: float) -> str:
    """``n`` bytes in MB or GB (decimal, one decimal place)."""
    if abs(n) >= 1000**3:
        return f"{n / 1000**3:.2f} GB"
    return f"{n / 1000**2:.1f} MB"
