"""mcp/stdio.py on the event loop (E1 through the MCP door, §3): with stdin and stdout pipes,
``run_stdio`` reads and writes them on the loop, without a worker thread per message. Under
many calls in flight, each answer with more than a pipe's worth of data, every answer is
one whole line with its own payload; stray output misses the wire; EOF on stdin ends the
server; fd 0 and fd 1 come back, blocking as they were. A real ``MCPServer`` in a child
process with real pipes, driven by raw JSON-RPC lines."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

SERVER = textwrap.dedent(
    """
    import asyncio, os, sys, threading
    from mcp.server.mcpserver import MCPServer
    from shellyard.mcp.stdio import run_stdio

    server = MCPServer(name="loop")

    @server.tool()
    async def blob(n: int, size: int) -> str:
        print("stray", n, flush=True)  # fd 1 is stderr's while serving
        await asyncio.sleep((n % 5) / 100)  # answers finish out of order
        return str(n) * size

    @server.tool()
    async def threads() -> list[str]:
        return sorted(thread.name for thread in threading.enumerate())

    asyncio.run(run_stdio(server))
    print("after", os.get_blocking(0), os.get_blocking(1), flush=True)
    """
)

CALLS = 40
SIZE = 100_000  # more than a pipe holds (64 KiB): answers wait in the transport's buffer


def request(id: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


def test_answers_whole_without_worker_threads_and_eof_ends_the_server() -> None:
    init = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    }
    lines = [request(0, "initialize", init)]
    lines.append(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\r\n')
    for n in range(1, CALLS + 1):
        args = {"n": n, "size": SIZE}
        lines.append(request(n, "tools/call", {"name": "blob", "arguments": args}))
    lines.append(b"not json\n")  # refused, the server goes on
    lines.append(request(CALLS + 1, "tools/call", {"name": "threads", "arguments": {}}))
    child = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"".join(lines))  # all in flight at once (fits in the pipe)
        child.stdin.flush()
        answers = [json.loads(child.stdout.readline()) for _ in range(CALLS + 2)]
        # EOF on stdin ends the server; fd 0 and fd 1 are back, and blocking again.
        child.stdin.close()
        assert child.stdout.read() == b"after True True\n"
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
    by_id = {answer["id"]: answer for answer in answers}
    assert sorted(by_id) == list(range(CALLS + 2))
    for n in range(1, CALLS + 1):
        text = by_id[n]["result"]["content"][0]["text"]
        assert text == str(n) * SIZE, n
    # Answers leave in the order they finish (the server's order), not the order asked.
    assert [answer["id"] for answer in answers[1:6]] != [1, 2, 3, 4, 5]
    # Served on the loop: no worker thread read a message or wrote an answer.
    names = by_id[CALLS + 1]["result"]["structuredContent"]["result"]
    assert names == ["MainThread"], names
    assert child.stderr is not None
    assert child.stderr.read().decode().count("stray") == CALLS


UNTRACED = textwrap.dedent(
    """
    import sys
    from mcp.server._otel import OpenTelemetryMiddleware
    from mcp.server.mcpserver import MCPServer
    from opentelemetry import trace
    from shellyard.mcp.stdio import untraced

    if sys.argv[1] == "provider":
        trace.set_tracer_provider(trace.NoOpTracerProvider())  # what an SDK's setup does
    lowlevel = MCPServer(name="t")._lowlevel_server
    untraced(lowlevel)
    print(any(isinstance(m, OpenTelemetryMiddleware) for m in lowlevel.middleware))
    """
)


def test_the_tracing_middleware_goes_only_when_nothing_records_spans() -> None:
    def traced(case: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", UNTRACED, case], capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    assert traced("none") == "False"
    assert traced("provider") == "True"
