"""The sandbox (R2): what a command can and cannot see or do. Real bubblewrap throughout."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import Yard, host_uid, processes_of
from shellyard.contract.executions import ExecutionState
from shellyard.runner.protocol import SandboxPolicy


async def test_writing_outside_the_workspace_fails(yard: Yard) -> None:
    result = await yard.run(
        "for p in /etc/shellyard-x /usr/shellyard-x /var/shellyard-x /opt/x; do "
        "  (echo x > $p) 2>/dev/null && echo WROTE $p; done; "
        "echo inside > ok.txt && echo inside-ok; touch /tmp/private && echo tmp-ok"
    )
    assert result.stdout == "inside-ok\ntmp-ok\n"
    for path in ("/etc/shellyard-x", "/usr/shellyard-x", "/var/shellyard-x", "/opt/x"):
        assert not os.path.exists(path)
    assert not os.path.exists("/tmp/private")  # /tmp inside is private


async def test_home_and_other_workspaces_are_invisible(yard: Yard) -> None:
    """The service's home (database, tokens, logs, snapshot store) and every other
    workspace are hidden; only this workspace is bound in."""
    plane = yard.plane
    assert plane.store is not None
    session, _agent = await plane.store.default_owner()
    other_agent = await plane.store.create_agent(str(session["id"]))
    other_ws, _ = await plane.store.workspace_for(str(other_agent["id"]), yard.runner_id)
    await yard.runner.ensure_workspace(str(other_ws["id"]))
    mine = await yard.run("echo mine > mine.txt; pwd")
    workspace_root = mine.stdout.strip()
    runner_root = workspace_root.rsplit("/workspaces/", 1)[0]
    other_path = f"{runner_root}/workspaces/{other_ws['id']}"
    db = yard.home / "home" / "shellyard.db"
    assert db.exists()
    probe = await yard.run(
        f"ls -A {yard.home / 'home'} 2>&1; echo ---; ls -A {runner_root} 2>&1; echo ---; "
        f"ls -A {other_path} 2>&1; echo ---; cat {db} 2>&1 | head -c 20; echo ---; "
        f"ls {runner_root}/executions 2>&1; echo ---; ls -A {runner_root}/workspaces"
    )
    sections = probe.stdout.split("---\n")
    assert "shellyard.db" not in probe.stdout
    assert "token" not in sections[1]
    assert "No such file" in sections[2]
    assert "SQLite" not in sections[3]
    assert "No such file" in sections[4]
    assert sections[5].split() == [mine.workspace_id]


async def test_environment_is_built_from_scratch(
    yard: Yard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the service's environment leaks in; HOME is the workspace root."""
    monkeypatch.setenv("SHELLYARD_LEAK_CANARY", "secret-value")
    result = await yard.run("env")
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert "SHELLYARD_LEAK_CANARY" not in env
    assert "secret-value" not in result.stdout
    assert env["HOME"] == env["PWD"]
    assert env["HOME"].endswith(result.workspace_id)
    assert set(env) <= {
        "PATH",
        "HOME",
        "PWD",
        "LANG",
        "LC_ALL",
        "TERM",
        "TMPDIR",
        "SHELL",
        "SHLVL",
        "_",
        "SHELLYARD_EXECUTION_ID",
        "SHELLYARD_WORKSPACE_ID",
        "OLDPWD",
    }


async def test_never_host_root_and_proc_sys_refused(yard: Yard) -> None:
    """A root bwrap keeps its capabilities; ours runs as an unprivileged uid, so writing
    /proc/sys is refused and the command's host uid is not 0."""
    result = await yard.run(
        "echo 3 > /proc/sys/vm/drop_caches && echo WROTE; id -u; sleep 3", wait_ms=500
    )
    await asyncio.sleep(0.3)
    pids = processes_of(result.execution_id)
    assert pids
    assert all(host_uid(pid) != 0 for pid in pids)
    view = await yard.plane.executions.wait(result.execution_id, 30)
    logs = await yard.plane.executions.logs(result.execution_id)
    err = await yard.plane.executions.logs(result.execution_id, "stderr")
    assert view.exit_code == 0
    assert "WROTE" not in logs.data
    assert logs.data.strip() != "0"
    assert "drop_caches" in err.data


async def test_fork_bomb_hits_the_process_limit_and_service_survives(yard_factory: Any) -> None:
    yard: Yard = await yard_factory(SandboxPolicy(max_processes=64))
    bomb = await yard.run(
        "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived-inside", wait_ms=0
    )
    await asyncio.sleep(2)
    view = await yard.plane.executions.cancel(bomb.execution_id, wait_s=30)
    assert view.state in (ExecutionState.cancelled, ExecutionState.completed)
    assert processes_of(bomb.execution_id) == []
    after = await yard.run("echo alive")
    assert after.stdout == "alive\n" and after.exit_code == 0


@pytest.fixture
def loopback_server() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.sendall(b"hello-from-host\n")
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


async def test_network_off_cannot_reach_a_loopback_server(
    yard_factory: Any, loopback_server: int
) -> None:
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{loopback_server} && head -n1 <&3 || echo CONNECT-FAILED"
    online: Yard = await yard_factory(SandboxPolicy(network="on"))
    assert (await online.run(probe)).stdout == "hello-from-host\n"
    offline: Yard = await yard_factory(SandboxPolicy(network="off"))
    result = await offline.run(probe)
    assert "CONNECT-FAILED" in result.stdout
    assert "hello-from-host" not in result.stdout
