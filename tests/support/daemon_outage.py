"""A control plane whose runner daemon (a process of its own) goes away while a start call is
on it (E9, E10, E11, R3): the set-up and the two ways of losing a start that the outage tests
and the attack passes on them (sessions 48-49) share."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from runner_daemon_fixture import RunnerDaemon, start_daemon

from conftest import open_yard
from shellyard.contract.executions import (
    ExecutionState,
    ExecutionView,
    RunShellRequest,
    RunShellResult,
)
from shellyard.control.plane import ControlPlane
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.transport.client import RemoteRunner


async def until(plane: ControlPlane, execution_id: str, done: set[ExecutionState]) -> ExecutionView:
    """The record once its state is in ``done`` (polled; the test's timeout bounds it)."""
    while True:
        view = await plane.executions.status(execution_id)
        if view.state in done:
            return view
        await asyncio.sleep(0.05)


async def ended(plane: ControlPlane, execution_id: str) -> ExecutionView:
    """The record once it is final (an ``unknown`` one too: its end is the runner's answer);
    polled, the test's timeout bounds it."""
    view = await plane.executions.status(execution_id)
    while view.finished_at is None:
        await asyncio.sleep(0.05)
        view = await plane.executions.status(execution_id)
    return view


async def outage_yard(home: Path) -> tuple[ControlPlane, RunnerDaemon, RemoteRunner]:
    """A plane on ``home`` with a runner daemon process (``home/daemon``) added as runner
    ``remote``, on which the agent's workspace exists already (a first ``true`` ran)."""
    plane, _, _ = await open_yard(home, "local")
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    await plane.runners.add_direct("remote", daemon.url, daemon.token)
    remote = plane.runners.get("remote")
    assert isinstance(remote, RemoteRunner)
    # the agent's workspace exists on the runner: the outage hits the start call itself
    warm = await plane.executions.run_shell(RunShellRequest(command="true", runner_id="remote"))
    assert warm.state == ExecutionState.completed
    return plane, daemon, remote


async def held_start(plane: ControlPlane, remote: RemoteRunner) -> asyncio.Task[Any]:
    """A foreground start whose answer the daemon holds while its command runs (it appends
    ``run`` to runs.txt, sleeps 3 s, exits 4), 1.5 s into it: the moment to kill the daemon."""
    remote.start_wait_s = 30.0
    submit = asyncio.create_task(
        plane.executions.run_shell(
            RunShellRequest(command="echo run >> runs.txt; sleep 3; exit 4", runner_id="remote")
        )
    )
    await asyncio.sleep(1.5)
    return submit


async def unread_start(
    plane: ControlPlane, daemon: RunnerDaemon, command: str
) -> asyncio.Task[Any]:
    """A background start of ``command`` left unread on the socket of the daemon, stopped
    (SIGSTOP) before it, 1 s into it: the moment to kill the daemon."""
    assert daemon.process is not None
    os.kill(daemon.process.pid, signal.SIGSTOP)
    submit = asyncio.create_task(
        plane.executions.run_shell(
            RunShellRequest(command=command, runner_id="remote", background=True)
        )
    )
    await asyncio.sleep(1.0)
    return submit


async def held_start_ran_once(
    watcher: ControlPlane, execution_id: str, asker: ControlPlane
) -> None:
    """``held_start``'s record once ``watcher`` resolved it: completed with the command's own
    exit code (4), and the command ran once (E10: runs.txt, read by a command of ``asker``'s,
    holds one ``run``)."""
    done = {ExecutionState.completed, ExecutionState.failed}
    view = await until(watcher, execution_id, done)
    assert view.state == ExecutionState.completed and view.exit_code == 4, view
    after = await asker.executions.run_shell(
        RunShellRequest(command="cat runs.txt", runner_id="remote")
    )
    assert after.stdout == "run\n"


async def killed_on_it(daemon: RunnerDaemon, submit: asyncio.Task[Any]) -> RunShellResult:
    """The daemon killed -9 while the start ``submit`` (``held_start``, ``unread_start``) is
    on it: the plane's answer, ``unknown`` at once (E11)."""
    assert not submit.done()
    daemon.kill()  # SIGKILL ends a stopped process too
    result: RunShellResult = await submit
    assert result.state == ExecutionState.unknown
    return result


async def closed_while_unknown(home: Path) -> tuple[RunnerDaemon, str]:
    """A ``held_start`` on an ``outage_yard`` whose daemon is killed -9, and the plane closed
    while the record is ``unknown`` (E11): the daemon, down, and the execution's id, for a
    new plane on ``home`` to pick up."""
    plane, daemon, remote = await outage_yard(home)
    try:
        result = await killed_on_it(daemon, await held_start(plane, remote))
    finally:
        await plane.aclose()
    return daemon, result.execution_id
