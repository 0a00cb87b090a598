"""Built-in corpus, token shards and their manifest, and the reproducible data order.

- ``corpus``: the interpreter's own standard-library source as byte tokens, train/val split.
- ``manifest``: shard files + manifest JSON (the format the coordinator leases), verified loads.
- ``prepare``: text files → shards + manifest (``distro-node data prepare``).
- ``order``: the (B, T) windows a peer trains on at each step, a pure function of
  (seed, shard, peer, step); evenly spaced validation windows.
"""

from distronet.node.data.corpus import CORPUS_MODULES, BuiltinCorpus, load_builtin_corpus
from distronet.node.data.errors import CorpusError, DataError, ManifestError, ShardIntegrityError
from distronet.node.data.manifest import Manifest, ShardEntry, load_shard, read_manifest, write_manifest
from distronet.node.data.order import BatchOrder, validation_windows, windows_to_xy
from distronet.node.data.prepare import prepare_builtin, prepare_files

__all__ = [
    "CORPUS_MODULES",
    "BatchOrder",
    "BuiltinCorpus",
    "CorpusError",
    "DataError",
    "Manifest",
    "ManifestError",
    "ShardEntry",
    "ShardIntegrityError",
    "load_builtin_corpus",
    "load_shard",
    "prepare_builtin",
    "prepare_files",
    "read_manifest",
    "validation_windows",
    "windows_to_xy",
    "write_manifest",
]
