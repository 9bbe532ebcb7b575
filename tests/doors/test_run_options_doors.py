"""E1's per-command options on every door: ``timeout_ms``, ``env``, ``cwd`` and ``args``
through REST (plain HTTP), the SDK, MCP over stdio (the official client) and the CLI (a
subprocess), against one real ``shellyard serve``; and the workspace's home (docs/contract.md
"Per-command options", "The home"). E5: a timeout ends ``cancelled`` with limit ``timeout``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import sy
from shellyard.contract.executions import ExecutionView
from shellyard.home import ensure_server, is_served, read_info
from shellyard.sdk.client import Client

#: Prints each argument in <>, one a line (E1 args: spaces and quotes arrive unchanged).
SCRIPT = '#!/bin/bash\nfor a in "$@"; do echo "<$a>"; done\n'
ARGS = ["two words", "it's", 'say "hi"', "$HOME"]
ECHOED = "".join(f"<{a}>\n" for a in ARGS)


def settled(client: Client, execution_id: str) -> ExecutionView:
    """The execution's end, waited for in the server's 30 s slices (bounded: 4 of them)."""
    for _ in range(4):
        view = client.wait(execution_id, 30)
        if view.state.terminal:
            return view
    raise AssertionError(f"{execution_id} did not end: {view}")


@pytest.fixture
def served(home: Path) -> Iterator[Client]:
    client = Client.for_home(home)
    client.write_file("s.sh", SCRIPT.encode())
    ready = client.run("mkdir -p sub/dir && chmod +x s.sh")
    assert ready.exit_code == 0, ready
    yield client
    info = read_info(home)
    if info is not None and is_served(home):
        os.kill(info.pid, signal.SIGTERM)


def test_rest(served: Client, home: Path) -> None:
    info = ensure_server(home)
    http = httpx.Client(base_url=info.url, headers={"Authorization": f"Bearer {info.token}"})
    body = {"command": 'echo "$V"; pwd', "env": {"V": "a b"}, "cwd": "sub/dir"}
    answer = http.post("/v1/executions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "a b\n/workspace/sub/dir\n"
    answer = http.post("/v1/executions", json={"script_path": "s.sh", "args": ARGS}, timeout=60)
    assert answer.json()["stdout"] == ECHOED, answer.text
    refused = http.post("/v1/executions", json={"command": "true", "env": {"HOME": "/"}})
    assert refused.status_code == 400 and "set by the sandbox itself" in refused.text
    refused = http.post("/v1/executions", json={"command": "true", "cwd": "../x"})
    assert refused.status_code == 400 and "../x" in refused.text, refused.text
    ran = http.post("/v1/executions", json={"command": "sleep 60", "timeout_ms": 800}).json()
    view = settled(served, ran["execution_id"])
    assert view.state.value == "cancelled" and view.limit == "timeout", view


def test_sdk(served: Client) -> None:
    result = served.run('echo "$V"; pwd', env={"V": "x"}, cwd="sub")
    assert result.stdout == "x\n/workspace/sub\n", result
    assert served.run(script_path="s.sh", args=ARGS).stdout == ECHOED
    ran = served.run("sleep 60", timeout_ms=800, wait_ms=0)
    view = settled(served, ran.execution_id)
    assert view.state.value == "cancelled" and view.limit == "timeout", view
    assert view.error and "timeout_ms" in view.error
    assert served.run("echo next").stdout == "next\n"  # the workspace is free again


def test_cli(served: Client, home: Path) -> None:
    shown = sy(home, "run", "--var", "V=a b", "--cwd", "sub", "--", 'echo "$V"; pwd')
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "a b\n/workspace/sub\n"
    shown = sy(home, "run", "--script", "s.sh", "--", *ARGS)
    assert shown.returncode == 0 and shown.stdout == ECHOED, shown
    shown = sy(home, "run", "--timeout", "1s", "--", "sleep 60")
    assert shown.returncode != 0 and "cancelled" in shown.stderr, shown
    shown = sy(home, "run", "--timeout-ms", "700", "--json", "--wait-ms", "0", "--", "sleep 60")
    assert shown.returncode == 0, shown.stderr
    shown = sy(home, "run", "--timeout", "soon", "--", "true")
    assert shown.returncode == 2 and "not a duration" in shown.stderr, shown


async def test_mcp_stdio(served: Client, home: Path) -> None:
    main = served.create_session().main_agent_id
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--home", str(home), "--agent", main],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as tools:
        await tools.initialize()
        await tools.call_tool("run_shell", {"command": "mkdir -p sub"})
        first = {"command": 'echo "$V"; pwd', "env": {"V": "m"}, "cwd": "sub"}
        result = await tools.call_tool("run_shell", first)
        assert isinstance(result.structured_content, dict), result.content
        assert result.structured_content["stdout"] == "m\n/workspace/sub\n"
        await tools.call_tool("run_shell", {"command": f"printf '%s' '{SCRIPT}' > s.sh"})
        result = await tools.call_tool("run_shell", {"script_path": "s.sh", "args": ARGS})
        assert isinstance(result.structured_content, dict), result.content
        assert result.structured_content["stdout"] == ECHOED
        result = await tools.call_tool("run_shell", {"command": "true", "env": {"PWD": "/"}})
        assert result.is_error and "set by the sandbox itself" in str(result.content)
        result = await tools.call_tool(
            "run_shell", {"command": "sleep 60", "timeout_ms": 800, "wait_ms": 0}
        )
        assert isinstance(result.structured_content, dict), result.content
        execution_id = result.structured_content["execution_id"]
        view = settled(served.as_agent(main), execution_id)
        assert view.state.value == "cancelled" and view.limit == "timeout", view
