"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663; §3, E3–E7, E11) over
streamable HTTP with the SDK's own ``Client(extensions=[...])``: a long run_shell becomes a
task whose id is the execution's; tasks/get maps its states and carries the tool's result;
tasks/cancel cancels it; the task id stays valid across a kill -9 and restart of
``shellyard serve``; a client that does not declare the extension gets today's results."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conda_channel import build_test_channel
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from runner_daemon_fixture import start_daemon
from tasks_client import CreateTaskResult, TasksClient, task_cancel, task_get, wait_terminal

from conftest import kill_server, serving
from shellyard.home import ServerInfo, ensure_server
from shellyard.runner.protocol import SandboxPolicy

MISSING_CAPABILITY = -32021
INVALID_PARAMS = -32602


@pytest.fixture
def served() -> Iterator[tuple[Path, ServerInfo]]:
    yield from serving()


@asynccontextmanager
async def client(info: ServerInfo, *, tasks: bool) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {info.token}"}
    async with create_mcp_http_client(headers=headers) as http:
        transport = streamable_http_client(f"{info.url}/mcp?tools=all", http_client=http)
        extensions = [TasksClient()] if tasks else None
        async with Client(transport, extensions=extensions) as session:
            yield session


async def start(session: Client, **arguments: Any) -> CreateTaskResult | CallToolResult:
    result = await session.session.call_tool("run_shell", arguments, allow_claimed=True)
    assert isinstance(result, CreateTaskResult | CallToolResult), result
    return result


async def test_a_long_command_becomes_a_task_get_result_and_cancel(
    served: tuple[Path, ServerInfo],
) -> None:
    """E3/E4 as a task: the id is the execution id, working while it runs, completed with
    run_shell's own result (exit code 3 is still 'completed'); E7 through tasks/cancel."""
    _, info = served
    async with client(info, tasks=True) as session:
        assert "io.modelcontextprotocol/tasks" in (session.server_capabilities.extensions or {})
        quick = await start(session, command="echo quick")
        assert isinstance(quick, CallToolResult), "a call that finishes in time is no task"
        assert quick.structured_content is not None
        assert quick.structured_content["stdout"] == "quick\n"

        task = await start(session, command="sleep 1.5; echo out; exit 3", wait_ms=100)
        assert isinstance(task, CreateTaskResult)
        assert task.task_id.startswith("ex_") and task.status == "working"
        assert task.poll_interval_ms and task.ttl_ms and task.ttl_ms > 0
        got = await task_get(session.session, task.task_id)
        assert got["status"] in ("working", "completed") and got["resultType"] == "complete"
        status = await session.call_tool("execution_status", {"execution_id": task.task_id})
        assert status.structured_content is not None
        assert status.structured_content["execution_id"] == task.task_id

        done = await wait_terminal(session.session, task.task_id)
        assert done["status"] == "completed"
        result = CallToolResult.model_validate(done["result"])
        assert not result.is_error and result.structured_content is not None
        assert result.structured_content["exit_code"] == 3
        assert result.structured_content["stdout"] == "out\n"
        assert result.structured_content["execution_id"] == task.task_id

        # The SDK's client resolves a task transparently through the claim.
        resolved = await session.call_tool(
            "run_shell", {"command": "sleep 1; echo later", "wait_ms": 100}
        )
        assert resolved.structured_content is not None
        assert resolved.structured_content["stdout"] == "later\n"

        long = await start(session, command="sleep 600", background=True)
        assert isinstance(long, CreateTaskResult)
        ack = await task_cancel(session.session, long.task_id)
        assert ack["resultType"] == "complete" and "status" not in ack  # an empty ack
        cancelled = await wait_terminal(session.session, long.task_id, timeout_s=60)
        assert cancelled["status"] == "cancelled"

        with pytest.raises(MCPError) as missing:
            await task_get(session.session, "ex_0000000000000000")
        assert missing.value.error.code == INVALID_PARAMS
        assert "not found" in missing.value.error.message


async def test_without_the_extension_results_are_unchanged(
    served: tuple[Path, ServerInfo],
) -> None:
    """A client that does not declare the extension gets the tool's result for the same long
    command (state 'running' and its execution id), rendered as before: the text block is the
    structured result in words, the outcome first (docs/mcp.md); tasks/get is refused with
    -32021."""
    _, info = served
    async with client(info, tasks=False) as session:
        result = await start(session, command="sleep 1; echo x", wait_ms=100)
        assert isinstance(result, CallToolResult) and not result.is_error
        data = result.structured_content
        assert data is not None and data["state"] == "running" and data["exit_code"] is None
        assert [block.type for block in result.content] == ["text"]
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.startswith(f"running ({data['execution_id']}")
        with pytest.raises(MCPError) as refused:
            await task_get(session.session, data["execution_id"])
        assert refused.value.error.code == MISSING_CAPABILITY
        # Executions outlive their server (E11): one still running when the server stops
        # would keep its workspace's mounts in the test's home.
        stopped = await session.call_tool(
            "execution_cancel", {"execution_id": data["execution_id"], "wait_s": 30}
        )
        assert not stopped.is_error, stopped


