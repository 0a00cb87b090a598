"""Models a node can train: the built-in byte-level GPT."""

from distronet.node.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
