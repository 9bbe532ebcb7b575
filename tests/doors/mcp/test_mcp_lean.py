"""The MCP door costs a model little (docs/mcp.md, "What a tool costs a model"): the default
toolset's listing is small and holds the seed's tools, schemas are compact and closed, an
unknown argument is refused on every tool (stdio and HTTP), each toolset lists what it says,
a tool outside the session's toolsets is refused with the option that adds it, and results
say the outcome first. Driven by the official MCP client against a real ``shellyard serve``
(HTTP) and a real ``shellyard mcp`` (stdio)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import Tool

from conftest import serving
from shellyard.home import ServerInfo
from shellyard.mcp.toolsets import ALL_TOOLS, DEFAULT_TOOLS, TOOLSETS

#: The seed's tools (shared/seeds): what the default toolset must hold.
SEED_TOOLS = {
    "run_shell",
    "execution_status",
    "execution_logs",
    "execution_cancel",
    "workspace_transfer",
    "environment_create",
    "environment_install",
    "environment_uninstall",
    "timer_create",
    "timer_list",
    "timer_cancel",
}
#: What a model sees of the default tools (name + description + input schema), at most.
DEFAULT_LISTING_BUDGET = 15_000


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Path, ServerInfo]]:
    yield from serving()


@asynccontextmanager
async def over_http(
    info: ServerInfo, query: str = "", headers: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    sent = {"Authorization": f"Bearer {info.token}", **(headers or {})}
    async with (
        create_mcp_http_client(headers=sent) as client,
        streamable_http_client(f"{info.url}/mcp{query}", http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def over_stdio(home: Path, *args: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--home", str(home), *args],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def listing_size(tools: list[Tool]) -> int:
    """Characters of what a model is sent of these tools: name, description, input schema."""
    return sum(
        len(tool.name) + len(tool.description or "") + len(json.dumps(tool.input_schema))
        for tool in tools
    )


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    yield from walk(sub)
            else:
                yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


async def test_the_default_listing_is_small_and_holds_the_seed_tools(
    served: tuple[Path, ServerInfo],
) -> None:
    home, info = served
    async with over_stdio(home) as session:
        tools = (await session.list_tools()).tools
    names = {tool.name for tool in tools}
    assert names == set(DEFAULT_TOOLS)
    assert names >= SEED_TOOLS and {"file_list", "file_read", "file_write"} <= names
    size = listing_size(tools)
    assert size <= DEFAULT_LISTING_BUDGET, size
    async with over_http(info) as session:
        over_the_web = (await session.list_tools()).tools
    assert {tool.name for tool in over_the_web} == names
    assert listing_size(over_the_web) == size


async def test_every_schema_is_compact_closed_and_enumerates_fixed_values(
    served: tuple[Path, ServerInfo],
) -> None:
    _, info = served
    async with over_http(info, "?tools=all") as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == set(ALL_TOOLS)
    for tool in tools.values():
        schema = tool.input_schema
        assert schema.get("additionalProperties") is False, tool.name
        for node in walk(schema):
            assert not isinstance(node.get("title"), str), (tool.name, node)
            assert {"type": "null"} not in node.get("anyOf", []), (tool.name, node)
    transfer = tools["workspace_transfer"].input_schema["properties"]["action"]
    assert transfer["enum"] == ["discover", "start", "list", "query", "cancel"]
    manager = tools["environment_install"].input_schema["properties"]["manager"]
    assert manager["enum"] == ["conda", "pip", "cran", "bioconductor"]


async def refuses_unknown_arguments(session: ClientSession) -> None:
    tools = (await session.list_tools()).tools
    assert {tool.name for tool in tools} == set(ALL_TOOLS)
    for tool in tools:
        result = await session.call_tool(tool.name, {"bogus_param": 1})
        assert result.is_error, tool.name
        text = result.content[0].text  # type: ignore[union-attr]
        assert "bogus_param" in text and "the arguments it takes" in text, (tool.name, text)
        for name in tool.input_schema.get("properties", {}):
            assert name in text, (tool.name, name, text)
    # The misspelling a model makes: nothing runs.
    result = await session.call_tool(
        "run_shell", {"command": "touch ran-anyway", "timeout_msec": 5, "bogus_param": 1}
    )
    assert result.is_error
    assert "'bogus_param', 'timeout_msec'" in result.content[0].text  # type: ignore[union-attr]
    listing = await session.call_tool("file_list", {})
    assert not listing.is_error
    assert isinstance(listing.structured_content, dict)
    paths = [entry["path"] for entry in listing.structured_content["entries"]]
    assert "ran-anyway" not in paths


async def test_an_unknown_argument_is_refused_on_every_tool_over_stdio(
    served: tuple[Path, ServerInfo],
) -> None:
    home, _ = served
    async with over_stdio(home, "--tools", "all") as session:
        await refuses_unknown_arguments(session)


async def test_an_unknown_argument_is_refused_on_every_tool_over_http(
    served: tuple[Path, ServerInfo],
) -> None:
    _, info = served
    async with over_http(info, "?tools=all") as session:
        await refuses_unknown_arguments(session)


async def test_each_toolset_lists_what_it_says(served: tuple[Path, ServerInfo]) -> None:
    home, info = served
    for name, members in TOOLSETS.items():
        async with over_http(info, f"?tools={name}") as session:
            listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == set(members), name
    async with over_http(info, headers={"X-Shellyard-Tools": "ports,timers"}) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
    assert listed == set(TOOLSETS["ports"]) | set(TOOLSETS["timers"])
    async with over_stdio(home, "--tools", "default,files") as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
    assert listed == set(DEFAULT_TOOLS) | set(TOOLSETS["files"])
    refused = httpx.post(
        f"{info.url}/mcp?tools=everything",
        json={},
        headers={"Authorization": f"Bearer {info.token}"},
    )
    assert refused.status_code == 400
    assert "unknown toolset 'everything'" in refused.json()["error"]["message"]
    bad = sys_cli(home, "mcp", "--tools", "bogus")
    assert bad.returncode == 2 and "unknown toolset 'bogus'" in bad.stderr


def sys_cli(home: Path, *args: str) -> Any:
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "shellyard", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )


async def test_a_tool_outside_the_toolsets_is_refused_with_the_option_to_name(
    served: tuple[Path, ServerInfo],
) -> None:
    home, info = served
    async with over_stdio(home) as session:
        result = await session.call_tool("snapshot_list", {})
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "'files'" in text and "--tools default,files" in text, text
    async with over_http(info, "?tools=core") as session:
        result = await session.call_tool("timer_list", {})
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error and "/mcp?tools=core,timers" in text, text


async def test_results_say_the_outcome_first_and_keep_the_structured_result(
    served: tuple[Path, ServerInfo],
) -> None:
    _, info = served
    async with over_http(info) as session:
        result = await session.call_tool("run_shell", {"command": "echo hi; echo oops >&2; exit 3"})
        data = result.structured_content
        assert isinstance(data, dict) and data["exit_code"] == 3 and data["stdout"] == "hi\n"
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.startswith(f"completed, exit 3 ({data['execution_id']}")
        assert text.index("hi") < text.index("oops")
        assert "--- stdout ---\nhi" in text and "--- stderr ---\noops" in text
        status = await session.call_tool("execution_status", {"execution_id": data["execution_id"]})
        assert status.content[0].text.startswith("completed, exit 3")  # type: ignore[union-attr]
        assert isinstance(status.structured_content, dict)
        assert status.structured_content["workspace_id"] == data["workspace_id"]
        going = await session.call_tool("run_shell", {"command": "sleep 30", "wait_ms": 0})
        going_text = going.content[0].text  # type: ignore[union-attr]
        assert going_text.startswith("running (") and "execution_cancel" in going_text
        assert isinstance(going.structured_content, dict)
        await session.call_tool(
            "execution_cancel", {"execution_id": going.structured_content["execution_id"]}
        )
