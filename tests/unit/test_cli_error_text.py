"""The CLI's one error line (``cli/exits.say_error``, printed without rich on the way out):
a message may carry text an agent chose (a file name, an environment's tool output), so its
control characters are shown as ``\\xNN``, never sent to the operator's terminal (R2,
docs/security.md "Attack pass (session 45)"); markup is plain text there already."""

from __future__ import annotations

import pytest

from shellyard.cli.exits import EXIT_REFUSED, say_error
from shellyard.errors import InvalidInput


def test_an_error_message_never_sends_the_agents_control_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    agent_text = "a\x1b]52;c;cm0gLXJmIH4K\x1b\\b [link=https://evil]x[/link] \x9b2J"
    assert say_error(InvalidInput(f"no package {agent_text}")) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err, repr(err)
    assert "a\\x1b]52;c;cm0gLXJmIH4K\\x1b\\b [link=https://evil]x[/link] \\x9b2J" in err, err
