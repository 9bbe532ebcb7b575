"""The SDK's three ways to send a JSON call, driven side by side against one loopback server,
and that server (crafted raw answers), for the tests of its bounds on an answer
(test_sdk_lean.py, the attack passes of sessions 49 and 50)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from shellyard.sdk.client import AsyncClient, Client

#: answers one request on a connection: writes the raw bytes the attack needs
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _request(reader: asyncio.StreamReader) -> bool:
    """One request read whole; True: it asks the connection closed after its answer."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    length, close = 0, False
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            length = int(line.split(":", 1)[1])
        elif line.startswith("connection:"):
            close = "close" in line
    await reader.readexactly(length)
    return close


@contextlib.asynccontextmanager
async def serving(handle: Handler) -> AsyncIterator[str]:
    """A loopback server answering each request with ``handle``, its URL. A connection is
    kept for the next request (the clients' pools reuse it) until either side closes it or
    the request asks it closed (``Connection: close``: ``shellyard run``'s fast path reads
    its answer to the connection's end)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            close = False
            while not close:
                close = await _request(reader)
                await handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with listening:
        yield f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"


def port_of(url: str) -> int:
    """The port of a ``serving`` URL (``shellyard run``'s own socket takes host and port)."""
    return int(url.rsplit(":", 1)[1])


def _as_made(client: Any) -> None:
    """A client left as made."""


async def on_every_path(
    url: str, request: Any, configure: Callable[[Any], None] = _as_made
) -> list[Any]:
    """The outcome (the answer or the exception raised) of ``request`` on each of the SDK's
    three ways to send a JSON call: the lean client, the async httpx path, the blocking
    ``Client`` (in a thread). ``configure`` sets each client up (e.g. ``max_json_bytes``)."""
    outcomes: list[Any] = []
    for use_lean in (True, False):
        async with AsyncClient(url, "tok") as client:
            if not use_lean:
                client._lean = None
            configure(client)
            try:
                outcomes.append(await client._send(request))
            except Exception as exc:
                outcomes.append(exc)

    def blocking() -> Any:
        with Client(url, "tok") as client:
            configure(client)
            try:
                return client._send(request)
            except Exception as exc:
                return exc

    outcomes.append(await asyncio.to_thread(blocking))
    return outcomes


async def wakes_on_both(url: str) -> list[Any]:
    """The outcome (the wakes read to the stream's end, or the exception raised) of
    ``wake_stream`` on the blocking ``Client`` (in a thread) and on ``AsyncClient``."""

    def blocking() -> Any:
        with Client(url, "tok") as client:
            try:
                return list(client.wake_stream("ses_1"))
            except Exception as exc:
                return exc

    outcomes = [await asyncio.to_thread(blocking)]
    async with AsyncClient(url, "tok") as client:
        try:
            outcomes.append([w async for w in client.wake_stream("ses_1")])
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def chunked(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)
