"""Shared fixtures: a real control plane on a fresh home, with a real bubblewrap sandbox.

Execution tests take the ``yard`` fixture, which runs them twice: against the in-process
LocalRunner (runner id ``local``) and against a runner daemon on loopback registered as a
``direct`` runner (R1: the control plane cannot tell them apart). A module or test marked
``@pytest.mark.runner_kinds("local", "direct", "ssh")`` runs against an ``ssh`` runner too:
the same daemon behind a real sshd started for the test (sshd_fixture).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from leftover_mounts import remove_home
from runner_daemon_fixture import RunnerDaemon, start_daemon
from sshd_fixture import sshd_or_skip, start_sshd

from shellyard import loops
from shellyard.config import Settings
from shellyard.contract.executions import (
    ExecutionView,
    ExecutionWait,
    RunShellRequest,
    RunShellResult,
)
from shellyard.control.plane import ControlPlane, build
from shellyard.home import ServerInfo
from shellyard.runner.protocol import SandboxPolicy
from shellyard.store import Store

#: The support fixtures every test may take by name, with no import (see that module).
pytest_plugins = ["shared_fixtures"]

# `SHELLYARD_LOOP=uvloop pytest …`: the in-process tests (control plane, LocalRunner, ssh
# clients) run on uvloop too, through the product's own chooser. Unset (or asyncio), they keep
# pytest-asyncio's asyncio loop, the loop of most programs using the SDK or a plane as a
# library. The servers the tests start (serve, mcp, runner serve, the daemon fixture's thread)
# choose as the product does: uvloop unless SHELLYARD_LOOP says otherwise (docs/operations.md
# "The event loop").
if os.environ.get("SHELLYARD_LOOP") and (_uvloop := loops.factory()) is not None:

    def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Any]:
        return {"uvloop": _uvloop}


# Issue 20: the suites run with no base environment prepared (the behaviour before bases)
# unless a test prepares one in a folder of its own; a base built on this machine stays out.
os.environ["SHELLYARD_BASES"] = tempfile.mkdtemp(prefix="shellyard-no-bases-")
# The local channels, wheel folders and repositories tests build live in their home under
# /tmp, outside the agent's workspace: the operator's allowance for agents to name them
# (docs/environments.md; tests of the rule itself unset it).
os.environ.setdefault("SHELLYARD_AGENT_LOCAL_SOURCES", "/tmp")


def make_home() -> Path:
    """A home the sandbox uid can traverse: tmp_path lives under a 0700 folder."""
    path = Path(tempfile.mkdtemp(prefix="shellyard-test-", dir="/tmp"))
    path.chmod(0o711)
    return path


@pytest.fixture
def home() -> Iterator[Path]:
    path = make_home()
    yield path
    remove_home(path)  # with what a killed runner left mounted in it


@dataclass
class Yard:
    """A running control plane plus the runner id the test's executions go to."""

    plane: ControlPlane
    runner_id: str
    home: Path
    daemon: RunnerDaemon | None = None

    async def run(self, command: str | None = None, **options: Any) -> RunShellResult:
        options.setdefault("runner_id", self.runner_id)
        request = RunShellRequest(command=command, **options)
        return await self.plane.executions.run_shell(request)

    async def ended(self, execution_id: str, timeout_s: float = 120) -> ExecutionView:
        """The execution's view once it has ended (fails the test after ``timeout_s``)."""
        wait = ExecutionWait(timeout_s=timeout_s)
        view = await self.plane.executions.wait(execution_id, wait)
        assert view.state.terminal, view
        return view

    @property
    def runner(self) -> Any:
        return self.plane.runners.get(self.runner_id)

    @property
    def runner_root(self) -> Path:
        """The runner's root on this host (open_yard: the daemon's, or the local runner's)."""
        if self.daemon is not None:
            return self.daemon.root
        return self.home / "home" / "runners" / "local"

    async def read_file(self, workspace_id: str, seq: int | None, path: str) -> bytes:
        chunk = await self.runner.read_file(workspace_id, seq, path, 0, 1 << 20)
        return bytes(chunk.data)


