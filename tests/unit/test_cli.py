"""The console scripts exist and answer --help."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distronet.node.cli import build_parser, main


def test_every_subcommand_is_registered() -> None:
    parser = build_parser()
    help_text = parser.format_help()
    for name in ("join", "data", "bench", "export", "doctor"):
        assert name in help_text


@pytest.mark.parametrize("module", ["distronet.node.cli", "distronet.coordinator.cli"])
def test_console_script_help(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout


@pytest.mark.parametrize("var", ["GOMP_SPINCOUNT", "GOGC"])
def test_main_sets_no_environment_behind_the_users_back(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    """Tuning is config (``train.omp_spincount``, ``net.p2pd_gogc``), applied where it acts."""
    monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert var not in os.environ
