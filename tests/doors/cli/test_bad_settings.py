"""Bad input (docs/operations.md "Environment variables"): every server setting given a value it
does not take stops ``shellyard serve`` at start with one message naming each variable and what
it takes, whatever module reads it. A module that read its variable at import (the request-body
bounds of api/connections.py did) failed first with a bare ``could not convert string to
float``, naming nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from leftover_mounts import remove_home

from conftest import make_home
from shellyard import settings_env

SHELLYARD = [sys.executable, "-m", "shellyard"]
BAD = "not-a-value"


def refused_start(argv: list[str], settings: dict[str, str]) -> str:
    """``shellyard *argv`` in a new home with ``settings``: it must fail, serve nothing, and
    say why on stderr (returned)."""
    home = make_home()
    try:
        done = subprocess.run(
            [*SHELLYARD, *argv], env={**os.environ, "SHELLYARD_HOME": str(home), **settings},
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode != 0, done.stderr[-3000:]
        assert not (home / "server.json").exists()  # nothing was served
        return done.stderr
    finally:
        remove_home(home)


def test_every_bad_server_setting_is_named_at_start() -> None:
    refused = {
        v.name: v.allowed
        for v in settings_env.VARIABLES.values()
        if "server" in v.side.split(",")
        and v.check is not None
        and not v.check(BAD)
        # an option of ``serve`` too, checked with it (the next test)
        and v.name != "SHELLYARD_LOG_FORMAT"
    }
    assert "SHELLYARD_BODY_TIMEOUT_S" in refused and "SHELLYARD_BODY_IDLE_S" in refused
    said = refused_start(["serve", "--port", "0"], dict.fromkeys(refused, BAD))
    for name, allowed in refused.items():
        assert f"{name}={BAD!r} is not valid: use {allowed}" in said, (name, said[-3000:])


def test_a_bad_log_format_from_the_environment_is_named() -> None:
    said = refused_start(["serve", "--port", "0"], {"SHELLYARD_LOG_FORMAT": "xml"})
    assert "SHELLYARD_LOG_FORMAT) must be text or json, not 'xml'" in said, said


def test_a_bad_body_bound_alone_is_named_by_the_cli_that_starts_the_server() -> None:
    """The CLI starts the server on demand; it says why that start failed, in the same words."""
    said = refused_start(["run", "--", "true"], {"SHELLYARD_BODY_TIMEOUT_S": "abc"})
    wanted = "SHELLYARD_BODY_TIMEOUT_S='abc' is not valid: use a number of seconds"
    assert wanted in said, said[-3000:]
