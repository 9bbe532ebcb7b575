"""api/one_write.py: the small writes of one loop turn leave as one send; a head whose body
comes later is not held past its turn; closing sends what is held. Real loopback sockets; the
sends are counted on the socket's own transport."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from shellyard.api.connections import BoundedHttp
from shellyard.api.one_write import HOLD_MAX, OneWrite


class _Received(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = asyncio.Event()
        self.grew = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.grew.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[OneWrite, list[int], _Received]]:
    loop = asyncio.get_running_loop()
    received = _Received()
    server = await loop.create_server(lambda: received, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    sends: list[int] = []
    write = transport.write

    def counted(data: Any) -> None:
        sends.append(len(data))
        write(data)

    transport.write = counted  # type: ignore[method-assign]
    joined = OneWrite(transport, loop)  # type: ignore[arg-type]
    try:
        yield joined, sends, received
    finally:
        joined.close()
        server.close()


async def _until(received: _Received, size: int) -> None:
    async with asyncio.timeout(10):
        while len(received.data) < size:
            received.grew.clear()
            await received.grew.wait()


async def test_a_head_and_its_body_of_one_turn_are_one_send(
    pair: tuple[OneWrite, list[int], _Received],
) -> None:
    joined, sends, received = pair
    joined.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
    joined.write(b"")
    assert sends == []  # the head waits for its body
    joined.write(b"hello")
    assert sends == [43]  # sent with it, at once (not at the end of the turn)
    await _until(received, 43)
    assert bytes(received.data) == b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"


async def test_a_head_is_sent_at_the_end_of_its_turn_when_the_body_comes_later(
    pair: tuple[OneWrite, list[int], _Received],
) -> None:
    joined, sends, received = pair
    joined.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    await _until(received, 1)  # arrives although no body was written
    assert sends == [len(received.data)]
    joined.write(b"5\r\nfirst\r\n")
    await _until(received, len(received.data) + 10)
    assert len(sends) == 2


async def test_a_large_write_goes_at_once_after_what_was_held(
    pair: tuple[OneWrite, list[int], _Received],
) -> None:
    joined, sends, received = pair
    joined.write(b"head")
    big = b"x" * (HOLD_MAX + 1)
    joined.write(big)
    assert sends == [4 + len(big)]  # synchronously, in order, in one send
    await _until(received, 4 + len(big))
    assert bytes(received.data[:5]) == b"headx"


async def test_closing_sends_what_is_held(pair: tuple[OneWrite, list[int], _Received]) -> None:
    joined, sends, received = pair
    joined.write(b"last words")
    joined.close()
    async with asyncio.timeout(10):
        await received.closed.wait()
    assert bytes(received.data) == b"last words"
    assert sends == [10]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    await receive()
    if scope["path"] == "/later":  # a stream whose first event comes after its head
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.5)
        await send({"type": "http.response.body", "body": b"event", "more_body": False})
        return
    body = b'{"ok":true}'
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def test_the_server_answers_through_it() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app, http=BoundedHttp, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # keep-alive: two answers on one connection
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            assert await asyncio.wait_for(reader.readexactly(11), 10) == b'{"ok":true}'
        protocols = list(server.server_state.connections)
        assert protocols and all(isinstance(p.transport, OneWrite) for p in protocols)  # type: ignore[attr-defined]
        writer.write(b"GET /later HTTP/1.1\r\nhost: x\r\n\r\n")
        # The head comes before the body is written (0.5 s later), not with it.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.4)
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
