"""The layer rules of ARCHITECTURE.md §2, checked on the source with `ast`.

Allowed first-party imports (`distronet.X`), per layer:
    protocol    -> nothing of ours
    kernels     -> protocol (errors, limits)
    coordinator -> protocol
    dashboard   -> protocol
    node        -> everything
Third-party rules: coordinator/protocol/dashboard never import torch, hivemind or the node;
kernels never import asyncio or do I/O through aiohttp/hivemind.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("protocol", "kernels", "coordinator", "dashboard", "node")
ALLOWED_FIRST_PARTY = {
    "protocol": set(),
    "kernels": {"protocol"},
    "coordinator": {"protocol"},
    "dashboard": {"protocol"},
    "node": set(LAYERS),
}
FORBIDDEN_THIRD_PARTY = {
    "protocol": {"torch", "hivemind", "aiohttp", "mlx", "cupy", "asyncio"},
    "kernels": {"asyncio", "aiohttp", "hivemind", "socket", "sqlite3"},
    "coordinator": {"torch", "hivemind", "mlx", "cupy"},
    "dashboard": {"torch", "hivemind", "mlx", "cupy"},
    "node": set(),
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _violations(layer: str) -> list[str]:
    bad: list[str] = []
    for path in sorted((ROOT / "distronet" / layer).rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "distronet" and len(parts) > 1:
                target = parts[1]
                if target != layer and target not in ALLOWED_FIRST_PARTY[layer]:
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
            elif parts[0] in LAYERS:
                bad.append(f"{path.relative_to(ROOT)} imports bare top-level {name} (use distronet.*)")
            elif parts[0] in FORBIDDEN_THIRD_PARTY[layer]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_imports_only_what_it_may(layer: str) -> None:
    assert _violations(layer) == []


def test_rule_checker_catches_a_violation(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("import torch\nfrom distronet.node import cli\n")
    assert _imports(src) == ["torch", "distronet.node"]


def test_importing_the_coordinator_never_loads_torch() -> None:
    code = (
        "import sys, distronet.coordinator, distronet.protocol, distronet.dashboard\n"
        "import distronet.coordinator.cli\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
