"""hivemind without its ``__init__``: ``hivemind.p2p`` and ``hivemind.dht`` with no torch loaded.

``import hivemind`` imports torch, ``hivemind.moe``, ``hivemind.averaging`` and ``hivemind.optim``
(seconds, and torch's ``torch.jit.script`` DeprecationWarning). This module registers ``hivemind``,
``hivemind.utils`` and ``hivemind.dht`` in ``sys.modules`` with their ``__init__`` deferred, so
their submodules import as usual; the names hivemind's p2p and DHT modules take from
``hivemind.utils`` come from its torch-free submodules (``_UTILS_NAMES``); any other top-level
name runs the package's own ``__init__`` (that one warning silenced). Importing this module (or
anything under ``distronet.node.swarm``) before hivemind is what makes a node's start torch-free;
modules outside ``swarm/`` take hivemind's types from here. ``docs/hivemind.md`` has the rest.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from typing import Any


def _full_init(spec: Any, pkg: Any) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        spec.loader.exec_module(pkg)


# The names that hivemind.p2p and hivemind.dht take from ``hivemind.utils`` and the torch-free
# submodule that defines each; any other name runs the package's own ``__init__`` (torch).
_UTILS_NAMES: dict[str, str] = {
    "get_logger": "logging",
    "MSGPackSerializer": "serializer",
    "SerializerBase": "serializer",
    "get_dht_time": "timed_storage",
    "DHTExpiration": "timed_storage",
    "ValueWithExpiration": "timed_storage",
    "TimedStorage": "timed_storage",
    "MAX_DHT_TIME_DISCREPANCY_SECONDS": "timed_storage",
    "as_aiter": "asyncio",
    "amap_in_executor": "asyncio",
    "switch_to_uvloop": "asyncio",
    "enter_asynchronously": "asyncio",
}


def _register_lazy(name: str, cheap: dict[str, str] | None = None) -> None:
    """Package ``name`` in ``sys.modules`` with its ``__init__`` deferred (see the quirks above):
    its submodules import as usual; a name in ``cheap`` comes from that submodule alone; any other
    top-level name runs the ``__init__`` first."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        _full_init(spec, None)  # pragma: no cover  (no hivemind: the import below fails clearly)
        return
    pkg = importlib.util.module_from_spec(spec)

    def __getattr__(attr: str) -> Any:  # PEP 562: runs only for a name the module lacks
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = sys.modules.get(f"{name}.{attr}")
        if sub is not None:  # a submodule still being imported (``import hivemind.a.b as c``)
            return sub
        if cheap is not None and attr in cheap:
            value = getattr(importlib.import_module(f"{name}.{cheap[attr]}"), attr)
            setattr(pkg, attr, value)
            return value
        del pkg.__dict__["__getattr__"]
        _full_init(spec, pkg)
        return getattr(pkg, attr)

    pkg.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = pkg


def _register_hivemind() -> None:
    """``hivemind``, ``hivemind.utils`` and ``hivemind.dht`` in ``sys.modules`` with their
    ``__init__`` deferred: what the node uses of them imports no torch."""
    _register_lazy("hivemind")
    _register_lazy("hivemind.utils", _UTILS_NAMES)
    _register_lazy("hivemind.dht")


_register_hivemind()


from hivemind.p2p import PeerID  # noqa: E402  (after the registration above)
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo  # noqa: E402

__all__ = ["PeerID", "StreamInfo"]
