"""The run's model as the coordinator hands it out: :class:`GPTConfig` and :class:`ModelSpec`.

Import-light on purpose (no torch, no transformers): a node checks the run's model table before
it joins the run and starts p2pd, while torch still loads in a background thread
(``daemon.parts.preload_torch``).

Two architectures: ``arch = "gpt"`` (the built-in GPT, :class:`GPTConfig` fields in ``[model]``)
and ``arch = "hf"`` (a Hugging Face causal LM built from the config in ``[model.hf]``: a table,
or the path of a ``config.json`` beside the run file, which the coordinator inlines when it loads
the run file; :func:`check_hf_config` says what such a config may hold).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distronet.protocol.errors import ConfigError
from distronet.protocol.run_file import MODEL_CONFIG_MAX_BYTES, read_json_beside

__all__ = [
    "HF_EXTRA_HINT",
    "HF_MODEL_TYPES",
    "MAX_GLOBAL_BATCH",
    "GPTConfig",
    "ModelSpec",
    "check_hf_config",
    "hf_installed",
    "read_hf_config_file",
]


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

HF_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")
"""The Hugging Face ``model_type`` values a run may name (each built and trained in the tests)."""
HF_EXTRA_HINT = "install it with: pip install 'distro-node[hf]'"
HF_MAX_DEPTH = 3  # the config is depth 1; rope_scaling-like objects 2; their lists 3
HF_MAX_ITEMS = 512  # keys and list items over the whole config
HF_MAX_STR = 256
HF_MAX_FILE_BYTES = MODEL_CONFIG_MAX_BYTES
# keys that would run code from elsewhere, quantise, or set the model's shape from outside the run
HF_REFUSED_KEYS = frozenset({"auto_map", "quantization_config", "trust_remote_code", "_name_or_path"})
# the position limit each model type reads (seq_len must not exceed it)
_HF_POSITIONS = {"gpt2": "n_positions"}


def _is_dropout_key(key: str) -> bool:
    return key.endswith(("dropout", "pdrop"))


def check_hf_config(raw: Any) -> dict[str, Any]:
    """The run's Hugging Face config, validated, as a fresh plain dict. Raises ``ConfigError``.

    A JSON object of at most ``HF_MAX_ITEMS`` keys and list items in all, nested at most
    ``HF_MAX_DEPTH`` deep, holding only JSON scalars (strings up to ``HF_MAX_STR`` characters,
    finite numbers, booleans, null), lists and objects with string keys; ``model_type`` one of
    ``HF_MODEL_TYPES``; ``vocab_size`` and the position limit (``max_position_embeddings``;
    ``n_positions`` for gpt2) given as positive integers; no key of ``HF_REFUSED_KEYS``; every
    dropout (``*dropout``, ``*pdrop``) 0 (the node trains without dropout and forces it to 0); a
    ``dtype``/``torch_dtype`` only ``float32``.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"run model.hf: must be a table (object), got {type(raw).__name__}")
    count = [0]
    out = _plain(raw, "model.hf", 1, count)
    assert isinstance(out, dict)
    mtype = out.get("model_type")
    if mtype not in HF_MODEL_TYPES:
        raise ConfigError(
            f"run model.hf: model_type must be one of {', '.join(HF_MODEL_TYPES)}, got {mtype!r}"
        )
    refused = sorted(HF_REFUSED_KEYS & set(out))
    if refused:
        raise ConfigError(f"run model.hf: key(s) {', '.join(refused)} are not allowed (no remote code)")
    pos_key = _HF_POSITIONS.get(mtype, "max_position_embeddings")
    for key in ("vocab_size", pos_key):
        v = out.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"run model.hf: {key} must be a positive integer (given), got {v!r}")
    for key, v in out.items():
        if _is_dropout_key(key) and v not in (0, 0.0, None):
            raise ConfigError(f"run model.hf: {key} must be 0 (this node trains without dropout), got {v!r}")
    for key in ("dtype", "torch_dtype"):
        if out.get(key) not in (None, "float32"):
            raise ConfigError(f"run model.hf: {key} must be float32 (the node trains in float32)")
    return out


