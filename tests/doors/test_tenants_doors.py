"""Every door shows why an execution ended and what it used (R2 tenants; docs/limits.md):
``limit: memory``, peak memory and CPU seconds through MCP (stdio, the official client), REST
(the Python client), the CLI, and the runner's mechanism in ``runner show``. The control
plane is a real ``shellyard serve`` started on demand, its local runner root."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import sy
from shellyard.home import is_served, read_info
from shellyard.runner.limits import host_groups
from shellyard.sdk.client import Client

HOG = "python3 -c \"b = bytearray(600 << 20); b[::4096] = b'x' * (len(b) // 4096)\""


def have_v1() -> bool:
    own = host_groups.own_groups()
    return all(
        name in own and os.access(f"/sys/fs/cgroup/{name}{own[name]}", os.W_OK)
        for name in ("memory", "pids")
    )


pytestmark = pytest.mark.skipif(
    not (os.geteuid() == 0 and have_v1()), reason="needs root and writable cgroup v1"
)


@pytest.fixture
def served(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("SHELLYARD_MEMORY_LIMIT", "256M")
    monkeypatch.setenv("SHELLYARD_UID_RANGE", "62200-62299")
    yield home
    info = read_info(home)
    if info is not None and is_served(home):
        os.kill(info.pid, signal.SIGTERM)


async def test_every_door_says_memory(served: Path) -> None:
    home = served
    client = Client.for_home(home)
    ran = client.run(HOG, wait_ms=30_000)
    view = client.wait(ran.execution_id, 30)
    assert view.limit == "memory", view  # REST through the Python client
    assert view.peak_memory_bytes is not None and view.peak_memory_bytes <= 256 << 20
    assert view.cpu_seconds is not None
    shown = sy(home, "status", ran.execution_id)
    assert shown.returncode == 0, shown.stderr
    assert "limit" in shown.stdout and "memory" in shown.stdout, shown.stdout
    assert "peak_memory_bytes" in shown.stdout and "cpu_seconds" in shown.stdout
    runners = sy(home, "runner", "show", "local")
    assert runners.returncode == 0, runners.stderr
    assert "cgroup v1" in runners.stdout and "per workspace" in runners.stdout, runners.stdout
    main = client.create_session().main_agent_id
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--home", str(home), "--agent", main],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as tools:
        await tools.initialize()
        result = await tools.call_tool("run_shell", {"command": HOG, "wait_ms": 30_000})
        assert not result.is_error, result.content
        assert isinstance(result.structured_content, dict)
        execution_id = result.structured_content["execution_id"]
        status = await tools.call_tool("execution_status", {"execution_id": execution_id})
        data = status.structured_content
        assert isinstance(data, dict), status.content
        assert data["limit"] == "memory", json.dumps(data)[:2000]
        assert data["peak_memory_bytes"] and data["cpu_seconds"] is not None
