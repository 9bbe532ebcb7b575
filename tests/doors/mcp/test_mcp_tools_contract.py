"""What every MCP tool declares (§3): a title, the four annotation hints, an outputSchema
that every result it returns validates against, over stdio (``shellyard mcp``) and streamable
HTTP (``/mcp``); progress notifications during a foreground wait; resource links to the whole
logs when run_shell's inline output was cut (E12) and a log resource that reads all of it;
``scriptPath`` as the seed's spelling of ``script_path`` (E1)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, ResourceLink, TextResourceContents, Tool

from conftest import serving
from shellyard.home import ServerInfo

READ_ONLY = {
    "execution_status",
    "execution_logs",
    "execution_screen",
    "timer_list",
    "inbox_list",
    "file_list",
    "file_read",
    "snapshot_list",
    "snapshot_diff",
    "artifact_list",
    "environment_list",
    "environment_show",
    "environment_revisions",
    "environment_change_status",
    "runner_list",
}
DESTRUCTIVE = {
    "execution_cancel",
    "timer_cancel",
    "file_delete",
    "snapshot_restore",
    "environment_uninstall",
}
#: An uninstall records a new revision each time (or fails the second time): not idempotent.
IDEMPOTENT = (
    READ_ONLY
    | (DESTRUCTIVE - {"environment_uninstall"})
    | {"inbox_mark_read", "file_write", "artifact_declare", "workspace_port"}
)
#: Reach beyond shellyard: a package index; a command only when the runner has network, and
#: the served home's runner has the default, ``off`` (docs/security.md).
OPEN_WORLD = {"environment_create", "environment_install"}


@pytest.fixture
def served() -> Iterator[tuple[Path, ServerInfo]]:
    yield from serving()


@asynccontextmanager
async def over_http(info: ServerInfo) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {info.token}"}
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(f"{info.url}/mcp?tools=all", http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def over_stdio(home: Path, token: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", "all", "--home", str(home)],
        env={**os.environ, "SHELLYARD_HOME": str(home), "SHELLYARD_TOKEN": token},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


class Checked:
    """Calls tools and validates every result against the tool's declared outputSchema."""

    def __init__(self, session: ClientSession, tools: dict[str, Tool]) -> None:
        self.session = session
        self.tools = tools
        self.called: set[str] = set()

    async def raw(self, name: str, /, **arguments: Any) -> CallToolResult:
        result = await self.session.call_tool(name, arguments)
        assert not result.is_error, (name, result.content)
        schema = self.tools[name].output_schema
        assert schema is not None, f"{name} declares no outputSchema"
        jsonschema.validate(result.structured_content, schema)
        self.called.add(name)
        return result

    async def __call__(self, name: str, /, **arguments: Any) -> dict[str, Any]:
        data = (await self.raw(name, **arguments)).structured_content
        assert isinstance(data, dict)
        return data


async def exercise(session: ClientSession, door: str) -> set[str]:
    """Every tool but environment_install / _uninstall (they need a package index; their
    result model is environment_change_status's, checked here), each result validated."""
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    call = Checked(session, tools)

    done = await call("run_shell", command="echo hi; exit 3")
    assert done["exit_code"] == 3
    running = await call("run_shell", command="sleep 0.5", wait_ms=0)
    await call("execution_status", execution_id=running["execution_id"])
    await call("execution_logs", execution_id=done["execution_id"])
    await call("execution_cancel", execution_id=running["execution_id"], wait_s=20)
    # E13: a terminal typed into and looked at
    term = await call("run_shell", command="cat", tty=True, wait_ms=0)
    await call("execution_input", execution_id=term["execution_id"], text="x", eof=True)
    await call("execution_screen", execution_id=term["execution_id"])
    await call("execution_cancel", execution_id=term["execution_id"], wait_s=20)

    timer = await call("timer_create", text="look", after_ms=600_000)
    await call("timer_list")
    await call("timer_cancel", timer_id=timer["timer_id"])
    await call("inbox_list", unread_only=False)
    await call("inbox_mark_read")
    runners = await call("runner_list")
    assert "local" in [r["runner_id"] for r in runners["runners"]]

    wrote = await call("file_write", path="a/one.txt", content="one\n", queue=True)
    await call("file_write", path="run.sh", content="echo from-script\n", queue=True)
    # E1: the seed's spelling of script_path.
    script = await call("run_shell", scriptPath="run.sh", queue=True)
    assert script["stdout"] == "from-script\n" and script["script_path"] == "run.sh"
    await call("file_list", recursive=True)
    await call("file_read", path="a/one.txt")
    await call("file_move", source="a/one.txt", destination="a/two.txt", queue=True)
    await call("file_delete", path="a/two.txt", queue=True)
    await call("snapshot_list")
    await call("snapshot_diff", from_seq=0)
    await call("snapshot_restore", seq=wrote["snapshot_seq"], path="a/one.txt", queue=True)
    await call("artifact_declare", path="run.sh", name=f"script-{door}")
    await call("artifact_list")

    found = await call("workspace_transfer", action="discover")
    own = found["workspaces"][0]["workspace_id"]
    started = await call(
        "workspace_transfer",
        action="start",
        source_workspace_id=own,
        paths=["run.sh"],
        target_workspace_id=own,
        target_folder="copied",
        queue=True,
    )
    await call("workspace_transfer", action="list")
    await call("workspace_transfer", action="query", transfer_id=started["transfer_id"])
    await call("workspace_transfer", action="cancel", transfer_id=started["transfer_id"])

    # issue 17: a forward from the host to a server in the workspace, listed and closed
    server = await call(
        "run_shell",
        command="exec python3 -m http.server 8799 --bind 127.0.0.1",
        background=True,
        queue=True,
    )
    view = await call("workspace_port", action="open", port=8799)
    # on the workspace's own loopback address, never the web page's 127.0.0.1 (docs/web.md)
    assert view["url"] == f"http://{view['host']}:{view['host_port']}/"
    assert view["host"].startswith("127.") and view["host"] != "127.0.0.1"
    listed = await call("workspace_port", action="list")
    assert [p["port"] for p in listed["ports"]] == [8799]
    await call("workspace_port", action="close", port=8799)
    await call("execution_cancel", execution_id=server["execution_id"], wait_s=20)

    env = await call("environment_create", name=f"contract-{door}", wait_ms=30_000)
    await call("environment_list")
    await call("environment_show", environment_id=env["environment_id"])
    await call("environment_revisions", environment_id=env["environment_id"])
    await call("environment_change_status", change_id=env["change_id"], wait_s=30)
    return call.called