def _plain(v: Any, where: str, depth: int, count: list[int]) -> Any:
    """A copy of ``v`` if it is JSON-plain within the limits of :func:`check_hf_config`."""
    if v is None or isinstance(v, bool | int):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"run {where}: must be a finite number, got {v!r}")
        return v
    if isinstance(v, str):
        if len(v) > HF_MAX_STR:
            raise ConfigError(f"run {where}: string longer than {HF_MAX_STR} characters")
        return v
    if isinstance(v, dict | list | tuple):
        if depth > HF_MAX_DEPTH:
            raise ConfigError(f"run {where}: nested deeper than {HF_MAX_DEPTH} levels")
        count[0] += len(v)
        if count[0] > HF_MAX_ITEMS:
            raise ConfigError(f"run model.hf: more than {HF_MAX_ITEMS} keys and items in all")
        if isinstance(v, dict):
            out: dict[str, Any] = {}
            for k, item in v.items():
                if not isinstance(k, str) or not k or len(k) > HF_MAX_STR:
                    raise ConfigError(f"run {where}: keys must be non-empty strings, got {k!r}")
                out[k] = _plain(item, f"{where}.{k}", depth + 1, count)
            return out
        return [_plain(item, f"{where}[{i}]", depth + 1, count) for i, item in enumerate(v)]
    raise ConfigError(f"run {where}: {type(v).__name__} is not a JSON value (strings, numbers, booleans, "
                      "null, lists, tables)")  # fmt: skip


def read_hf_config_file(rel: str, run_dir: str | Path) -> dict[str, Any]:
    """The JSON object in ``run_dir/rel`` (``protocol.run_file.read_json_beside``: relative, no
    ``..``, inside ``run_dir``, at most ``HF_MAX_FILE_BYTES``), checked by :func:`check_hf_config`.
    Raises ``ConfigError``."""
    return check_hf_config(read_json_beside(run_dir, rel, "run model.hf", HF_MAX_FILE_BYTES))


