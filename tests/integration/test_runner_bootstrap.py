"""``runner bootstrap ssh://USER@HOST[:PORT]`` (issue 15, R1): over a real OpenSSH sshd on
loopback, start the runner daemon on the far host as the SSH user, listening on a Unix socket,
register it as an ssh runner, and do it again without a second daemon."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest
from sshd_fixture import SshServer, fingerprint

from conftest import open_yard
from shellyard.contract.executions import ExecutionState, RunShellRequest
from shellyard.contract.runners import RunnerBootstrapRequest
from shellyard.control.plane import ControlPlane
from shellyard.errors import Conflict, ShellyardError, Unauthorized

pytestmark = pytest.mark.timeout(240)

#: The far host's shellyard: this checkout's (the test's sshd runs on this host).
SHELLYARD = str(Path(sys.executable).parent / "shellyard")


def stop_daemon(root: Path) -> None:
    """End the daemon the bootstrap started (its pid file), as an operator would."""
    pidfile = root / "daemon.pid"
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)


def request(sshd: SshServer, root: Path, **fields: object) -> RunnerBootstrapRequest:
    values: dict[str, object] = {
        "runner_id": "far",
        "address": sshd.address(),
        "identity": str(sshd.identity),
        "known_hosts": str(sshd.known_hosts),
        "root": str(root),
        "command": SHELLYARD,
    }
    values.update(fields)
    return RunnerBootstrapRequest.model_validate(values)


async def test_bootstrap_starts_once_registers_and_runs(sshd: SshServer, home: Path) -> None:
    """The first bootstrap starts the daemon and registers it; a second one finds it
    running and changes nothing; commands run there; a daemon that died is started again."""
    root = home / "far-root"
    plane: ControlPlane
    plane, _, _ = await open_yard(home, "local")
    try:
        first = await plane.runners.bootstrap(request(sshd, root))
        assert first.daemon == "started"
        assert first.socket == str(root / "runner.sock")
        assert first.runner.runner_id == "far" and first.runner.kind == "ssh"
        assert first.runner.state == "up"
        assert first.runner.fingerprint == fingerprint(sshd.host_key.with_suffix(".pub"))
        assert (root / "token").stat().st_mode & 0o077 == 0
        pid = int((root / "daemon.pid").read_text())

        ran = await plane.executions.run_shell(
            RunShellRequest(command="echo from-far; pwd", runner_id="far")
        )
        assert ran.state == ExecutionState.completed and ran.stdout.startswith("from-far\n")

        again = await plane.runners.bootstrap(request(sshd, root))
        assert again.daemon == "running" and again.socket == first.socket
        assert int((root / "daemon.pid").read_text()) == pid  # no second daemon
        assert plane.runners.ids() == ["far", "local"]

        # Another socket (or host) under a registered name: refused before the host is
        # touched, the running daemon left alone.
        with pytest.raises(Conflict, match="registered at"):
            await plane.runners.bootstrap(request(sshd, root, address=first.runner.address + "x"))
        assert int((root / "daemon.pid").read_text()) == pid
        assert (await plane.runners.view("far")).state == "up"

        os.kill(pid, signal.SIGKILL)  # the daemon died: the next bootstrap starts a new one
        revived = await plane.runners.bootstrap(request(sshd, root))
        assert revived.daemon == "started" and int((root / "daemon.pid").read_text()) != pid
        ran = await plane.executions.run_shell(RunShellRequest(command="true", runner_id="far"))
        assert ran.state == ExecutionState.completed
    finally:
        await plane.aclose()
        stop_daemon(root)


async def test_bootstrap_refusals_say_what_to_do(sshd: SshServer, home: Path) -> None:
    """An unknown host key is refused with its fingerprint; a missing program on the far
    host names itself; ``?port=`` is refused (the daemon listens on a socket); nothing is
    registered by a refused bootstrap."""
    root = home / "far-root"
    plane, _, _ = await open_yard(home, "local")
    try:
        empty = home / "empty_known_hosts"
        with pytest.raises(Unauthorized, match="unknown SSH host key") as refused:
            await plane.runners.bootstrap(request(sshd, root, known_hosts=str(empty)))
        assert fingerprint(sshd.host_key.with_suffix(".pub")) in refused.value.message
        with pytest.raises(ShellyardError, match="no /nowhere/shellyard on the far host"):
            await plane.runners.bootstrap(request(sshd, root, command="/nowhere/shellyard"))
        with pytest.raises(ShellyardError, match="not \\?port=N"):
            address = sshd.address("?port=8765")
            await plane.runners.bootstrap(request(sshd, root, address=address))
        assert plane.runners.ids() == ["local"]
    finally:
        await plane.aclose()
        stop_daemon(root)


async def test_bootstrap_through_the_cli(served_home: Path, sshd: SshServer, home: Path) -> None:
    """``shellyard runner bootstrap ssh://…`` (through REST and the SDK), twice."""
    import asyncio

    from conftest import sy

    root = home / "cli-root"
    address = sshd.address()
    argv = ["runner", "bootstrap", address, "--name", "edge", "--root", str(root)]
    argv += ["--identity", str(sshd.identity), "--known-hosts", str(sshd.known_hosts)]
    argv += ["--command", SHELLYARD]
    try:
        done = await asyncio.to_thread(sy, served_home, *argv)
        assert done.returncode == 0, done.stderr
        assert "daemon started" in done.stdout and "registered edge" in done.stdout
        again = await asyncio.to_thread(sy, served_home, *argv)
        assert again.returncode == 0, again.stderr
        assert "daemon running" in again.stdout
        ran = await asyncio.to_thread(sy, served_home, "run", "--runner", "edge", "echo hi")
        assert ran.returncode == 0 and ran.stdout.strip() == "hi", ran.stderr
    finally:
        stop_daemon(root)
