"""A third-party MCP client sees what the SDK's does (§3): the MCP Inspector CLI (npm
``@modelcontextprotocol/inspector``) lists shellyard's tools with their titles and annotations
over stdio (``shellyard mcp``), runs a command whose inline output is cut (E12) and reads the
whole stdout through the log resource the result links to."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import make_home
from shellyard.home import ensure_server, is_served, read_info

INSPECTOR = "@modelcontextprotocol/inspector"
#: Node packages are installed once per machine here (npm's cache makes it quick after).
NODE_DIR = Path(os.environ.get("SHELLYARD_TEST_NODE_DIR", Path.home() / ".cache/shellyard-node"))


@pytest.fixture(scope="module")
def inspector() -> Path:
    if shutil.which("npm") is None or shutil.which("npx") is None:
        pytest.skip("npm/npx are not installed: the MCP Inspector CLI needs Node.js")
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    if not (NODE_DIR / "node_modules" / ".bin" / "mcp-inspector-cli").exists():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", INSPECTOR],
            cwd=NODE_DIR,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return NODE_DIR


@pytest.fixture
def served() -> Iterator[Path]:
    home = make_home()
    ensure_server(home)
    yield home
    info = read_info(home)
    if info is not None and is_served(home):
        os.kill(info.pid, signal.SIGTERM)


def inspect(node_dir: Path, home: Path, *args: str) -> Any:
    command = [
        "npx",
        "--yes",
        INSPECTOR,
        "--cli",
        sys.executable,
        "-m",
        "shellyard",
        "mcp",
        "--home",
        str(home),
        *args,
    ]
    done = subprocess.run(
        command,
        cwd=node_dir,
        env={**os.environ, "SHELLYARD_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_inspector_lists_annotated_tools_and_reads_a_log_resource(
    inspector: Path, served: Path
) -> None:
    listed = inspect(inspector, served, "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert tools["execution_status"]["title"] == "Execution status"
    assert tools["execution_status"]["annotations"]["readOnlyHint"] is True
    assert tools["execution_cancel"]["annotations"]["destructiveHint"] is True
    assert tools["run_shell"]["annotations"]["readOnlyHint"] is False
    assert all("annotations" in tool and tool.get("title") for tool in tools.values())
    assert all("outputSchema" in tool for tool in tools.values())

    ran = inspect(
        inspector,
        served,
        "--method",
        "tools/call",
        "--tool-name",
        "run_shell",
        "--tool-arg",
        "command=seq 1 5000",
        "--tool-arg",
        "max_output_length=100",
    )
    assert ran["structuredContent"]["output_truncated"] is True
    links = [block["uri"] for block in ran["content"] if block["type"] == "resource_link"]
    execution_id = ran["structuredContent"]["execution_id"]
    assert links[0] == f"shellyard://executions/{execution_id}/stdout"

    read = inspect(inspector, served, "--method", "resources/read", "--uri", links[0])
    assert read["contents"][0]["text"] == "".join(f"{n}\n" for n in range(1, 5001))
