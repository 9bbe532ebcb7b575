"""§3: every MCP door advertises the same capabilities, the tasks extension
(``io.modelcontextprotocol/tasks``, SEP-2663) among them, on every connect.

The SDK's client (``mode="auto"``) sends ``server/discover`` first and gives it 10 s; past
that it falls back to the ``initialize`` handshake, whose capabilities cannot carry
``extensions``, so that session never has tasks. /mcp used to be built on its first request
(~0.5 s of CPU, past 10 s under load): the first connect after a server's start was the one
that lost the extension. It is now built in the server's start-up, before the server is
published (mcp/mount.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import LATEST_MODERN_VERSION
from tasks_client import TASKS, TasksClient

from conftest import serving
from shellyard.home import ServerInfo


@pytest.fixture
def served() -> Iterator[tuple[Path, ServerInfo]]:
    yield from serving()


async def _advertised(client: Client) -> tuple[str, dict[str, Any]]:
    async with client as session:
        capabilities = session.server_capabilities.model_dump(by_alias=True, exclude_none=True)
        return session.session.protocol_version or "", capabilities


async def over_http(info: ServerInfo, tools: str) -> tuple[str, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {info.token}"}
    async with create_mcp_http_client(headers=headers) as http:
        url = f"{info.url}/mcp?tools={tools}"
        transport = streamable_http_client(url, http_client=http)
        return await _advertised(Client(transport, extensions=[TasksClient()]))


async def over_stdio(home: Path, tools: str) -> tuple[str, dict[str, Any]]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", tools, "--home", str(home)],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    return await _advertised(Client(params, extensions=[TasksClient()]))


async def test_every_door_advertises_the_same_capabilities_on_every_connect(
    served: tuple[Path, ServerInfo],
) -> None:
    """The first /mcp connect after the server's start (the one that paid the build) and the
    later ones, over HTTP and stdio, with any toolsets: the newest protocol, the same
    capabilities, the tasks extension in them."""
    home, info = served
    seen = {
        "http, first": await over_http(info, "all"),
        "http, again": await over_http(info, "default"),
        "stdio": await over_stdio(home, "all"),
        "stdio, again": await over_stdio(home, "core"),
    }
    first_version, first = seen["http, first"]
    assert first_version == LATEST_MODERN_VERSION, seen
    assert TASKS in first.get("extensions", {}), seen
    assert all(advertised == seen["http, first"] for advertised in seen.values()), seen


async def test_mcp_is_built_before_the_server_is_published(home: Path) -> None:
    """The app's start-up builds /mcp before the hook that publishes the server (``serve``'s
    server.json and ready fd) runs, so no client's first message waits for it."""
    from shellyard.api.app import create_app
    from shellyard.config import Settings
    from shellyard.control.plane import build

    plane = await build(Settings(home=home / "home"))
    built_when_published: list[bool] = []

    async def on_start() -> None:
        built_when_published.append(app.state.mcp.built)

    async def on_stop() -> None:
        return None

    app = create_app(plane, lifespan_hooks=(on_start, on_stop))
    try:
        assert not app.state.mcp.built  # made by the start-up, not by create_app
        async with app.router.lifespan_context(app):
            assert built_when_published == [True]
    finally:
        await plane.aclose()
