"""``shellyard run -- CMD`` answered without typer (cli/entry.py, issue 13): the same output,
exit codes and errors as the typer verb (E1, E2), a handover to it for a command still
running after --wait-ms, and a start of the server when the home is not served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import stop_server, sy
from shellyard.cli.entry import parse_run
from shellyard.home import is_served


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--", "true"],
        ["run", "--home", "/h", "--", "ls", "-la"],
        ["run", "--home=/h", "--wait-ms=5", "--queue", "--read-only", "--", "x"],
    ],
)
def test_the_fast_path_takes_plain_runs(argv: list[str]) -> None:
    parsed = parse_run(argv)
    assert parsed is not None
    home, body = parsed
    assert body["command"] in ("true", "ls -la", "x")
    assert body["background"] is False
    if "--home" in argv or "--home=/h" in argv:
        assert home == Path("/h")
    if "--wait-ms=5" in argv:
        assert body["wait_ms"] == 5 and body["queue"] and body["read_only"]


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "true"],  # no '--': typer's parsing decides
        ["run", "--"],
        ["run", "--json", "--", "true"],
        ["run", "-b", "--", "true"],
        ["run", "--follow", "--", "true"],
        ["run", "--wait-ms", "soon", "--", "true"],
        ["run", "--home=", "--", "true"],
        ["run", "--queue=yes", "--", "true"],
        ["status", "--", "x"],
        ["--help"],
    ],
)
def test_everything_else_goes_to_typer(argv: list[str]) -> None:
    assert parse_run(argv) is None


def test_same_answers_as_the_typer_verb(served_home: Path) -> None:
    """--runner local sends the same request through the typer verb and the SDK."""
    for command in ("echo hi; echo oops >&2; exit 4", "printf '%s|' 'a b' c", "exit 0"):
        fast = sy(served_home, "run", "--", command)
        typed = sy(served_home, "run", "--runner", "local", "--", command)
        assert (fast.returncode, fast.stdout, fast.stderr) == (
            typed.returncode,
            typed.stdout,
            typed.stderr,
        )
    fast = sy(served_home, "run", "--", "echo hi; echo oops >&2; exit 4")
    assert (fast.returncode, fast.stdout, fast.stderr) == (4, "hi\n", "oops\n")


def test_bad_input_is_refused_like_the_verb(served_home: Path) -> None:
    fast = sy(served_home, "run", "--wait-ms", "100000", "--", "true")
    typed = sy(served_home, "run", "--runner", "local", "--wait-ms", "100000", "--", "true")
    assert fast.returncode == typed.returncode == 2
    assert fast.stderr == typed.stderr
    assert "wait_ms must be between 0 and 30000" in fast.stderr


def test_a_run_past_its_budget_is_followed_to_the_end(served_home: Path) -> None:
    done = sy(served_home, "run", "--wait-ms", "100", "--", "sleep 1; echo late; exit 3")
    assert (done.returncode, done.stdout) == (3, "late\n"), done.stderr
    listing = json.loads(sy(served_home, "status", "--json").stdout)
    # one execution, not a second one started by the handover
    assert sum(1 for view in listing if view["command"] == "sleep 1; echo late; exit 3") == 1


def test_a_home_whose_server_went_away_is_served_again(served_home: Path) -> None:
    assert sy(served_home, "run", "--", "true").returncode == 0
    stop_server(served_home)
    again = sy(served_home, "run", "--", "echo back")
    assert (again.returncode, again.stdout) == (0, "back\n"), again.stderr
    assert is_served(served_home)


def test_the_fast_path_imports_no_typer_pydantic_or_httpx(served_home: Path) -> None:
    """What keeps it fast (issue 13): a structural check, not a timing."""
    sy(served_home, "run", "--", "true")  # the server is up
    probe = (
        "import sys\n"
        "from shellyard.cli.entry import quick_run\n"
        "code = quick_run(['run', '--', 'true'])\n"
        "heavy = sorted(set(sys.modules) & {'typer', 'pydantic', "
        "'httpx', 'rich', 'click'})\n"
        "print(code, ','.join(heavy), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "SHELLYARD_HOME": str(served_home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stderr.strip() == "0", done.stderr
