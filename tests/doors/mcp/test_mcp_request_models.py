"""One request model per operation (§3): an MCP tool's input schema is its contract model's
fields (descriptions, bounds, defaults), and the same default and bound reach REST and the SDK
from the same constant — e.g. the snapshot_diff page, which was 500 through MCP and 1000
elsewhere."""

from __future__ import annotations

import inspect
import os
import signal
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from conftest import make_home
from shellyard.contract.environments import EnvironmentChangeRequest
from shellyard.contract.executions import ExecutionLogsRequest, RunShellRequest
from shellyard.contract.files import (
    AGENT_LIST_LIMIT,
    DEFAULT_DIFF_LIMIT,
    MAX_LIST_LIMIT,
    FileReadRequest,
    SnapshotDiffRequest,
)
from shellyard.contract.sessions import TimerCreateRequest
from shellyard.home import ensure_server, is_served, read_info
from shellyard.mcp.compact import compact_schema
from shellyard.mcp.server import build_server
from shellyard.sdk.client import AsyncClient, Client


async def tool_schemas() -> dict[str, dict[str, Any]]:
    client = AsyncClient("http://127.0.0.1:9", "unused")
    try:
        tools = await build_server(client).list_tools()
    finally:
        await client.aclose()
    return {tool.name: tool.input_schema for tool in tools}


@pytest.mark.parametrize(
    ("tool", "model"),
    [
        ("run_shell", RunShellRequest),
        ("execution_logs", ExecutionLogsRequest),
        ("snapshot_diff", SnapshotDiffRequest),
        ("file_read", FileReadRequest),
        ("timer_create", TimerCreateRequest),
        ("environment_install", EnvironmentChangeRequest),
    ],
)
async def test_a_tools_input_schema_is_its_request_model(tool: str, model: type[BaseModel]) -> None:
    schema = (await tool_schemas())[tool]
    # The compact form of the model's own schema (docs/mcp.md): the same fields, bounds and
    # descriptions, without titles and null unions.
    expected = compact_schema(model.model_json_schema())
    assert set(schema["properties"]) == set(expected["properties"])
    assert set(schema.get("required", [])) == set(expected.get("required", []))
    for name, prop in schema["properties"].items():
        want = expected["properties"][name]
        for key in ("description", "minimum", "maximum", "maxLength", "minLength"):
            assert prop.get(key) == want.get(key), (tool, name, key)
        field = model.model_fields[name]
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if default is not None:
            # A default_factory's value is written out in the tool's schema.
            assert prop["default"] == default, (tool, name)
        else:
            assert "default" not in prop, (tool, name)


async def test_the_uninstall_tool_takes_the_change_model_without_install_options() -> None:
    schema = (await tool_schemas())["environment_uninstall"]
    assert set(schema["properties"]) == {"environment_id", "manager", "specs", "wait_ms"}


async def test_snapshot_diff_pages_alike_on_every_door() -> None:
    schemas = await tool_schemas()
    limit = schemas["snapshot_diff"]["properties"]["limit"]
    assert limit["default"] == DEFAULT_DIFF_LIMIT and limit["maximum"] == MAX_LIST_LIMIT
    # A deliberate difference is a named constant of the contract, not a literal.
    assert schemas["file_list"]["properties"]["limit"]["default"] == AGENT_LIST_LIMIT
    assert inspect.signature(Client.diff.build).parameters["limit"].default == DEFAULT_DIFF_LIMIT

    home = make_home()
    info = ensure_server(home)
    try:
        auth = {"Authorization": f"Bearer {info.token}"}
        document = httpx.get(f"{info.url}/openapi.json", headers=auth).json()
    finally:
        now = read_info(home)
        if now is not None and is_served(home):
            os.kill(now.pid, signal.SIGTERM)
    parameters = document["paths"]["/v1/files/diff"]["get"]["parameters"]
    rest = next(p for p in parameters if p["name"] == "limit")["schema"]
    assert rest["default"] == DEFAULT_DIFF_LIMIT and rest["maximum"] == MAX_LIST_LIMIT
