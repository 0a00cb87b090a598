"""Every limit a decoder checks a wire value against, in one frozen dataclass.

A decoder never allocates, loops or indexes by a number read off the wire before comparing it
with one of these. The defaults (``DEFAULT_LIMITS``) carry a step packet of a model of up to
about one billion parameters with room to spare, and nothing much larger:

- a 1B-parameter model at chunk 64 (4096 coefficients per chunk) has ~244k chunks; at k = 32 that
  is ~7.8M coefficients, ~48 MB even with fp32 values and 16-bit indices (96 bits per coefficient
  with int64 indices: ~94 MB); ``max_payload_bytes`` is 128 MiB;
- its largest tensor (a 128k x 2048 embedding) has 64k chunks of 64x64, or 256k of 32x32;
- a GPT-style 1B model has a few hundred parameter tensors.

Limits are part of a run's contract: a run may tighten them for its model (``Limits(...)`` or
``dataclasses.replace(DEFAULT_LIMITS, ...)``); a node never loosens them past what it can hold.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_STREAM_LIMITS",
    "MAX_PROBE_BYTES",
    "MAX_TOKENIZER_BYTES",
    "Limits",
    "StreamLimits",
]

_MiB = 1 << 20

MAX_TOKENIZER_BYTES = 64 * _MiB
"""A run's tokenizer file (a Hugging Face ``tokenizers`` JSON): the most ``data prepare`` reads,
the coordinator serves (``GET /runs/{run_id}/tokenizer.json``) and a node downloads. The largest
common ones (256k-token vocabularies) are about 35 MB."""

MAX_PROBE_BYTES = 4 * _MiB
"""The most bytes one transfer probe of the coordinator carries, either way
(``GET``/``POST /runs/{run_id}/probe``, what `distro-node doctor` times): checked before the
coordinator allocates or reads, and by the node before it sends."""


@dataclass(frozen=True)
class Limits:
    """Wire limits. All are inclusive maxima (a value equal to the limit is accepted)."""

    # --- bytes -------------------------------------------------------------------------------
    max_frame_bytes: int = 128 * _MiB + 64 * 1024
    """A whole frame as received (header + zstd body)."""
    max_decompressed_bytes: int = 128 * _MiB + 64 * 1024
    """The msgpack body after zstd decompression (envelope + payload)."""
    max_payload_bytes: int = 128 * _MiB
    """The coded payload (``distronet.kernels.coding``) inside a step packet."""
    max_announcement_bytes: int = 1024
    """A whole gossip announcement frame (gossip carries only these; see announce.py)."""

    # --- payload shape (checked by the payload decoder) -----------------------------------------
    max_tensors: int = 4096
    """Tensors in one run's layout, and tensors in one payload."""
    max_chunks_per_tensor: int = 1 << 20
    """Chunks of one tensor."""
    max_chunk_numel: int = 1 << 14
    """Coefficients in one chunk (s*s for 2-D blocks, s for 1-D runs); 16384 = 128 x 128."""
    max_k: int = 1 << 14
    """Coefficients sent per chunk (k <= chunk_numel always)."""
    max_total_coefficients: int = 1 << 26
    """Sum over a payload's tensors of n_chunks * k (64M: k = 256 of a 1B model at chunk 64)."""
    max_dims: int = 8
    """Rank of a tensor in a layout."""
    max_dim_size: int = 1 << 24
    """One dimension of a tensor."""
    max_tensor_numel: int = 1 << 31
    """Elements of one tensor (product of its shape)."""

    # --- identifiers and text ----------------------------------------------------------------
    max_run_id_len: int = 64
    """Run id length in characters (``[A-Za-z0-9._-]``, starting with a letter or digit)."""
    max_tensor_name_len: int = 256
    """Parameter name length in a layout, in UTF-8 bytes."""
    max_multiaddr_len: int = 256
    """A multiaddr hint in an announcement, in bytes."""
    max_member_record_bytes: int = 4096
    """A signed membership record's value in the DHT (magic + signature + its msgpack map)."""
    max_member_maddrs: int = 16
    """Multiaddrs in one membership record (each at most ``max_multiaddr_len`` bytes)."""
    max_step: int = (1 << 63) - 1
    """Largest step number (steps are 0 <= step <= max_step)."""

    # --- step window ------------------------------------------------------------------------
    max_step_lag: int = 16
    """Accept a packet up to this many steps older than the node's current step."""
    max_step_lead: int = 2
    """Accept a packet up to this many steps ahead of the node's current step."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Limits.{f.name} must be a non-negative int, got {value!r}")
        if self.max_payload_bytes > self.max_decompressed_bytes:
            raise ValueError("Limits.max_payload_bytes cannot exceed max_decompressed_bytes")
        if self.max_k > self.max_chunk_numel:
            raise ValueError("Limits.max_k cannot exceed max_chunk_numel")

    def step_in_window(self, step: int, current_step: int) -> bool:
        """True when ``step`` lies in ``[current_step - max_step_lag, current_step + max_step_lead]``."""
        return current_step - self.max_step_lag <= step <= current_step + self.max_step_lead


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class StreamLimits:
    """Limits of the direct-stream protocols (docs/protocol.md section 14.6). Inclusive maxima.

    These bound what one node reads from one stream before it allocates or loops; unlike
    ``Limits`` they are a node's own choice, not a run's contract (a node that asks for less
    simply gets fewer answers). Steps in stream messages are bounded by ``Limits.max_step``.
    """

    max_manifest_answer_bytes: int = 64 * 1024
    """The body of a manifest-ask answer: a sealed or adopted round manifest."""
    max_state_manifest_bytes: int = 4 * _MiB
    """A signed state manifest (its msgpack map)."""
    max_state_chunks: int = 100_000
    """Chunk hashes in one state manifest."""
    max_state_chunk_bytes: int = 64 * _MiB
    """One chunk of a state blob (donors use 4 MiB)."""
    serve_window_s: int = 10
    """The window over which each peer's requests and bytes served are counted (a server's own)."""
    serve_requests_per_window: int = 512
    """Requests one peer may make of one served protocol per window; past it its streams close."""
    serve_concurrent_per_peer: int = 32
    """Streams of one protocol served to one peer at once."""
    serve_upload_share_pct: int = 50
    """Most of the upload budget (rate x window + burst), in percent, that one peer may be served
    per window; a peer past it is refused (LIMIT_EXCEEDED) while others are still served."""
    announced_hold_floor_bytes: int = 64 * 1024
    """Download budget an announced frame may hold while pulled even when its fair share (the
    budget by the deadline over the peers in the topic) is smaller; never more than it claims."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StreamLimits.{f.name} must be a positive int, got {value!r}")
        if self.serve_upload_share_pct > 100:
            raise ValueError("StreamLimits.serve_upload_share_pct is a percentage (1..100)")


DEFAULT_STREAM_LIMITS = StreamLimits()
