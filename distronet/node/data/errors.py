"""Errors of the data package.

    DistroError
    └── DataError                  a corpus, a manifest or a shard cannot be used
        ├── CorpusError            the built-in corpus cannot be read (a module is missing)
        ├── ManifestError          a manifest is malformed or breaks a limit
        └── ShardIntegrityError    a shard file's size or sha256 differs from its manifest entry

Every message names the module, file or shard concerned and says what to do next.
"""

from __future__ import annotations

from distronet.protocol.errors import DistroError

__all__ = ["CorpusError", "DataError", "ManifestError", "ShardIntegrityError"]


class DataError(DistroError):
    """A corpus, manifest or token shard cannot be used."""


class CorpusError(DataError):
    """The built-in corpus cannot be assembled on this interpreter."""


class ManifestError(DataError, ValueError):
    """A manifest is malformed, or one of its fields breaks a limit."""


class ShardIntegrityError(DataError):
    """A shard file does not match its manifest entry (size or sha256).

    ``shard_id`` names the shard; the file must be fetched or prepared again.
    """

    def __init__(self, shard_id: str, detail: str) -> None:
        super().__init__(f"shard {shard_id!r}: {detail}; delete it and fetch or prepare it again")
        self.shard_id = shard_id
        self.detail = detail
