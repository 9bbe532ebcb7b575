"""Attack pass of session 51 (second engineer) on the fixes of session 51: a transfer's lease
let go in the transaction that makes it final (store/files.py ``finish_transfer``,
control/files/transfers.py ``_finish``), and a POST's broken connection as ``AnswerLost`` on
the SDK's paths (sdk/base.py ``_failed``) (docs/security.md "Attack pass (session 51)").

The hostile servers are real loopback sockets doing what each attack needs. Each test says
whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from pydantic import TypeAdapter
from sdk_paths import on_every_path

from shellyard.cli import entry
from shellyard.cli.exits import exit_code_of
from shellyard.errors import AnswerLost, RunnerUnavailable, ShellyardError
from shellyard.sdk.base import call

pytestmark = pytest.mark.timeout(120)

ANY = TypeAdapter(dict[str, Any])
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

#: A request body far past what the sockets' buffers hold: its send is still going when the
#: server resets the connection, so the request never goes whole.
_BIG = 16 << 20


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0): what the client's next write and read meet."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def resetting_after_the_head() -> AsyncIterator[int]:
    """A loopback server that reads a request's head and a few bytes, then resets the
    connection: a request with a large body is refused half-sent; its port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            await reader.read(1000)
        _reset(writer)

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with listening:
        yield int(listening.sockets[0].getsockname()[1])


async def test_a_post_reset_before_it_went_whole_is_retryable_on_every_path() -> None:
    """Finding (fixed): a POST whose send the server cut with a reset before the request went
    whole (a large body; a proxy or a server refusing it half-read) cannot have acted, and the
    lean path and ``shellyard run``'s fast path say "cannot reach ... retry" (exit 75). Since
    session 51's ``_failed`` the async httpx path and the blocking ``Client`` said
    ``AnswerLost`` (124, "the server may have acted"): httpcore suppresses the failed write
    and reads, and the read's reset or "Server disconnected" read as a break after the POST
    went whole. Now a failed write marks the call's clock (sdk/wire.py) and ``_failed`` keeps
    such a break retryable: the same break, the same exit code, on every path."""
    request = call("POST", "/v1/executions", ANY, body={"command": "x" * _BIG})
    async with resetting_after_the_head() as port:
        outcomes = await on_every_path(f"http://127.0.0.1:{port}", request)
        head = f"POST /v1/executions HTTP/1.1\r\ncontent-length: {_BIG}\r\n\r\n".encode()
        try:
            await asyncio.to_thread(entry._exchange, "127.0.0.1", port, head + b"x" * _BIG, 5)
        except ShellyardError as exc:
            outcomes.append(exc)
    paths = ("lean", "async httpx", "blocking", "fast run")
    for path, outcome in zip(paths, outcomes, strict=True):
        assert isinstance(outcome, RunnerUnavailable), (path, outcome)
        assert not isinstance(outcome, AnswerLost), (path, outcome)
        assert exit_code_of(outcome) == 75 and "retry" in str(outcome), (path, outcome)
