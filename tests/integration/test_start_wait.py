"""The one-round-trip ``start`` (issue 15's benchmark): the daemon waits a short budget for the
command to end and answers the record with its log sizes and heads, so a quick foreground
``run_shell`` on a remote runner (direct or ssh) costs one runner round trip; a longer one is
watched as before; old and new ends of the wire interoperate (R1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import open_yard
from shellyard.contract.executions import (
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.control.plane import ControlPlane
from shellyard.runner.protocol import RunnerExecState, RunnerExecution, StartRequest
from shellyard.runner.transport.client import START_LOG_BYTES, RemoteRunner
from shellyard.runner.transport.wire import StartAnswer, StartWait

pytestmark = [pytest.mark.timeout(180)]


def count_requests(runner: Any) -> list[str]:
    """Record the name of every request ``runner`` (a RemoteRunner) sends to its daemon."""
    assert isinstance(runner, RemoteRunner)
    sent: list[str] = []
    post, stream = runner._post, runner._open_stream

    async def counted_post(method: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(method)
        return await post(method, *args, **kwargs)

    async def counted_stream(method: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(method)
        return await stream(method, *args, **kwargs)

    runner._post = counted_post  # type: ignore[method-assign]
    runner._open_stream = counted_stream  # type: ignore[method-assign]
    return sent


@pytest.fixture(params=["direct", "ssh"])
async def remote_yard(request: pytest.FixtureRequest, home: Path) -> AsyncIterator[ControlPlane]:
    plane, _runner_id, daemon = await open_yard(home, request.param)
    assert daemon is not None
    try:
        yield plane
    finally:
        await plane.aclose()
        await daemon.stop()
        if daemon.ssh is not None:
            daemon.ssh.stop()


async def test_a_quick_command_costs_one_round_trip(remote_yard: ControlPlane) -> None:
    """Foreground run_shell of a quick command: one ``start`` request, and the record,
    exit code, snapshot and both logs are those the runner has."""
    plane = remote_yard
    await plane.executions.run_shell(RunShellRequest(command="true", runner_id="remote"))
    sent = count_requests(plane.runners.get("remote"))
    result = await plane.executions.run_shell(
        RunShellRequest(
            command="echo out; echo err >&2; echo kept > file.txt; exit 3", runner_id="remote"
        )
    )
    assert sent == ["start"]
    assert result.state == ExecutionState.completed and result.exit_code == 3
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.snapshot_seq is not None
    # What was answered from the start's answer is what the runner itself says.
    far = plane.runners.get("remote")
    assert isinstance(far, RemoteRunner)
    chunk = await far.read_file(result.workspace_id, result.snapshot_seq, "file.txt", 0, 100)
    assert chunk.data == b"kept\n"
    logs = await plane.executions.logs(result.execution_id, ExecutionLogsQuery())
    assert logs.data == "out\n"
    assert sent == ["start", "read_file"]


async def test_a_background_start_does_not_wait_for_the_end(remote_yard: ControlPlane) -> None:
    """Nobody waits for a background execution's end, so its ``start`` asks the daemon for no
    long poll (``wait_s`` 0): the submit answers as soon as the sandbox is spawned."""
    plane = remote_yard
    far = plane.runners.get("remote")
    assert isinstance(far, RemoteRunner)
    bodies: list[Any] = []
    post = far._post

    async def recorded(method: str, body: Any = None, *args: Any, **kwargs: Any) -> Any:
        if method == "start":
            bodies.append(body)
        return await post(method, body, *args, **kwargs)

    far._post = recorded  # type: ignore[method-assign]
    await plane.executions.run_shell(RunShellRequest(command="true", runner_id="remote"))
    started = await plane.executions.run_shell(
        RunShellRequest(command="sleep 0.3", runner_id="remote", background=True)
    )
    assert started.state == ExecutionState.running
    waits = [(b.wait_s, b.log_bytes) for b in bodies]
    assert waits == [(far.start_wait_s, START_LOG_BYTES), (0.0, 0)]
    done = await plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=30))
    assert done.state == ExecutionState.completed and done.exit_code == 0


async def test_a_long_command_and_a_long_log_go_to_the_runner(remote_yard: ControlPlane) -> None:
    """A command longer than the budget: ``start`` answers ``running`` and the execution is
    watched (``wait``); a log longer than the head the answer carries is read from the
    runner past the head, byte for byte."""
    plane = remote_yard
    await plane.executions.run_shell(RunShellRequest(command="true", runner_id="remote"))
    sent = count_requests(plane.runners.get("remote"))
    slow = await plane.executions.run_shell(
        RunShellRequest(command="sleep 1.5; echo late", runner_id="remote")
    )
    assert slow.state == ExecutionState.completed and slow.stdout == "late\n"
    assert sent[0] == "start" and "wait" in sent

    size = START_LOG_BYTES * 3 + 17
    sent.clear()
    big = await plane.executions.run_shell(
        RunShellRequest(
            command=f"yes abcdefg | head -c {size}", runner_id="remote", max_output_length=10**7
        )
    )
    assert big.state == ExecutionState.completed
    assert big.stdout == ("abcdefg\n" * (size // 8 + 1))[:size]
    assert sent[0] == "start" and "read_log" in sent and "wait" not in sent


async def test_old_and_new_ends_of_the_wire_interoperate(remote_yard: ControlPlane) -> None:
    """R1 across versions: an old daemon parses the new request as a StartRequest (the extra
    fields dropped) and its answer, a bare RunnerExecution, decodes with no ``logs``, so the
    client watches the execution as before; a client that asks no wait (``start_wait_s`` 0,
    as an old client sends) gets ``running`` at once and no logs."""
    new = StartWait(execution_id="e", workspace_id="w", command="true", wait_s=0.5, log_bytes=9)
    old = StartRequest.model_validate_json(new.model_dump_json())
    assert old == StartRequest(execution_id="e", workspace_id="w", command="true")
    bare = RunnerExecution(execution_id="e", workspace_id="w", state=RunnerExecState.finished)
    assert StartAnswer.model_validate_json(bare.model_dump_json()).logs is None

    plane = remote_yard
    far = plane.runners.get("remote")
    assert isinstance(far, RemoteRunner)
    await far.ensure_workspace("ws_compat")
    far.start_wait_s = 0.0
    sent = count_requests(far)
    record = await far.start(
        StartRequest(execution_id="ex_compat", workspace_id="ws_compat", command="echo hi")
    )
    assert record.state == RunnerExecState.running
    done = await far.wait("ex_compat", 60)
    assert done.state == RunnerExecState.finished and done.exit_code == 0
    assert (await far.read_log("ex_compat", "stdout", 0, 100)).data == b"hi\n"
    assert sent == ["start", "wait", "read_log"]
