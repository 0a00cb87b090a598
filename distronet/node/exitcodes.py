"""Named exit codes of the `distro-node` process (each value is part of the CLI contract)."""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """Process exit codes. Scripts and supervisors may rely on these values."""

    OK = 0  # finished normally (or a clean shutdown after SIGINT/SIGTERM)
    ERROR = 1  # an unexpected error; the log says what
    USAGE = 2  # bad command line or configuration
    COORDINATOR_UNREACHABLE = 3  # could not reach the coordinator at start-up
    REJECTED = 4  # the coordinator refused admission (bad token, run closed, ...)
    NETWORK = 5  # the libp2p daemon could not start or join the swarm
    SHUTDOWN_TIMEOUT = 6  # still alive past the shutdown deadline: every thread's stack went to stderr
    TOKENIZER_MISMATCH = 8  # the coordinator sent a tokenizer that is not the run's (sha256, size)
    WONT_FIT = 9  # the run's model does not fit this device's memory at its micro-batch (models/fit.py)
    CANNOT_KEEP_UP = 10  # `doctor`: this machine cannot keep up with the run (its verdict says why)
    INTERRUPTED = 130  # forced exit after a second Ctrl-C