def hf_installed() -> bool:
    """Whether ``transformers`` can be imported here (checked without importing it)."""
    try:
        return importlib.util.find_spec("transformers") is not None
    except (ImportError, ValueError):
        return False


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The run's model as the coordinator hands it out (``[model]`` of the run file).

    ``arch = "gpt"``: ``gpt`` are :class:`GPTConfig` fields (given flat in ``[model]``).
    ``arch = "hf"``: ``hf_json`` is the Hugging Face config (``[model.hf]``, checked by
    :func:`check_hf_config`) as canonical JSON, and ``gpt`` is None. ``seed`` gives every
    replica the same initial weights; ``batch`` × ``seq_len`` tokens per step and node
    (``seq_len`` at most the model's ``context``).
    ``global_batch`` (0: off) keeps the run's windows per step constant instead: each node
    trains on its share of it among the last round's accepted peers (``node.batch_share``), so
    when peers die the survivors take over their share.
    ``micro_batch`` (0: the whole batch in one pass) splits each step's windows into passes of at
    most that many, their gradients accumulated (``Trainer``): the step's tokens stay the run's
    whatever one card holds; a node may ask for smaller passes (``train.micro_batch``).
    ``checkpointing`` recomputes each block's activations in the backward pass instead of keeping
    them (less memory, about a third more compute); a node may turn it on for itself too.
    """

    gpt: GPTConfig | None
    seed: int = 0
    batch: int = 8
    seq_len: int = 64
    global_batch: int = 0
    hf_json: str | None = None
    micro_batch: int = 0
    checkpointing: bool = False

    def __post_init__(self) -> None:
        if (self.gpt is None) == (self.hf_json is None):
            raise ConfigError("ModelSpec: give exactly one of gpt (arch 'gpt') and hf_json (arch 'hf')")

    @property
    def arch(self) -> str:
        return "gpt" if self.hf_json is None else "hf"

    def hf_config(self) -> dict[str, Any]:
        """A fresh copy of the Hugging Face config (arch 'hf'). Raises ``ConfigError`` for 'gpt'."""
        if self.hf_json is None:
            raise ConfigError("ModelSpec: arch 'gpt' has no Hugging Face config")
        doc: dict[str, Any] = json.loads(self.hf_json)
        return doc

    @property
    def vocab(self) -> int:
        """Tokens the model's vocabulary holds."""
        if self.gpt is not None:
            return self.gpt.vocab
        return int(self.hf_config()["vocab_size"])

    @property
    def context(self) -> int:
        """The longest sequence the model accepts (its position limit)."""
        if self.gpt is not None:
            return self.gpt.context
        cfg = self.hf_config()
        return int(cfg[_HF_POSITIONS.get(cfg["model_type"], "max_position_embeddings")])

    @classmethod
    def from_run(cls, model: dict[str, Any], run_dir: str | Path | None = None) -> ModelSpec:
        """Parse the run's ``model`` table. Raises ``ConfigError`` naming a bad or unknown key.

        ``model.hf`` may be a path (:func:`read_hf_config_file`) only with ``run_dir``, the run
        file's folder; the coordinator inlines such a path when it loads the run file, so a
        node always receives a table."""
        arch = model.get("arch", "gpt")
        if arch == "hf":
            return cls._from_run_hf(model, run_dir)
        if arch != "gpt":
            raise ConfigError(f"run model: arch must be 'gpt' or 'hf', the run asks for {arch!r}")
        gpt_fields = {f.name for f in dataclasses.fields(GPTConfig)}
        own = {"arch", "seed", "batch", "seq_len", "preset", "global_batch", *_MEMORY_KEYS}
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
                **_memory_options(model),
            )
        except TypeError as e:
            raise ConfigError(f"run model: {e}") from e
        return spec._checked()

    @classmethod
    def _from_run_hf(cls, model: dict[str, Any], run_dir: str | Path | None) -> ModelSpec:
        own = {"arch", "seed", "batch", "seq_len", "global_batch", "hf", *_MEMORY_KEYS}
        unknown = sorted(set(model) - own)
        if unknown:
            raise ConfigError(f"run model: unknown key(s) {', '.join(unknown)} (with arch = 'hf' the "
                              "model's shape goes in [model.hf])")  # fmt: skip
        raw = model.get("hf")
        if raw is None:
            raise ConfigError("run model: arch = 'hf' needs [model.hf] (a table, or a config.json path)")
        if isinstance(raw, str):
            if run_dir is None:
                raise ConfigError(f"run model.hf: {raw!r} is a path, but the run came without its files "
                                  "(the coordinator inlines it when it loads the run file)")  # fmt: skip
            cfg = read_hf_config_file(raw, run_dir)
        else:
            cfg = check_hf_config(raw)
        try:
            spec = cls(
                None,
                int(model.get("seed", 0)),
                int(model.get("batch", 8)),
                int(model.get("seq_len", 64)),
                int(model.get("global_batch", 0)),
                json.dumps(cfg, sort_keys=True, separators=(",", ":")),
                **_memory_options(model),
            )
        except (TypeError, ValueError) as e:
            raise ConfigError(f"run model: {e}") from e
        return spec._checked()

    def _checked(self) -> ModelSpec:
        spec = self
        if not 1 <= spec.seq_len <= spec.context or not 1 <= spec.batch <= 4096:
            raise ConfigError(
                f"run model: need 1 <= seq_len <= context ({spec.context}) and 1 <= batch <= 4096, "
                f"got seq_len {spec.seq_len}, batch {spec.batch}"
            )
        if not (spec.global_batch == 0 or spec.batch <= spec.global_batch <= MAX_GLOBAL_BATCH):
            limit = f"0 (off) or in batch..{MAX_GLOBAL_BATCH}"
            raise ConfigError(f"run model: global_batch must be {limit}, got {spec.global_batch}")
        if spec.micro_batch < 0:
            raise ConfigError(
                f"run model: micro_batch must be >= 0 (0: the whole batch), got {spec.micro_batch}"
            )
        return spec

    def micro_batch_for(self, node_micro_batch: int = 0) -> int:
        """The most windows one forward/backward pass holds: the node's own ``micro_batch``, else
        the run's, else 0 (the step's windows in one pass)."""
        return node_micro_batch or self.micro_batch

    def pass_rows(self, node_micro_batch: int = 0) -> int:
        """The windows of the largest pass this node may run: its micro-batch, or the most windows
        a step can hand it (``global_batch`` for a node left alone in the run, else ``batch``)."""
        most = self.global_batch or self.batch
        mb = self.micro_batch_for(node_micro_batch)
        return min(mb, most) if mb else most


_MEMORY_KEYS = ("micro_batch", "checkpointing")


def _memory_options(model: dict[str, Any]) -> dict[str, Any]:
    """``micro_batch`` and ``checkpointing`` of the run's model table (checked)."""
    ckpt = model.get("checkpointing", False)
    if not isinstance(ckpt, bool):
        raise ConfigError(f"run model: checkpointing must be true or false, got {ckpt!r}")
    return {"micro_batch": int(model.get("micro_batch", 0)), "checkpointing": ckpt}
