"""api/connections.py's protocol (uvicorn's httptools one, bounded) on a real loopback socket:
pipelined requests are answered in order, the header bound holds for each request of a kept
connection and for a head that arrives while the previous request is still being answered
(docs/security.md "Limits at each door"; the served bounds are in tests/doors/api)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from shellyard.api.connections import MAX_HEAD_BYTES, BoundedHttp


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(1.0)
    body = scope["path"].encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def serving() -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, http=BoundedHttp, log_level="critical", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def _all(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\nGET /two HTTP/1.1\r\nhost: x\r\n"
            b"connection: close\r\n\r\n"
        )
        answer = await _all(reader)
        writer.close()
    assert answer.count(b"HTTP/1.1 200") == 2, answer
    assert answer.index(b"/slow") < answer.index(b"/two")


async def test_each_request_of_a_kept_connection_is_bounded() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /one HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        await reader.readexactly(4)
        filler = b"a" * (MAX_HEAD_BYTES + 1)
        writer.write(b"GET /two HTTP/1.1\r\nhost: x\r\nx-filler: " + filler + b"\r\n\r\n")
        answer = await _all(reader)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]


async def test_a_head_sent_while_the_previous_answer_is_pending_is_bounded() -> None:
    """The next request's head, trickled while /slow is being answered, is not kept growing
    in the parser: past the bound the connection is answered 400 and closed."""

    def trickle(port: int) -> bytes:
        import select

        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\nGET /next HTTP/1.1\r\nx-f: ")
            try:
                for _ in range(MAX_HEAD_BYTES // 1024 + 4):
                    if select.select([sock], [], [], 0.005)[0]:
                        break  # answered (and closed)
                    sock.sendall(b"a" * 1024)
            except ConnectionError:
                pass  # closed by the server: what is asserted below
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except ConnectionError:
                pass
            return answer

    async with serving() as port:
        answer = await asyncio.to_thread(trickle, port)
    assert b"HTTP/1.1 400" in answer, answer[:200]
