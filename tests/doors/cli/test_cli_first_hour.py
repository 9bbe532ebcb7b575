"""The first hour at a terminal (docs/cli.md): an option ``run`` does not know is refused and
runs nothing; Ctrl-C (a real pseudo-terminal) cancels what ``run`` started and frees the
workspace, on the fast path and the typer path (E7); a setting the running server does not
have is reported, and ``server restart`` applies it; the server keeps its port across a kill -9
(E11) and a restart; ``$SHELLYARD_TOKEN`` and ``$SHELLYARD_AGENT`` are honoured; ``--version``.
Every step is the CLI as a subprocess against a real served home."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pty_terminal import Terminal

from conftest import make_home
from shellyard.home import ensure_server, is_served, read_info

SHELLYARD = [sys.executable, "-m", "shellyard"]


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SHELLYARD_HOME": str(home)}
    for name in ("SHELLYARD_TOKEN", "SHELLYARD_AGENT", "SHELLYARD_NETWORK"):
        env.pop(name, None)
    env.update(extra)
    return env


def sy(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHELLYARD, *args],
        env=env_for(home, **extra),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=180,
    )


@pytest.fixture
def home() -> Iterator[Path]:
    where = make_home()
    ensure_server(where)
    yield where
    info = read_info(where)
    if info is not None and is_served(where):
        os.kill(info.pid, signal.SIGTERM)


def executions(home: Path, token: str | None = None) -> list[dict[str, Any]]:
    info = read_info(home)
    assert info is not None
    answer = httpx.get(
        f"{info.url}/v1/executions", headers={"Authorization": f"Bearer {token or info.token}"}
    )
    assert answer.status_code == 200, answer.text
    listed: list[dict[str, Any]] = answer.json()
    return listed


def test_an_unknown_option_is_refused_and_nothing_runs(home: Path) -> None:
    before = len(executions(home))
    for typo in (["--timeuot", "5"], ["--backgroud"], ["--agnet", "foo"]):
        done = sy(home, "run", *typo, "--", "echo", "hi")
        assert done.returncode == 2, done
        assert f"run has no option {typo[0]}" in done.stderr
        assert "--background" in done.stderr and "--wait-ms" in done.stderr
    assert len(executions(home)) == before
    # Words after the command's first word are the command's own, as with ssh or docker run.
    done = sy(home, "run", "--", "echo", "--backgroud")
    assert done.returncode == 0 and done.stdout == "--backgroud\n"


def running_one(home: Path, marker: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for view in executions(home):
            if marker in (view.get("command") or "") and view["state"] == "running":
                return view
        time.sleep(0.1)
    raise AssertionError(f"no running execution of {marker!r}")


@pytest.mark.parametrize("path", ["fast", "typer"])
def test_ctrl_c_cancels_what_run_started_and_frees_the_workspace(home: Path, path: str) -> None:
    """E7 from a terminal: Ctrl-C ends the execution (SIGTERM to its processes, its snapshot
    committed), ``run`` prints the final state and exits 130; the next run is not refused as
    busy. ``--follow`` takes the typer path, a plain ``run -- CMD`` the fast one."""
    marker = f"sleep 45 # {path}"
    flags = ["--follow"] if path == "typer" else []
    term = Terminal([*SHELLYARD, "run", *flags, "--", marker], env_for(home))
    view = running_one(home, marker)
    term.ctrl_c()
    code = term.wait()
    assert code == 130, term.seen
    assert b"cancelled" in term.seen, term.seen
    ended = next(v for v in executions(home) if v["execution_id"] == view["execution_id"])
    assert ended["state"] == "cancelled"
    after = sy(home, "run", "--", "echo", "free")
    assert after.returncode == 0 and after.stdout == "free\n", after


def test_a_setting_the_server_lacks_is_reported_and_restart_applies_it(home: Path) -> None:
    changed = {"SHELLYARD_NETWORK_LINGER_S": "7"}
    status = sy(home, "server", "status", **changed)
    assert status.returncode == 0
    assert "SHELLYARD_NETWORK_LINGER_S=(unset) (here: 7)" in status.stderr
    assert "shellyard server restart" in status.stderr
    # On a terminal, a client verb says it too.
    term = Terminal([*SHELLYARD, "run", "--", "echo", "x"], env_for(home, **changed))
    assert term.wait() == 0
    assert b"keeps the settings it started with" in term.seen
    port = read_info(home).url.rsplit(":", 1)[1]  # type: ignore[union-attr]
    restarted = sy(home, "server", "restart", **changed)
    assert restarted.returncode == 0, restarted
    assert restarted.stdout.strip().endswith(f":{port}")
    status = sy(home, "server", "status", "--json", **changed)
    assert '"SHELLYARD_NETWORK_LINGER_S": "7"' in status.stdout
    assert "keeps the settings" not in status.stderr
    stopped = sy(home, "server", "stop")
    assert stopped.returncode == 0 and not is_served(home)
    assert sy(home, "server", "status").returncode == 1


def test_the_port_survives_a_kill_9_and_a_restart(home: Path) -> None:
    first = read_info(home)
    assert first is not None
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while is_served(home) and time.monotonic() < deadline:
        time.sleep(0.05)
    done = sy(home, "run", "--", "echo", "back")
    assert done.returncode == 0 and done.stdout == "back\n", done
    again = read_info(home)
    assert again is not None and again.pid != first.pid
    assert again.url == first.url


def test_the_token_and_agent_of_the_shell_are_honoured(home: Path) -> None:
    info = read_info(home)
    assert info is not None
    admin = {"Authorization": f"Bearer {info.token}"}
    session = httpx.post(f"{info.url}/v1/sessions", headers=admin).json()
    agent = session["main_agent_id"]
    token = httpx.post(
        f"{info.url}/v1/tokens", json={"kind": "agent", "agent_id": agent}, headers=admin
    ).json()["token"]
    for flags in ([], ["--follow"]):  # the fast path and the typer path
        done = sy(home, "run", *flags, "--", "echo", "mine", SHELLYARD_TOKEN=token)
        assert done.returncode == 0, done
        mine = [v for v in executions(home, token) if v.get("command") == "echo mine"]
        assert mine and all(v["agent_id"] == agent for v in mine)
    # The admin's own listing (the default agent's) does not hold them.
    assert not [v for v in executions(home) if v.get("command") == "echo mine"]
    nope = sy(home, "run", "--", "echo", "hi", SHELLYARD_AGENT="agt_nope")
    assert nope.returncode == 2 and "agt_nope" in nope.stderr, nope
    listed = sy(home, "status", "--json", SHELLYARD_AGENT=agent)
    assert listed.returncode == 0 and '"echo mine"' in listed.stdout
    other = sy(home, "status", "--json", "--agent", "agt_nope")
    assert other.returncode == 2 and "agt_nope" in other.stderr


def test_version() -> None:
    done = subprocess.run([*SHELLYARD, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("shellyard ")
