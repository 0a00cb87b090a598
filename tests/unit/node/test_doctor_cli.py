"""`distro-node doctor`'s flags: bad ones exit 2 with a message, before anything is measured."""

from __future__ import annotations

import pytest

from distronet.node.cli import main
from distronet.node.doctor.cli import local_model
from distronet.node.exitcodes import ExitCode
from distronet.protocol.errors import ConfigError


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--peers", "-1"], "--peers"),
        (["--probe-bytes", str(5 << 20)], "--probe-bytes"),
        (["--probes", "0"], "--probes"),
        (["--round-deadline-s", "0"], "--round-deadline-s"),
        (["--up", "10 parsecs"], "rate"),
        (["--coordinator", "coord.example:8470", "r1"], "http(s) URL"),
        (["--steps", "0"], "--steps"),
    ],
)
def test_bad_flags_exit_2_and_say_which(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", *args]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("distro-node doctor: ") and says in err


def test_local_models_are_the_run_defaults_and_the_bench_llama() -> None:
    gpt = local_model("gpt", None, None)
    assert gpt.arch == "gpt" and (gpt.batch, gpt.seq_len) == (8, 64)
    llama = local_model("llama", 4, 32)
    assert (
        llama.arch == "hf"
        and llama.hf_config()["model_type"] == "llama"
        and (llama.batch, llama.seq_len) == (4, 32)
    )
    with pytest.raises(ConfigError, match="seq_len"):
        local_model("gpt", None, 4096)  # longer than the model's context
    with pytest.raises(ConfigError, match="--model"):
        local_model("bert", None, None)
