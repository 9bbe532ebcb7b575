"""The product's long-running processes on uvloop by default and on asyncio's loop with
``SHELLYARD_LOOP=asyncio``, seen from outside (docs/operations.md "The event loop"):

- ``shellyard serve`` says the loop it serves on in /metrics (read from the running loop
  inside the request, not from the setting);
- ``shellyard mcp`` and ``shellyard runner serve`` have no such endpoint: uvloop's extension
  module mapped into the process (/proc/PID/maps) or not (with ``asyncio`` it is never
  imported). ``mcp`` also answers a tool call over its stdio pipes and exits 0 at EOF, fd 1
  put back (on uvloop its pipe transports once closed the descriptor it is put back from);
  ``runner serve`` stops gracefully on SIGTERM.

And a value ``SHELLYARD_LOOP`` does not take stops each of the three at start, naming the
values it takes (``mcp`` answers the host's ``initialize`` with it)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from leftover_mounts import remove_home
from served_server import served_server

from conftest import make_home
from shellyard.runner.transport.daemon import READY_PREFIX

SHELLYARD = [sys.executable, "-m", "shellyard"]
INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "test", "version": "0"},
}


def uvloop_mapped(pid: int) -> bool:
    """uvloop's extension module (``uvloop/loop.cpython-….so``) is mapped into ``pid``."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return re.search(r"/uvloop/loop\.[^/\s]*\.so$", maps, re.MULTILINE) is not None


def line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n"


@pytest.mark.parametrize(("setting", "loop"), [(None, "uvloop"), ("asyncio", "asyncio")])
def test_the_servers_run_on_uvloop_unless_asked_for_asyncio(setting: str | None, loop: str) -> None:
    env = {**os.environ}
    env.pop("SHELLYARD_LOOP", None)
    if setting is not None:
        env["SHELLYARD_LOOP"] = setting
    with served_server({"SHELLYARD_LOOP": setting} if setting else {}) as served:
        # serve: the loop its request handler runs on
        metrics = httpx.get(f"{served.url}/metrics", headers=served.admin, timeout=30).text
        assert f'shellyard_event_loop_info{{loop="{loop}"}} 1.0' in metrics, metrics[-600:]
        assert uvloop_mapped(served.pid) == (loop == "uvloop")

        # mcp: a client of that server over its stdio pipes
        home = served.home
        mcp = subprocess.Popen(
            [*SHELLYARD, "mcp", "--home", str(home)],
            env={**env, "SHELLYARD_HOME": str(home)},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert mcp.stdin is not None and mcp.stdout is not None
        try:
            mcp.stdin.write(line({"id": 1, "method": "initialize", "params": INIT}))
            mcp.stdin.write(line({"method": "notifications/initialized"}))
            call = {"name": "run_shell", "arguments": {"command": "echo hi"}}
            mcp.stdin.write(line({"id": 2, "method": "tools/call", "params": call}))
            mcp.stdin.flush()
            answers = [json.loads(mcp.stdout.readline()) for _ in range(2)]
            assert uvloop_mapped(mcp.pid) == (loop == "uvloop")
            mcp.stdin.close()  # EOF: the server ends, fd 0 and fd 1 put back
            assert mcp.wait(timeout=60) == 0, mcp.stderr.read() if mcp.stderr else ""
        finally:
            mcp.kill()
            mcp.wait()
        assert answers[0]["result"]["serverInfo"]["name"]
        done = answers[1]["result"]["structuredContent"]
        assert done["state"] == "completed" and done["stdout"] == "hi\n", done

    # runner serve: its own process, stopped by SIGTERM
    root = make_home()
    try:
        daemon = subprocess.Popen(
            [*SHELLYARD, "runner", "serve", "--root", str(root / "runner"), "--port", "0"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert daemon.stderr is not None
            seen = []
            for raw in daemon.stderr:  # until its ready line (or its end)
                seen.append(raw.decode(errors="replace"))
                if seen[-1].startswith(READY_PREFIX):
                    break
            assert seen and seen[-1].startswith(READY_PREFIX), "".join(seen[-20:])
            assert uvloop_mapped(daemon.pid) == (loop == "uvloop")
            daemon.send_signal(signal.SIGTERM)
            # a graceful stop (the runner closed by the lifespan's end), then uvicorn raises
            # the signal again to end as it asked, on both loops
            rest = daemon.stderr.read().decode(errors="replace")
            assert daemon.wait(timeout=60) == -signal.SIGTERM
            assert "Application shutdown complete" in rest, rest[-2000:]
        finally:
            daemon.kill()
            daemon.wait()
    finally:
        remove_home(root)


def test_a_bad_loop_setting_stops_each_server_at_start_naming_the_values() -> None:
    home = make_home()
    env = {**os.environ, "SHELLYARD_HOME": str(home), "SHELLYARD_LOOP": "fast"}
    wanted = "SHELLYARD_LOOP='fast' is not valid: use auto, uvloop, asyncio"
    try:
        for argv in (
            ["serve", "--port", "0"],
            ["runner", "serve", "--root", str(home / "runner"), "--port", "0"],
        ):
            done = subprocess.run(
                [*SHELLYARD, *argv], env=env, capture_output=True, text=True, timeout=120,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert done.returncode != 0, argv
            assert wanted in done.stderr, (argv, done.stderr)
        # mcp: the host waits for its initialize answer, which carries the error
        request = line({"id": 1, "method": "initialize", "params": INIT})
        done = subprocess.run(
            [*SHELLYARD, "mcp"], env=env, input=request, capture_output=True, timeout=120
        )
        assert done.returncode != 0
        assert wanted in done.stderr.decode()
        answer = json.loads(done.stdout.splitlines()[0])
        assert answer["id"] == 1 and wanted in answer["error"]["message"]
        assert not (home / "server.json").exists()  # no server was started for it
    finally:
        remove_home(home)
