"""The CLI as scripts use it (issue 6 item 5): ``shellyard --help`` reads like a manual, every
verb that prints a result takes ``--json``, and exit codes mean the same for every verb:
0 done, 1 the operation failed, 2 refused, 75 try again later; ``run`` passes the command's
own code through. (Exit 1 for a failed environment change is checked in
test_environments_interfaces.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import typer.main

from conftest import sy
from shellyard.cli.app import app
from shellyard.cli.manual import EXIT_REFUSED, EXIT_RETRY

#: Verbs that print no result to parse: servers, shell-call (JSON by contract), attach (a terminal).
NO_JSON = {"serve", "mcp", "runner serve", "shell-call", "attach"}


def _verbs(command: click.Command, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield prefix, command
        return
    for name, sub in subcommands.items():
        yield from _verbs(sub, f"{prefix} {name}".strip())


def test_help_reads_like_a_manual() -> None:
    """The CLI verbs (docs/contract.md), grouped; an example per common task; the exit codes."""
    done = subprocess.run(
        [sys.executable, "-m", "shellyard", "--help"],
        env={**os.environ, "COLUMNS": "120"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0
    text = done.stdout
    assert "durable, sandboxed shell" in text
    for panel in ("Commands", "Files and transfers", "Serving", "Sessions, agents"):
        assert panel in text
    for verb in ("serve", "run", "status", "logs", "cancel", "env", "transfer", "timer"):
        assert f" {verb} " in text
    for verb in ("session", "runner", "mcp", "token", "shell-call"):
        assert f" {verb} " in text
    assert "Other" not in text  # every verb has its group
    assert "shellyard run -- make test" in text and "shellyard logs --follow" in text
    for code in ("0 ", "1 ", "2 ", "75 "):
        assert f"  {code}" in text


def test_every_verb_that_prints_a_result_takes_json() -> None:
    missing = [
        name
        for name, command in _verbs(typer.main.get_command(app))
        if name not in NO_JSON
        and "--json" not in {o for p in command.params for o in getattr(p, "opts", [])}
    ]
    assert missing == []


def test_exit_codes_and_json_across_verbs(served_home: Path, tmp_path: Path) -> None:
    """0 done (with --json output that parses), 2 refused (bad input, unknown ids, wrong
    state), 75 busy, the command's own code from run; run --follow streams to the end."""
    home = served_home
    followed = sy(home, "run", "--follow", "--", "for i in 1 2 3; do echo $i; done; exit 3")
    assert followed.returncode == 3 and followed.stdout == "1\n2\n3\n", followed.stderr

    runners = json.loads(sy(home, "runner", "list", "--json").stdout)
    assert [r["runner_id"] for r in runners] == ["local"]
    bad_runner = sy(home, "runner", "add", "x y", "not-a-url", "--token", "t")
    assert bad_runner.returncode == EXIT_REFUSED and "invalid_input" in bad_runner.stderr

    missing = sy(home, "transfer", "status", "tr_nope", "--json")
    assert missing.returncode == EXIT_REFUSED and "not_found" in missing.stderr
    assert missing.stdout == ""
    assert sy(home, "timer", "cancel", "tm_nope").returncode == EXIT_REFUSED
    assert sy(home, "run", "--wait-ms", "-5", "--", "true").returncode == EXIT_REFUSED

    holder = sy(home, "run", "--background", "--", "sleep 30").stdout.strip()
    try:
        busy = sy(home, "run", "--", "true")
        assert busy.returncode == EXIT_RETRY, busy.stderr
        assert "workspace_busy" in busy.stderr
    finally:
        assert sy(home, "cancel", holder, "--json").returncode == 0

    assert sy(home, "run", "--", "mkdir -p out && echo hi > out/a.txt").returncode == 0
    got = sy(home, "files", "get", "out/a.txt", str(tmp_path / "a.txt"), "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"path": str(tmp_path / "a.txt"), "kind": "file", "size": 3}
    page = json.loads(sy(home, "files", "cat", "out/a.txt", "--json").stdout)
    assert page["data"] == "hi\n" and page["complete"] is True