async def open_yard(
    home: Path, kind: str, policy: SandboxPolicy | None = None
) -> tuple[ControlPlane, str, RunnerDaemon | None]:
    policy = policy or SandboxPolicy()
    settings = Settings(home=home / "home", local_policy=policy)
    plane = await build(settings)
    plane.executions.retry_base_s = 0.05
    if kind == "local":
        return plane, "local", None
    if kind == "ssh":
        sshd_or_skip()
        ssh = await start_sshd(home / "sshd")
        daemon = await start_daemon(home / "remote-runner", policy, ssh=ssh)
        identity, known_hosts = ssh.identity, ssh.known_hosts
        await plane.runners.add_ssh("remote", daemon.address, daemon.token, identity, known_hosts)
        return plane, "remote", daemon
    daemon = await start_daemon(home / "remote-runner", policy)
    await plane.runners.add_direct("remote", daemon.url, daemon.token)
    return plane, "remote", daemon


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``yard_factory`` runs against ``local`` and ``direct``, plus the kinds a
    ``runner_kinds`` marker names."""
    if "yard_factory" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("runner_kinds")
        kinds = marker.args if marker else ("local", "direct")
        metafunc.parametrize("yard_factory", kinds, indirect=True)


@pytest.fixture
async def mixed(home: Path) -> AsyncIterator[tuple[ControlPlane, RunnerDaemon]]:
    """One control plane with the local runner and a runner daemon registered as ``remote``
    (a ``direct`` runner on loopback)."""
    plane, _runner_id, daemon = await open_yard(home, "direct", SandboxPolicy())
    assert daemon is not None
    try:
        yield plane, daemon
    finally:
        await plane.aclose()
        await daemon.stop()


@pytest.fixture
async def yard_factory(request: pytest.FixtureRequest, home: Path) -> AsyncIterator[Any]:
    opened: list[tuple[ControlPlane, RunnerDaemon | None]] = []

    async def factory(policy: SandboxPolicy | None = None) -> Yard:
        sub = home / f"y{len(opened)}"
        sub.mkdir(mode=0o711)
        plane, runner_id, daemon = await open_yard(sub, request.param, policy)
        opened.append((plane, daemon))
        return Yard(plane, runner_id, sub, daemon)

    yield factory
    for plane, daemon in opened:
        await plane.aclose()
        if daemon is not None:
            await daemon.stop()
            if daemon.ssh is not None:
                daemon.ssh.stop()


@pytest.fixture
async def yard(yard_factory: Any) -> Yard:
    result: Yard = await yard_factory()
    return result


def processes_of(execution_id: str) -> list[int]:
    """Host pids of every process that belongs to an execution (found by its environment)."""
    needle = f"SHELLYARD_EXECUTION_ID={execution_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_server(home: Path) -> None:
    """SIGKILL the ``shellyard serve`` of ``home`` (the control plane, with its local runner)
    and wait until it is gone."""
    from shellyard.home import ensure_server

    _end_server(home, ensure_server(home).pid, signal.SIGKILL, 10)


def stop_server(home: Path) -> None:
    """A clean stop (SIGTERM) of the ``shellyard serve`` of ``home``, waited for."""
    from shellyard.home import read_info

    info = read_info(home)
    assert info is not None
    _end_server(home, info.pid, signal.SIGTERM, 30)


def _end_server(home: Path, pid: int, sig: signal.Signals, timeout_s: float) -> None:
    from shellyard.home import is_served

    os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while is_served(home) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_served(home)


def host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


# ---------------------------------------------------------------------- PostgreSQL

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_available() -> bool:
    import psycopg

    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema on the PostgreSQL server of this machine (skipped when there is none)."""
    import psycopg

    if not postgres_available():
        pytest.skip("no PostgreSQL server reachable at 127.0.0.1:5432 on this machine")
    name = f"t_{secrets.token_hex(6)}"
    yield name
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, home: Path) -> AsyncIterator[Store]:
    """The Store on SQLite and on PostgreSQL (a fresh schema), through one schema."""
    if request.param == "sqlite":
        opened = await Store.open(f"sqlite:///{home / 'store.db'}")
    else:
        schema = request.getfixturevalue("pg_schema")
        opened = await Store.open(POSTGRES_URL, schema_name=schema)
    yield opened
    await opened.close()


# ---------------------------------------------------------------------- a served home


@pytest.fixture
def served_home() -> Iterator[Path]:
    """A fresh home for tests that go through ``shellyard serve`` (started on demand by the
    CLI or ``Client.for_home``); that server is stopped afterwards."""
    home = make_home()
    yield home
    stop_served(home)


def serving() -> Iterator[tuple[Path, ServerInfo]]:
    """A fresh home with its ``shellyard serve`` started, and stopped afterwards: the body of
    a fixture (``yield from serving()``) at the scope each test module wants."""
    from shellyard.home import ensure_server

    home = make_home()
    info = ensure_server(home)
    yield home, info
    stop_served(home)


def stop_served(home: Path) -> None:
    """Stop ``home``'s server if one serves it (SIGTERM: it shuts down as a user's would)."""
    from shellyard.home import is_served, read_info

    info = read_info(home)
    if info is not None and is_served(home):
        os.kill(info.pid, signal.SIGTERM)


def sy(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run the ``shellyard`` CLI on ``home`` as a user would, with text output."""
    return subprocess.run(
        [sys.executable, "-m", "shellyard", *args],
        env={**os.environ, "SHELLYARD_HOME": str(home), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
