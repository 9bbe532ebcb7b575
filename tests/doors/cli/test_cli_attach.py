"""E13 from a terminal: ``shellyard run --tty`` and ``shellyard attach`` join a real
pseudo-terminal to an execution's: typed bytes reach the command, its echo and output come
back, Ctrl-D ends ``python3 -q -i`` and ``attach`` exits with its exit code 0; Ctrl-] d
detaches and leaves the command running (it takes input after and ends as asked); a resize of
the attached terminal resizes the execution's; an execution without a terminal is refused.
Every step is the CLI as a subprocess on its own pseudo-terminal against a real served home."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from pty_terminal import Terminal
from test_cli_first_hour import SHELLYARD, env_for, sy
from test_cli_first_hour import home as home  # the same served home

from shellyard.cli.executions import split_detach
from shellyard.home import read_info


def rest(home: Path, method: str, path: str, **kw: Any) -> Any:
    info = read_info(home)
    assert info is not None
    answer = httpx.request(
        method, f"{info.url}{path}", headers={"Authorization": f"Bearer {info.token}"},
        timeout=60, **kw,
    )  # fmt: skip
    assert answer.status_code < 400, answer.text
    return answer.json()


def until(check: Any, what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def test_run_tty_drives_python_interactively_and_exits_with_its_code(home: Path) -> None:
    """``python3 -q -i`` on a terminal: ``print(6*7)`` typed shows 42, Ctrl-D ends it with
    exit 0 and ``run --tty`` exits 0 (E13, E4)."""
    term = Terminal([*SHELLYARD, "run", "--tty", "--", "python3", "-q", "-i"], env_for(home))
    term.read_until(b">>> ")
    term.type(b"print(6*7)\r")
    term.read_until(b"42")
    term.type(b"\x04")
    assert term.wait() == 0, term.seen
    (view,) = [v for v in rest(home, "GET", "/v1/executions") if v["tty"]]
    assert view["state"] == "completed" and view["exit_code"] == 0, view


def test_the_detach_key_leaves_the_command_running(home: Path) -> None:
    """Ctrl-] d detaches: ``attach`` exits 0 and says how to come back; the command still
    runs with its terminal, and a second ``attach`` drives it to its end (exit 3)."""
    started = rest(
        home, "POST", "/v1/executions",
        json={"command": "python3 -q -i", "tty": True, "background": True},
    )  # fmt: skip
    execution_id = started["execution_id"]
    until(lambda: ">>>" in rest(home, "GET", f"/v1/executions/{execution_id}/screen")["text"],
          "the prompt on the screen")  # fmt: skip
    term = Terminal([*SHELLYARD, "attach", execution_id], env_for(home))
    term.read_until(b"\x1b[2J>>>")  # the present screen is drawn on attach
    term.resize(30, 100)
    until(lambda: rest(home, "GET", f"/v1/executions/{execution_id}/screen")["cols"] == 100,
          "the execution's terminal resized to 100 columns")  # fmt: skip
    term.type(b"print(6*7)\r")
    term.read_until(b"42")
    term.type(b"\x1dd")
    assert term.wait() == 0, term.seen
    assert f"shellyard attach {execution_id}".encode() in term.seen
    assert rest(home, "GET", f"/v1/executions/{execution_id}")["state"] == "running"

    again = Terminal([*SHELLYARD, "attach", execution_id], env_for(home))
    again.read_until(b"42")  # the screen as it was left
    again.type(b"import sys; sys.exit(3)\r")
    assert again.wait() == 3, again.seen
    assert rest(home, "GET", f"/v1/executions/{execution_id}")["exit_code"] == 3


def test_attach_to_an_execution_without_a_terminal_is_refused(home: Path) -> None:
    started = rest(home, "POST", "/v1/executions", json={"command": "sleep 30", "background": True})
    done = sy(home, "attach", started["execution_id"])
    assert done.returncode == 2, done
    assert "has no terminal" in done.stderr and "shellyard logs --follow" in done.stderr
    rest(home, "POST", f"/v1/executions/{started['execution_id']}/cancel")


def test_the_detach_key_is_read_across_reads_and_ctrl_bracket_twice_sends_one() -> None:
    assert split_detach(b"ls\r", False) == (b"ls\r", False, False)
    assert split_detach(b"ab\x1d", False) == (b"ab", False, True)
    assert split_detach(b"d", True) == (b"", True, False)
    assert split_detach(b"x\x1ddrest", False) == (b"x", True, False)
    assert split_detach(b"\x1d\x1d", False) == (b"\x1d", False, False)
    assert split_detach(b"q", True) == (b"\x1dq", False, False)


def test_input_and_screen_without_attaching(home: Path) -> None:
    """``shellyard screen`` shows a ``read -p`` prompt, ``shellyard input ID --text yard --key
    Enter`` answers it; ``wc -l`` (interactive, no terminal) fed three lines then ``--eof``
    counts 3."""
    asked = rest(
        home, "POST", "/v1/executions",
        json={"command": "read -p 'name? ' n; echo hello-$n", "tty": True, "background": True},
    )["execution_id"]  # fmt: skip
    until(lambda: "name?" in sy(home, "screen", asked).stdout, "the prompt on the screen")
    sent = sy(home, "input", asked, "--text", "yard", "--key", "Enter")
    assert sent.returncode == 0 and f"sent 5 bytes to {asked}" in sent.stdout, sent
    ended = rest(home, "GET", f"/v1/executions/{asked}/wait", params={"timeout_s": 30})
    assert ended["exit_code"] == 0 and "hello-yard" in sy(home, "screen", asked).stdout

    counted = rest(
        home, "POST", "/v1/executions",
        json={"command": "wc -l", "interactive": True, "background": True},
    )["execution_id"]  # fmt: skip
    fed = sy(home, "input", counted, "--text", "one\ntwo\nthree\n", "--eof", "--json")
    assert fed.returncode == 0 and '"accepted_bytes": 14' in fed.stdout, fed
    ended = rest(home, "GET", f"/v1/executions/{counted}/wait", params={"timeout_s": 30})
    assert ended["exit_code"] == 0
    assert sy(home, "logs", counted, "--stream", "stdout").stdout.strip() == "3"
    late = sy(home, "input", counted, "--text", "more")
    assert late.returncode == 2, late  # it has ended: refused, with the server's reason
