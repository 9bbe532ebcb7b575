"""§3: the official MCP client runs the same scenario over streamable HTTP (``/mcp`` on a real
``shellyard serve``) and over stdio (``shellyard mcp``), with the same results; /mcp is bound to
the token's principal (an agent token sees only its agent's executions; no token → 401)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from conftest import serving
from shellyard.home import ServerInfo

CONTRACT_TOOLS = {
    "run_shell",
    "execution_status",
    "execution_logs",
    "execution_cancel",
    "workspace_transfer",
    "timer_create",
    "timer_list",
    "timer_cancel",
}


@pytest.fixture
def served() -> Iterator[tuple[Path, ServerInfo]]:
    yield from serving()


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def error_text(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


async def scenario(session: ClientSession) -> dict[str, Any]:
    """E3, E4, E6, E7, N5 and a tool error; returns what must match across transports."""
    names = {tool.name for tool in (await session.list_tools()).tools}
    seen: dict[str, Any] = {"tools": sorted(CONTRACT_TOOLS & names), "all_tools": sorted(names)}

    done = await call(session, "run_shell", command="echo hi; exit 3")
    seen["foreground"] = {k: done[k] for k in ("state", "exit_code", "stdout", "stderr")}
    seen["foreground"]["environment_revision"] = done["environment_revision"]

    started = await call(session, "run_shell", command="sleep 0.5; seq 1 5", background=True)
    seen["background_accepted"] = started["state"] in ("queued", "running")
    status: dict[str, Any] = {}
    for _ in range(200):
        status = await call(session, "execution_status", execution_id=started["execution_id"])
        if status["state"] not in ("queued", "running"):
            break
        await asyncio.sleep(0.05)
    logs = await call(session, "execution_logs", execution_id=started["execution_id"])
    seen["background"] = {
        "state": status["state"],
        "exit_code": status["exit_code"],
        "data": logs["data"],
        "next_offset": logs["next_offset"],
        "complete": logs["complete"],
    }

    long = await call(session, "run_shell", command="sleep 600", background=True)
    cancelled = await call(
        session, "execution_cancel", execution_id=long["execution_id"], wait_s=20
    )
    seen["cancelled"] = cancelled["state"]

    seen["bad_wait"] = await error_text(session, "run_shell", command="true", wait_ms=30001)
    seen["missing"] = await error_text(session, "execution_status", execution_id="ex_nope")

    timer = await call(session, "timer_create", text="look at the build", after_ms=600_000)
    listed = await call(session, "timer_list")
    gone = await call(session, "timer_cancel", timer_id=timer["timer_id"])
    seen["timer"] = {
        "listed": [t["timer_id"] for t in listed["timers"]] == [timer["timer_id"]],
        "state_listed": listed["timers"][0]["state"],
        "state_after_cancel": gone["state"],
    }
    return seen


def check_scenario(seen: dict[str, Any]) -> None:
    assert seen["tools"] == sorted(CONTRACT_TOOLS)
    assert seen["foreground"] == {
        "state": "completed",
        "exit_code": 3,
        "stdout": "hi\n",
        "stderr": "",
        "environment_revision": None,
    }
    assert seen["background_accepted"]
    assert seen["background"] == {
        "state": "completed",
        "exit_code": 0,
        "data": "1\n2\n3\n4\n5\n",
        "next_offset": 10,
        "complete": True,
    }
    assert seen["cancelled"] == "cancelled"
    assert "wait_ms must be between 0 and 30000" in seen["bad_wait"]
    assert "no execution 'ex_nope'" in seen["missing"]
    assert seen["timer"] == {
        "listed": True,
        "state_listed": "pending",
        "state_after_cancel": "cancelled",
    }


@asynccontextmanager
async def http_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(f"{url}/mcp?tools=all", http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def stdio_session(home: Path, token: str) -> AbstractAsyncContextManager[Any]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", "all", "--home", str(home)],
        env={**os.environ, "SHELLYARD_HOME": str(home), "SHELLYARD_TOKEN": token},
    )
    return stdio_client(params)


def admin(info: ServerInfo) -> dict[str, str]:
    return {"Authorization": f"Bearer {info.token}"}


def new_session(info: ServerInfo) -> dict[str, Any]:
    response = httpx.post(f"{info.url}/v1/sessions", headers=admin(info))
    assert response.status_code == 200, response.text
    session: dict[str, Any] = response.json()
    return session


def agent_token(info: ServerInfo, agent_id: str) -> dict[str, Any]:
    body = {"kind": "agent", "agent_id": agent_id}
    response = httpx.post(f"{info.url}/v1/tokens", json=body, headers=admin(info))
    assert response.status_code == 200, response.text
    token: dict[str, Any] = response.json()
    return token


async def test_same_scenario_over_streamable_http_and_stdio(
    served: tuple[Path, ServerInfo],
) -> None:
    """§3, E3, E4, E6, E7, N5: one scenario, two transports, the same tools and results. Each
    transport acts with an agent token of its own fresh agent, so the timer lists match."""
    home, info = served
    over_http = new_session(info)["main_agent_id"]
    over_stdio = new_session(info)["main_agent_id"]
    token = agent_token(info, over_http)["token"]
    stdio_token = agent_token(info, over_stdio)["token"]

    async with http_session(info.url, {"Authorization": f"Bearer {token}"}) as session:
        seen_http = await scenario(session)
    async with (
        stdio_session(home, stdio_token) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        seen_stdio = await scenario(session)

    check_scenario(seen_http)
    assert seen_http == seen_stdio


async def test_mcp_http_is_bound_to_the_token(served: tuple[Path, ServerInfo]) -> None:
    """§3 and issue 6: an agent token over /mcp acts as its agent only and sees only its own
    executions; another session's execution is reported as missing; no token → 401; a revoked
    token fails on its next call."""
    _home, info = served
    other = httpx.post(
        f"{info.url}/v1/executions", json={"command": "echo secret"}, headers=admin(info)
    ).json()
    mine = new_session(info)
    token = agent_token(info, mine["main_agent_id"])

    async with http_session(info.url, {"Authorization": f"Bearer {token['token']}"}) as session:
        ran = await call(session, "run_shell", command="echo mine")
        assert ran["stdout"] == "mine\n"
        as_mine = {**admin(info), "X-Shellyard-Agent": mine["main_agent_id"]}
        owned = httpx.get(f"{info.url}/v1/executions/{ran['execution_id']}", headers=as_mine)
        assert owned.json()["agent_id"] == mine["main_agent_id"]
        text = await error_text(session, "execution_status", execution_id=other["execution_id"])
        assert f"no execution '{other['execution_id']}'" in text
        text = await error_text(session, "execution_logs", execution_id=other["execution_id"])
        assert "not_found" in text
        listed = httpx.get(
            f"{info.url}/v1/executions",
            headers={"Authorization": f"Bearer {token['token']}"},
        ).json()
        assert [e["execution_id"] for e in listed] == [ran["execution_id"]]

        revoked = httpx.delete(f"{info.url}/v1/tokens/{token['token_id']}", headers=admin(info))
        assert revoked.status_code == 200
        with pytest.raises(MCPError):  # the /mcp gate answers 401 before any tool runs
            await session.call_tool("run_shell", {"command": "echo again"})

    assert httpx.post(f"{info.url}/mcp?tools=all", json={}).status_code == 401
    wrong = {"Authorization": "Bearer sy_not-a-token"}
    assert httpx.post(f"{info.url}/mcp?tools=all", json={}, headers=wrong).status_code == 401
    # An agent token cannot act as another agent, over /mcp either.
    fresh = agent_token(info, mine["main_agent_id"])["token"]
    elsewhere = new_session(info)["main_agent_id"]
    forbidden = httpx.post(
        f"{info.url}/mcp?tools=all",
        json={},
        headers={"Authorization": f"Bearer {fresh}", "X-Shellyard-Agent": elsewhere},
    )
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
