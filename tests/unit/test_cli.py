"""The console scripts exist and answer --help."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distronet.node.cli import GOGC, GOMP_SPINCOUNT, build_parser, main


def test_every_subcommand_is_registered() -> None:
    parser = build_parser()
    help_text = parser.format_help()
    for name in ("join", "data", "bench"):
        assert name in help_text


@pytest.mark.parametrize("module", ["distronet.node.cli", "distronet.coordinator.cli"])
def test_console_script_help(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout


@pytest.mark.parametrize(
    ("var", "preset", "expected"),
    [
        ("GOMP_SPINCOUNT", None, GOMP_SPINCOUNT),
        ("GOMP_SPINCOUNT", "5", "5"),
        ("GOGC", None, GOGC),  # p2pd inherits it
        ("GOGC", "100", "100"),
    ],
)
def test_main_sets_the_spin_count_and_p2pd_gc_unless_given(
    monkeypatch: pytest.MonkeyPatch, var: str, preset: str | None, expected: str
) -> None:
    if preset is None:
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, preset)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert os.environ[var] == expected