async def test_a_task_survives_kill9_and_restart_of_the_server(
    served: tuple[Path, ServerInfo],
) -> None:
    """E11 for tasks: the task id is the execution record's id, so after SIGKILL of
    ``shellyard serve`` and a new one on the same home, tasks/get finds it and completes it
    with the command's output."""
    home, info = served
    async with client(info, tasks=True) as session:
        task = await start(session, command="sleep 2; echo survived", wait_ms=100)
        assert isinstance(task, CreateTaskResult)
    kill_server(home)
    restarted = ensure_server(home)
    assert restarted.pid != info.pid
    async with client(restarted, tasks=True) as session:
        done = await wait_terminal(session.session, task.task_id, timeout_s=60)
        assert done["status"] == "completed", done
        result = CallToolResult.model_validate(done["result"])
        assert result.structured_content is not None
        assert result.structured_content["stdout"] == "survived\n"
        assert result.structured_content["exit_code"] == 0


async def test_a_task_whose_runner_was_removed_while_unknown_completes(
    served: tuple[Path, ServerInfo], tmp_path: Path
) -> None:
    """E9/E11 for tasks (docs/security.md "Attack pass (session 52)"): an execution whose
    runner stopped answering is ``unknown`` and asked about, so its task is ``working``; once
    the runner is removed it is final (nobody asks any more) and its task completes with
    run_shell's result, which says so. It stayed ``working``, "shellyard keeps asking", for
    ever: a client polling it never ended."""
    _, info = served
    daemon = await start_daemon(tmp_path / "daemon", SandboxPolicy(), subprocess=True)
    rest = httpx.AsyncClient(
        base_url=info.url, headers={"Authorization": f"Bearer {info.token}"}, timeout=60
    )
    try:
        added = await rest.post(
            "/v1/runners",
            json={"runner_id": "remote", "address": daemon.url, "token": daemon.token},
        )
        assert added.status_code == 200, added.text
        async with client(info, tasks=True) as session:
            task = await start(session, command="sleep 60", runner_id="remote", wait_ms=100)
            assert isinstance(task, CreateTaskResult)
            daemon.kill()  # its sandbox runs on; nobody can ask about it
            with anyio.fail_after(90):
                while (await task_get(session.session, task.task_id))["status"] == "working":
                    state = (await rest.get(f"/v1/executions/{task.task_id}")).json()["state"]
                    if state == "unknown":
                        break
                    await anyio.sleep(0.2)
            asked = await task_get(session.session, task.task_id)
            assert asked["status"] == "working", asked  # unknown, still asked about
            removed = await rest.post("/v1/runners/remove", json={"runner_id": "remote"})
            assert removed.status_code == 200, removed.text
            done = await wait_terminal(session.session, task.task_id, timeout_s=10)
            assert done["status"] == "completed", done
            result = CallToolResult.model_validate(done["result"])
            assert result.structured_content is not None
            assert result.structured_content["state"] == "unknown"
            assert "was removed" in result.structured_content["error"]
    finally:
        await rest.aclose()
        await daemon.stop()


async def test_environment_changes_and_transfer_starts_become_tasks(
    served: tuple[Path, ServerInfo],
) -> None:
    """V2/V3 and T1: an install or uninstall still under way and a started transfer come
    back as tasks named by the change's and the transfer's ids, completed with the result
    environment_change_status / workspace_transfer query would give."""
    home, info = served
    channel = await build_test_channel(home / "channel")
    async with client(info, tasks=True) as session:
        created = await session.call_tool(
            "environment_create", {"name": "tasks", "wait_ms": 30_000}
        )
        assert created.structured_content is not None
        environment_id = created.structured_content["environment_id"]
        for tool, revision in (("environment_install", 2), ("environment_uninstall", 3)):
            arguments: dict[str, Any] = {
                "environment_id": environment_id,
                "manager": "conda",
                "specs": ["shellyard-hello" + ("==1.0" if revision == 2 else "")],
                "wait_ms": 0,
            }
            if tool == "environment_install":
                arguments["channels"] = [channel.as_uri()]
            change = await session.session.call_tool(tool, arguments, allow_claimed=True)
            assert isinstance(change, CreateTaskResult), change
            assert change.task_id.startswith("chg_") and change.status == "working"
            done = await wait_terminal(session.session, change.task_id, timeout_s=180)
            assert done["status"] == "completed", done
            view = done["result"]["structuredContent"]
            assert view["change_id"] == change.task_id
            assert view["state"] == "succeeded" and view["revision"] == revision

        await session.call_tool("file_write", {"path": "data/one.txt", "content": "1\n"})
        found = await session.call_tool("workspace_transfer", {"action": "discover"})
        assert found.structured_content is not None
        own = found.structured_content["workspaces"][0]["workspace_id"]
        start = {
            "action": "start",
            "source_workspace_id": own,
            "paths": ["data"],
            "target_workspace_id": own,
            "target_folder": "copy",
            "queue": True,
        }
        started = await session.session.call_tool("workspace_transfer", start, allow_claimed=True)
        assert isinstance(started, CreateTaskResult), started
        assert started.task_id.startswith("tr_")
        done = await wait_terminal(session.session, started.task_id, timeout_s=60)
        assert done["status"] == "completed", done
        transfer = done["result"]["structuredContent"]
        assert transfer["transfer_id"] == started.task_id and transfer["state"] == "completed"
        listed = await session.call_tool("workspace_transfer", {"action": "list"})
        assert isinstance(listed, CallToolResult), "only 'start' may become a task"
