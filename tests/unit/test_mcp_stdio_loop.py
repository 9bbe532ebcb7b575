"""mcp/stdio.py on the event loop (E1 through the MCP door, §3): with stdin and stdout pipes,
``run_stdio`` reads and writes them on the loop, without a worker thread per message. Under
many calls in flight, each answer with more than a pipe's worth of data, every answer is
one whole line with its own payload; stray output misses the wire; EOF on stdin ends the
server; fd 0 and fd 1 come back, blocking as they were. A real ``MCPServer`` in a child
process with real pipes, driven by raw JSON-RPC lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import pytest

SERVER = textwrap.dedent(
    """
    import asyncio, os, sys, threading
    from mcp.server.mcpserver import MCPServer
    from shellyard import loops
    from shellyard.mcp.stdio import run_stdio

    server = MCPServer(name="loop")

    @server.tool()
    async def blob(n: int, size: int) -> str:
        print("stray", n, flush=True)  # fd 1 is stderr's while serving
        await asyncio.sleep((n % 5) / 100)  # answers finish out of order
        return str(n) * size

    @server.tool()
    async def measure(text: str) -> int:
        return len(text)

    @server.tool()
    async def threads() -> list[str]:
        return sorted(thread.name for thread in threading.enumerate())

    async def main():
        global served_on
        served_on = loops.name(asyncio.get_running_loop())
        await run_stdio(server)

    loops.run(main())  # as `shellyard mcp` runs it: on the loop SHELLYARD_LOOP chooses
    print("after", os.get_blocking(0), os.get_blocking(1), served_on, flush=True)
    """
)

CALLS = 40
SIZE = 100_000  # more than a pipe holds (64 KiB): answers wait in the transport's buffer
BIG = 150_001  # characters of 2 bytes: a request of 300 kB


def request(id: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


def requests() -> bytes:
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
    # A request longer than a read (64 KiB), its two-byte characters cut between reads.
    big = {"name": "measure", "arguments": {"text": "é" * BIG}}
    lines.append(request(CALLS + 2, "tools/call", big))
    return b"".join(lines)


def pipes() -> tuple[Any, Any, Any, Callable[[], None]]:
    """What the child gets as stdin and stdout, the parent's ends (write, read) and how the
    parent ends its input. ``pipes``: as Python's clients start a server."""
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    to_child, from_child = os.fdopen(write_in, "wb"), os.fdopen(read_out, "rb")
    return (read_in, write_out), to_child, from_child, to_child.close


def sockets() -> tuple[Any, Any, Any, Callable[[], None]]:
    """A socket pair each, as Node's (libuv's) clients start a server."""
    child_in, parent_in = socket.socketpair()
    child_out, parent_out = socket.socketpair()
    to_child, from_child = parent_in.makefile("wb"), parent_out.makefile("rb")

    def end() -> None:
        to_child.close()
        parent_in.shutdown(socket.SHUT_WR)

    return (child_in, child_out), to_child, from_child, end


def one_socket() -> tuple[Any, Any, Any, Callable[[], None]]:
    """One socket for both (inetd's way): left to the package's threads, since the loop's
    write transport would take a request arriving on its socket for the peer's end."""
    child, parent = socket.socketpair()
    to_child, from_child = parent.makefile("wb"), parent.makefile("rb")

    def end() -> None:
        to_child.close()
        parent.shutdown(socket.SHUT_WR)

    return (child, child), to_child, from_child, end


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize(
    ("wiring", "threads"),
    [
        (pipes, ["MainThread"]),
        (sockets, ["MainThread"]),
        (one_socket, ["AnyIO worker thread", "AnyIO worker thread", "MainThread"]),
    ],
)
def test_answers_whole_on_the_loop_and_eof_ends_the_server(
    wiring: Callable[[], tuple[Any, Any, Any, Callable[[], None]]], threads: list[str], loop: str
) -> None:
    (stdin, stdout), to_child, from_child, end = wiring()
    child = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env={**os.environ, "SHELLYARD_LOOP": loop},
    )
    for mine in {stdin, stdout}:  # the child's ends are the child's alone
        if isinstance(mine, socket.socket):
            mine.close()
        else:
            os.close(mine)
    try:
        # All in flight at once, written beside the reading (more than a pipe holds).
        data = requests()
        writer = threading.Thread(target=lambda: (to_child.write(data), to_child.flush()))
        writer.start()
        answers = [json.loads(from_child.readline()) for _ in range(CALLS + 3)]
        writer.join()
        # EOF on stdin ends the server; fd 0 and fd 1 are back, and blocking again.
        end()
        assert from_child.read() == f"after True True {loop}\n".encode()
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
        from_child.close()
    by_id = {answer["id"]: answer for answer in answers}
    assert sorted(by_id) == list(range(CALLS + 3))
    assert by_id[CALLS + 2]["result"]["structuredContent"]["result"] == BIG
    for n in range(1, CALLS + 1):
        text = by_id[n]["result"]["content"][0]["text"]
        assert text == str(n) * SIZE, n
    # Answers leave in the order they finish (the server's order), not the order asked.
    assert [answer["id"] for answer in answers[1:6]] != [1, 2, 3, 4, 5]
    # On the loop: no worker thread read a message or wrote an answer.
    assert by_id[CALLS + 1]["result"]["structuredContent"]["result"] == threads
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
