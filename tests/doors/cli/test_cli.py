"""The CLI as a user runs it: each verb a client of the home's control plane, started on
demand; exit codes scripts can use; one server per home."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import sy
from shellyard.home import is_served


def test_run_status_logs_cancel(served_home: Path) -> None:
    done = sy(served_home, "run", "--", "echo hi; echo oops >&2; exit 4")
    assert done.returncode == 4, done.stderr
    assert done.stdout == "hi\n" and done.stderr == "oops\n"
    assert is_served(served_home)  # started on demand

    words = sy(served_home, "run", "--", "printf", "%s|", "a b", "c")
    assert words.stdout == "a b|c|"  # several words are quoted, not re-split

    bg = sy(served_home, "run", "--background", "--", "for i in 1 2 3; do echo $i; sleep 0.2; done")
    execution_id = bg.stdout.strip()
    assert bg.returncode == 0 and execution_id.startswith("ex_")
    followed = sy(served_home, "logs", "--follow", execution_id)
    assert followed.stdout == "1\n2\n3\n"
    status = sy(served_home, "status", execution_id, "--json")
    view = json.loads(status.stdout)
    assert view["state"] == "completed" and view["exit_code"] == 0

    long = sy(served_home, "run", "--background", "--", "sleep 600").stdout.strip()
    cancelled = sy(served_home, "cancel", long, "--json")
    assert json.loads(cancelled.stdout)["state"] == "cancelled"
    listing = sy(served_home, "status", "--json")
    assert {v["execution_id"] for v in json.loads(listing.stdout)} >= {execution_id, long}


def test_bad_input_exit_code_two_with_a_clear_message(served_home: Path) -> None:
    nothing = sy(served_home, "run")
    assert nothing.returncode == 2 and "give a command after '--'" in nothing.stderr
    unknown = sy(served_home, "status", "ex_missing")
    assert unknown.returncode == 2 and "no execution 'ex_missing'" in unknown.stderr
    missing = sy(served_home, "run", "--script", "nope.sh")
    assert missing.returncode == 2 and "nope.sh" in missing.stderr


def test_one_server_per_home(served_home: Path) -> None:
    assert sy(served_home, "run", "--", "true").returncode == 0
    second = sy(served_home, "serve", "--home", str(served_home), timeout=30)
    assert second.returncode == 2
    assert "already served by process" in second.stderr


def test_run_on_a_terminal_prints_how_to_prepare_the_base(served_home: Path) -> None:
    """Issue 20: while no base is prepared (the suites' SHELLYARD_BASES is empty), ``shellyard
    run`` on a terminal says the command ran with the host's tools and how to prepare the
    base; with stderr not a terminal (a script) stderr stays the command's own."""
    import os
    import pty
    import subprocess
    import sys

    piped = sy(served_home, "run", "--", "echo hi")
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, "hi\n", "")
    as_json = json.loads(sy(served_home, "run", "--json", "--", "true").stdout)
    assert "shellyard env prepare" in as_json["note"]
    leader, follower = pty.openpty()
    done = subprocess.run(
        [sys.executable, "-m", "shellyard", "run", "--", "echo hi"],
        env={**os.environ, "SHELLYARD_HOME": str(served_home), "COLUMNS": "400"},
        stdout=subprocess.PIPE,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO once the follower side is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    shown = b"".join(chunks).decode()
    assert done.returncode == 0 and done.stdout == b"hi\n"
    assert "shellyard: note:" in shown and "shellyard env prepare" in shown, shown
