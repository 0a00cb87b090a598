"""The run's model as the coordinator hands it out: :class:`GPTConfig` and :class:`ModelSpec`.

Import-light on purpose (no torch): a node checks the run's model table before it joins the
run and starts p2pd, while torch still loads in a background thread (``daemon.parts.preload_torch``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from distronet.protocol.errors import ConfigError

__all__ = ["MAX_GLOBAL_BATCH", "GPTConfig", "ModelSpec"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT. The defaults are the built-in small model (about 0.9M parameters).

    ``context`` is the longest sequence the model accepts (position embeddings); ``vocab``
    is 256 for the byte-level tokenizer. ``tie_weights`` shares the token embedding with the
    output head (saves ``vocab * width`` parameters).
    """

    depth: int = 4
    width: int = 128
    heads: int = 4
    context: int = 128
    vocab: int = 256
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = False

    def __post_init__(self) -> None:
        for name in ("depth", "width", "heads", "context", "vocab"):
            if getattr(self, name) < 1:
                raise ConfigError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ConfigError(f"GPTConfig.width ({self.width}) must be a multiple of heads ({self.heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")


MAX_GLOBAL_BATCH = 65_536  # windows per step across the run; one lone node could be asked for all


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The run's model as the coordinator hands it out (``[model]`` of the run file).

    ``arch`` must be ``"gpt"``; ``gpt`` are :class:`GPTConfig` fields; ``seed`` gives every
    replica the same initial weights; ``batch`` × ``seq_len`` tokens per step and node.
    ``global_batch`` (0: off) keeps the run's windows per step constant instead: each node
    trains on its share of it among the last round's accepted peers (``node.batch_share``), so
    when peers die the survivors take over their share.
    """

    gpt: GPTConfig
    seed: int = 0
    batch: int = 8
    seq_len: int = 64
    global_batch: int = 0

    @classmethod
    def from_run(cls, model: dict[str, Any]) -> ModelSpec:
        """Parse the run's ``model`` table. Raises ``ConfigError`` naming a bad or unknown key."""
        if model.get("arch", "gpt") != "gpt":
            raise ConfigError(f"this node trains only arch = 'gpt', the run asks for {model.get('arch')!r}")
        gpt_fields = {f.name for f in dataclasses.fields(GPTConfig)}
        own = {"arch", "seed", "batch", "seq_len", "preset", "global_batch"}
        unknown = sorted(set(model) - gpt_fields - own)
        if unknown:
            raise ConfigError(f"run model: unknown key(s) {', '.join(unknown)}")
        try:
            gpt = GPTConfig(**{k: v for k, v in model.items() if k in gpt_fields})
            spec = cls(
                gpt,
                int(model.get("seed", 0)),
                int(model.get("batch", 8)),
                int(model.get("seq_len", 64)),
                int(model.get("global_batch", 0)),
            )
        except TypeError as e:
            raise ConfigError(f"run model: {e}") from e
        if not 1 <= spec.seq_len <= gpt.context or not 1 <= spec.batch <= 4096:
            raise ConfigError(f"run model: need 1 <= seq_len <= context and 1 <= batch <= 4096, got {spec}")
        if not (spec.global_batch == 0 or spec.batch <= spec.global_batch <= MAX_GLOBAL_BATCH):
            limit = f"0 (off) or in batch..{MAX_GLOBAL_BATCH}"
            raise ConfigError(f"run model: global_batch must be {limit}, got {spec.global_batch}")
        return spec
