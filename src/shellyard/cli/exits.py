"""The CLI's exit codes and the code of an error, without typer: the fast ``run`` path
(``cli.entry``) exits with them before typer is imported."""

from __future__ import annotations

import sys

from shellyard.errors import (
    AnswerLost,
    LowOnSpace,
    RunnerUnavailable,
    ShellyardError,
    StoreFull,
    WorkspaceBusy,
    visible,
)

#: Exit codes every verb uses (``run`` passes the command's own code through instead of 0/1).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2
EXIT_RETRY = 75

#: Exit codes of ``run`` by terminal state (the states are string enums: keyed by value).
EXIT_BY_STATE = {"cancelled": 130, "unknown": 124, "failed": 125}


def exit_code_of(exc: ShellyardError) -> int:
    """75 when trying again later can work (a busy workspace, an unreachable runner, a runner
    below its free-space reserve); 124 when a request that may act twice went and its answer
    was lost (the outcome is unknown: a retry could run a command twice); else 2."""
    if isinstance(exc, AnswerLost):
        return EXIT_BY_STATE["unknown"]
    retry = isinstance(exc, RunnerUnavailable | WorkspaceBusy | LowOnSpace | StoreFull)
    return EXIT_RETRY if retry else EXIT_REFUSED


def say_error(exc: ShellyardError) -> int:
    """Say the error on stderr, one line (not wrapped: logs and scripts read it); its exit
    code. Plain text, red on a terminal: no rich import on the way out."""
    label = "\x1b[31merror\x1b[0m" if sys.stderr.isatty() else "error"
    # the message may name the agent's files and links: their control codes shown, not sent
    sys.stderr.write(f"{label} ({exc.code}): {visible(exc.message)}\n")
    sys.stderr.flush()
    return exit_code_of(exc)
