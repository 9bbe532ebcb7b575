"""The CLI's ``shellyard: note: …`` lines show control characters as ``\\xNN`` (R2: nothing an
agent sends reaches the operator's terminal; docs/security.md "Attack pass (session 45)"): the
note of a run's answer (a runner's words, which may quote an agent's) and the drift between
this shell's settings and the server's, on the fast ``run`` path (``cli/entry.py``, written
without rich) and through the typer verbs (rich's visible console). Both print on a terminal
only, so the tests give them a real pseudo-terminal."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pty_terminal import Terminal

from conftest import sy
from shellyard.cli import entry, executions
from shellyard.contract.executions import RunShellResult

#: A title change and a clipboard write (OSC 0, OSC 52), a carriage return over the line, and
#: the one-byte CSI: what a terminal would act on.
HOSTILE = "a\x1b]0;owned\x07b\x1b]52;c;cm0gLXJmIH4K\x1b\\c\rd\x9b2J"
SHOWN = "a\\x1b]0;owned\\x07b\\x1b]52;c;cm0gLXJmIH4K\\x1b\\c\\x0dd\\x9b2J"


#: The same through rich (the typer verbs): rich drops BEL and CR itself, the rest is shown.
SHOWN_BY_RICH = "a\\x1b]0;ownedb\\x1b]52;c;cm0gLXJmIH4K\\x1b\\cd\\x9b2J"


@contextlib.contextmanager
def on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], str]]:
    """sys.stderr on a pseudo-terminal's slave side (isatty: a person's terminal), set in the
    test's own phase (pytest's capture sets its own at each phase); yields a reader of what
    the terminal got since the last read."""
    master, slave = pty.openpty()
    stream = open(slave, "w", encoding="utf-8")  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", stream)

    def shown() -> str:
        stream.flush()
        got = b""
        while select.select([master], [], [], 0.2)[0]:
            got += os.read(master, 1 << 16)
        return got.decode("utf-8", "replace").replace("\r\n", "\n")

    try:
        yield shown
    finally:
        monkeypatch.undo()
        stream.close()
        os.close(master)


def _no_control(seen: str) -> bool:
    return not any(ch in seen for ch in "\x1b\x9b\x07\r")


def test_a_note_with_an_esc_is_printed_escaped_on_both_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with on_a_terminal(monkeypatch) as shown:
        entry.say_note(f"no base: {HOSTILE}")
        fast = shown()
        executions._note(RunShellResult.model_construct(note=f"no base: {HOSTILE}"))
        through_typer = shown()
    assert _no_control(fast) and f"shellyard: note: no base: {SHOWN}\n" == fast, repr(fast)
    assert _no_control(through_typer), repr(through_typer)
    assert f"shellyard: note: no base: {SHOWN_BY_RICH}" in through_typer, repr(through_typer)


def test_a_settings_drift_with_an_esc_is_printed_escaped(served_home: Path) -> None:
    """A served home, then ``run`` from a shell whose settings differ by a value holding
    control codes: the drift note names it escaped, on the fast path and through typer."""
    started = sy(served_home, "run", "--", "true")  # the server starts with the usual settings
    assert started.returncode == 0, started.stderr
    env = {
        **os.environ,
        "SHELLYARD_HOME": str(served_home),
        "SHELLYARD_WEBHOOK_EXCEPTIONS": HOSTILE,
        "COLUMNS": "400",
    }
    for argv in (["run", "--", "true"], ["run", "--timeout", "30s", "--", "true"]):
        shell = Terminal([sys.executable, "-m", "shellyard", *argv], env)
        assert shell.wait(120) == 0, shell.seen
        seen = shell.seen.decode("utf-8", "replace")
        assert "SHELLYARD_WEBHOOK_EXCEPTIONS" in seen, (argv, seen)
        assert _no_control(seen.replace("\r\n", "\n")), (argv, seen)
        assert (SHOWN if argv[1] == "--" else SHOWN_BY_RICH) in seen, (argv, seen)