def check_declarations(tools: list[Tool]) -> None:
    for tool in tools:
        assert tool.title, f"{tool.name} has no title"
        hints = tool.annotations
        assert hints is not None, f"{tool.name} has no annotations"
        # workspace_transfer's discover/list/query read, but its start writes: not read-only.
        assert hints.read_only_hint == (tool.name in READ_ONLY), tool.name
        assert hints.destructive_hint == (tool.name in DESTRUCTIVE), tool.name
        assert hints.idempotent_hint == (tool.name in IDEMPOTENT), tool.name
        assert hints.open_world_hint == (tool.name in OPEN_WORLD), tool.name
        assert tool.output_schema is not None and tool.output_schema.get("type") == "object"


async def test_every_result_validates_against_its_schema_on_both_doors(
    served: tuple[Path, ServerInfo],
) -> None:
    home, info = served
    async with over_http(info) as session:
        tools = (await session.list_tools()).tools
        check_declarations(tools)
        called = await exercise(session, "http")
        names = {tool.name for tool in tools}
        assert names - called == {"environment_install", "environment_uninstall"}
    async with over_stdio(home, info.token) as session:
        check_declarations((await session.list_tools()).tools)
        await exercise(session, "stdio")


async def test_progress_during_a_three_second_foreground_wait(
    served: tuple[Path, ServerInfo],
) -> None:
    """A foreground run_shell with a progress token hears how long it has run and how many
    bytes of output there are, about once a second, and then gets its usual result."""
    home, info = served
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((value, total, message))

    async with over_stdio(home, info.token) as session:
        result = await session.call_tool(
            "run_shell",
            {"command": "echo start; sleep 3; echo done", "wait_ms": 10_000},
            progress_callback=progress,
        )
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "start\ndone\n"
    assert len(heard) >= 2, heard
    values = [value for value, _, _ in heard]
    assert values == sorted(values) and values[-1] < 10
    assert all(total == 10 for _, total, _ in heard)
    assert any("6 bytes of output" in (message or "") for _, _, message in heard), heard


async def test_cut_output_links_to_a_log_resource_that_reads_all_of_it(
    served: tuple[Path, ServerInfo],
) -> None:
    """E12: inline output is cut at max_output_length; the result links the whole logs, and
    reading the stdout resource returns every byte."""
    _, info = served
    whole = "".join(f"{n}\n" for n in range(1, 30_001))
    async with over_http(info) as session:
        result = await session.call_tool(
            "run_shell", {"command": "seq 1 30000", "max_output_length": 200}
        )
        assert result.structured_content is not None
        assert result.structured_content["output_truncated"] is True
        links = [block for block in result.content if isinstance(block, ResourceLink)]
        execution_id = result.structured_content["execution_id"]
        assert [str(link.uri) for link in links] == [
            f"shellyard://executions/{execution_id}/stdout",
            f"shellyard://executions/{execution_id}/stderr",
        ]
        read = await session.read_resource(str(links[0].uri))
        contents = read.contents[0]
        assert isinstance(contents, TextResourceContents)
        assert contents.text == whole
        listed = (await session.list_resource_templates()).resource_templates
        templates = {template.uri_template for template in listed}
        assert "shellyard://executions/{execution_id}/{stream}" in templates
        assert "shellyard://artifacts/{artifact_id}" in templates
        short = await session.call_tool("run_shell", {"command": "echo short"})
        assert [block.type for block in short.content] == ["text"]
