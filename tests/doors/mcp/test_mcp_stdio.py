"""The official MCP client over stdio drives ``shellyard mcp``: run, poll, read logs, cancel.
The stdio server is a client of the home's control plane, started on demand (§3)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

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
