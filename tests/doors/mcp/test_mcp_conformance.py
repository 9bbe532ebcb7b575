"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``) against /mcp
of a real ``shellyard serve`` (docs/mcp.md, "Tests"): the generic server scenarios — initialize,
ping, tools/list, resources/list, several concurrent streams, DNS-rebinding protection — pass
with the compact schemas, toolsets and strict arguments in place.

The suite's client sends no bearer token, so the server runs with ``--no-auth`` on loopback (the
Host check of ``--no-auth`` is what the DNS-rebinding scenario exercises). 0.1.12 is the newest
release that runs on this machine's Node.js 20 (later ones import ``fs.globSync``, Node 22)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import make_home

SUITE = "@modelcontextprotocol/conformance@0.1.12"
NODE_DIR = (
    Path(os.environ.get("SHELLYARD_TEST_NODE_DIR", Path.home() / ".cache/shellyard-node"))
    / "conformance-0.1.12"
)
SERVE = [sys.executable, "-m", "shellyard", "serve"]
SCENARIOS = (
    "server-initialize",
    "ping",
    "tools-list",
    "resources-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
)


@pytest.fixture(scope="module")
def suite() -> Path:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("npm/node are not installed: the MCP conformance suite needs Node.js")
    binary = NODE_DIR / "node_modules" / ".bin" / "conformance"
    if not binary.exists():
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        # A package of its own: npm would otherwise install into the nearest one above.
        (NODE_DIR / "package.json").write_text('{"private": true}\n')
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", SUITE],
            cwd=NODE_DIR,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def open_server() -> Iterator[str]:
    home = make_home()
    port = free_port()
    process = subprocess.Popen(
        [*SERVE, "--home", str(home), "--no-auth", "--port", str(port)],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert process.poll() is None, "shellyard serve exited before it was ready"
        assert time.monotonic() < deadline, "shellyard serve did not come up"
        time.sleep(0.2)
    yield f"{url}/mcp"
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_generic_conformance_scenario_passes(
    suite: Path, open_server: str, scenario: str
) -> None:
    done = subprocess.run(
        [str(suite), "server", "--url", open_server, "--scenario", scenario],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    result = re.search(r"Passed: (\d+)/(\d+), (\d+) failed", text)
    assert result is not None, text
    passed, total, failed = (int(group) for group in result.groups())
    assert failed == 0 and passed == total and total > 0, text
