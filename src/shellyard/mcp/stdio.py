"""``shellyard mcp`` over stdio, each answer written in one hop to a worker thread.

The mcp package writes every message to stdout as ``await write(line)`` then ``await
flush()`` on an anyio file: two round trips to a worker thread per answer (docs/benchmarks.md
§29: a third of ``shellyard mcp``'s own CPU per tool call went to thread hand-offs). Here the
line and its flush are one call in the thread. Like the package's own stdout, fd 1 points at
stderr while serving (a stray print never lands in the protocol), the wire is a private
duplicate of it, and fd 1 is put back at the end; stdin is the package's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import IO, Any, cast

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server


class _Stdout:
    """What the package's stdout writer calls (``write``, ``flush``), for one binary pipe."""

    def __init__(self, wire: IO[bytes]) -> None:
        self._wire = wire

    async def write(self, text: str) -> None:
        await anyio.to_thread.run_sync(self._write, text.encode())

    def _write(self, data: bytes) -> None:
        self._wire.write(data)
        self._wire.flush()

    async def flush(self) -> None:
        return None  # flushed with each write, in the same hop


@contextlib.contextmanager
def _claimed_stdout() -> Iterator[IO[bytes]]:
    """The wire (a private duplicate of fd 1), with fd 1 pointed at stderr meanwhile."""
    private = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr: stray output goes nowhere, as with the package's own
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    wire = os.fdopen(private, "wb", buffering=64 * 1024)
    try:
        yield wire
    finally:
        with contextlib.suppress(OSError, ValueError):
            wire.flush()
        os.dup2(private, 1)
        wire.close()


async def run_stdio(server: MCPServer) -> None:
    """``server.run_stdio_async()``, with one thread hop per answer written."""
    lowlevel: Any = server._lowlevel_server
    with contextlib.ExitStack() as stack:
        try:
            wire = stack.enter_context(_claimed_stdout())
        except OSError:  # no usable fd 1 to duplicate: the package's own way
            await server.run_stdio_async()
            return
        stdout = cast(anyio.AsyncFile[str], _Stdout(wire))
        async with stdio_server(stdout=stdout) as (read_stream, write_stream):
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


__all__ = ["run_stdio"]
