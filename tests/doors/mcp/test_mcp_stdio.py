"""The official MCP client over stdio drives ``shellyard mcp``: run, poll, read logs, cancel.
The stdio server is a client of the home's control plane, started on demand (§3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from shellyard.home import is_served, read_info


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_mcp_client_runs_polls_reads_logs_and_cancels(home: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", "all", "--home", str(home)],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert {"run_shell", "execution_status", "execution_logs", "execution_cancel"} <= names

            done = await call(session, "run_shell", command="echo hi; exit 3")
            assert done["state"] == "completed" and done["exit_code"] == 3
            assert done["stdout"] == "hi\n"
            assert done["environment_revision"] is None

            slow = await call(session, "run_shell", command="sleep 1; seq 1 5", wait_ms=100)
            assert slow["state"] == "running" and slow["exit_code"] is None
            status = await call(session, "execution_status", execution_id=slow["execution_id"])
            assert status["execution_id"] == slow["execution_id"]
            logs: dict[str, Any] = {}
            for _ in range(100):
                logs = await call(session, "execution_logs", execution_id=slow["execution_id"])
                if logs["complete"]:
                    break
                await __import__("asyncio").sleep(0.1)
            assert logs["data"] == "1\n2\n3\n4\n5\n" and logs["next_offset"] == 10

            long = await call(session, "run_shell", command="sleep 600", background=True)
            cancelled = await call(
                session, "execution_cancel", execution_id=long["execution_id"], wait_s=20
            )
            assert cancelled["state"] == "cancelled"

            bad = await session.call_tool("run_shell", {"command": "true", "wait_ms": 30001})
            assert bad.is_error
            text = bad.content[0].text  # type: ignore[union-attr]
            assert "wait_ms must be between 0 and 30000" in text
            missing = await session.call_tool("execution_status", {"execution_id": "ex_nope"})
            assert missing.is_error and "no execution 'ex_nope'" in missing.content[0].text  # type: ignore[union-attr]
    finally:
        info = read_info(home)
        if info is not None and is_served(home):
            os.kill(info.pid, signal.SIGTERM)


@pytest.mark.parametrize("stdin_kind", ["pipe", "file"])
def test_answers_in_flight_at_stdins_end_are_all_sent(home: Path, stdin_kind: str) -> None:
    """A host that writes its requests and closes stdin (``printf … | shellyard mcp``) gets
    the answer of each, a ``run_shell`` of ``sleep 2`` included, before the server exits; a
    request it cancelled stays unanswered. Both ways stdin is read: a pipe (the loop's
    transports) and a file (the package's threads). The package's dispatcher cancelled the
    calls still running when its input ended: the ``sleep 2`` was never answered."""
    lines = [
        request(1, "initialize", INITIALIZE),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        request(2, "tools/call", run_shell("sleep 2; echo late")),
        request(3, "tools/call", run_shell("sleep 60; echo never")),
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
        request(4, "ping", {}),
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    command = [sys.executable, "-m", "shellyard", "mcp", "--home", str(home)]
    env = {**os.environ, "SHELLYARD_HOME": str(home)}
    try:
        if stdin_kind == "pipe":
            done = subprocess.run(command, input=data, capture_output=True, env=env, timeout=120)
        else:
            requests = home / "requests.jsonl"
            requests.write_bytes(data)
            with requests.open("rb") as stdin:
                done = subprocess.run(
                    command, stdin=stdin, capture_output=True, env=env, timeout=120
                )
    finally:
        info = read_info(home)
        if info is not None and is_served(home):
            os.kill(info.pid, signal.SIGTERM)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = {answer["id"]: answer for answer in map(json.loads, done.stdout.splitlines())}
    assert sorted(answers) == [1, 2, 4], done.stdout
    late = answers[2]["result"]["structuredContent"]
    assert (late["state"], late["stdout"]) == ("completed", "late\n")


INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "eof", "version": "1"},
}


def request(number: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": number, "method": method, "params": params}


def run_shell(command: str) -> dict[str, Any]:
    return {"name": "run_shell", "arguments": {"command": command, "wait_ms": 20_000}}


def test_a_host_that_closes_stdin_and_never_reads_does_not_hold_the_server(home: Path) -> None:
    """Held (a bound of the wait above): a host that sends a ``sleep 2`` and 300
    ``tools/list`` (far more than a pipe holds), closes stdin and never reads stdout does not
    keep the server: the answers written count as sent, and they have ``_FLUSH_S`` to leave.
    The bound asserted is generous: EOF_WAIT_S plus the flush and the start."""
    from shellyard.mcp.stdio import EOF_WAIT_S

    lines = [
        request(1, "initialize", INITIALIZE),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        request(2, "tools/call", run_shell("sleep 2")),
        *(request(10 + n, "tools/list", {}) for n in range(300)),
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    env = {**os.environ, "SHELLYARD_HOME": str(home)}
    mcp = subprocess.Popen(
        [sys.executable, "-m", "shellyard", "mcp", "--home", str(home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert mcp.stdin is not None and mcp.stdout is not None
    try:
        mcp.stdin.write(data)
        mcp.stdin.close()
        mcp.wait(timeout=EOF_WAIT_S + 60)  # stdout is never read
    finally:
        mcp.kill()
        mcp.wait()
        mcp.stdout.close()
        info = read_info(home)
        if info is not None and is_served(home):
            os.kill(info.pid, signal.SIGTERM)
