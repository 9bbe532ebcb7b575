"""The SDK's connections send a request's head with its first body bytes (sdk/wire.py), over
a real loopback server; the writes that reach the socket are counted below the SDK's stream."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpcore
import httpx
import pytest

from shellyard.sdk import wire


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A minimal HTTP/1.1 server: echoes each request's method and body, keeps the
    connection open (chunked bodies: the upload test)."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method = lines[0].split()[0]
            fields = dict(
                (k.strip().lower(), v.strip()) for k, v in (x.split(":", 1) for x in lines[1:] if x)
            )
            body = b""
            if "content-length" in fields:
                body = await reader.readexactly(int(fields["content-length"]))
            elif fields.get("transfer-encoding") == "chunked":
                while True:
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    chunk = await reader.readexactly(size + 2)
                    if size == 0:
                        break
                    body += chunk[:-2]
            answer = json.dumps({"method": method, "body": body.decode()}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(answer)}\r\n\r\n".encode()
                + answer
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


class _Counted(httpcore.AsyncNetworkBackend):
    """The real backend, with the sizes of the writes each of its streams made."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend, writes: list[int]) -> None:
        self.inner, self.writes = inner, writes

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        writes, write = self.writes, stream.write

        async def counted(buffer: bytes, timeout: float | None = None) -> None:
            if buffer:  # an empty write sends nothing (httpcore's stream returns at once)
                writes.append(len(buffer))
            await write(buffer, timeout)

        stream.write = counted  # type: ignore[method-assign]
        return stream

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def _count_async(transport: httpx.AsyncHTTPTransport) -> list[int]:
    writes: list[int] = []
    backend = transport._pool._network_backend  # type: ignore[union-attr]
    if isinstance(backend, wire._AsyncBackend):
        backend._inner = _Counted(backend._inner, writes)
    else:
        transport._pool._network_backend = _Counted(backend, writes)  # type: ignore[union-attr]
    return writes


@pytest.fixture
async def server() -> AsyncIterator[str]:
    listening = await asyncio.start_server(_answer, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield f"http://127.0.0.1:{port}"


async def test_a_json_request_is_one_write_and_a_plain_client_makes_two(server: str) -> None:
    for transport, expected in ((wire.async_transport(), 1), (httpx.AsyncHTTPTransport(), 2)):
        writes = _count_async(transport)
        async with httpx.AsyncClient(base_url=server, transport=transport) as http:
            answer = await http.post("/v1/executions", json={"command": "true"})
            assert answer.json() == {"method": "POST", "body": '{"command":"true"}'}
            assert len(writes) == expected, writes
            # Keep-alive: the next request on the same connection is one write again.
            answer = await http.get("/health")
            assert answer.json() == {"method": "GET", "body": ""}
            assert len(writes) == expected + 1, writes


async def test_an_upload_still_streams_its_later_chunks(server: str) -> None:
    transport = wire.async_transport()
    writes = _count_async(transport)

    async def chunks() -> AsyncIterator[bytes]:
        for part in (b"one ", b"two ", b"three"):
            yield part

    async with httpx.AsyncClient(base_url=server, transport=transport) as http:
        answer = await http.put("/upload", content=chunks())
    assert answer.json() == {"method": "PUT", "body": "one two three"}
    # head + first chunk, then the second and third chunks, then the chunked end
    assert len(writes) == 4, writes


def test_the_blocking_client_sends_the_head_with_the_body() -> None:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        listening = await asyncio.start_server(_answer, "127.0.0.1", 0)
        box["url"] = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
        box["stop"] = asyncio.Event()
        ready.set()
        async with listening:
            await box["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),))
    thread.start()
    ready.wait(10)
    try:
        transport = wire.sync_transport()
        backend = transport._pool._network_backend  # type: ignore[union-attr]
        assert isinstance(backend, wire._SyncBackend)
        writes: list[int] = []
        inner = backend._inner

        class Counted(httpcore.NetworkBackend):
            def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
                stream = inner.connect_tcp(*args, **kwargs)
                write = stream.write

                def counted(buffer: bytes, timeout: float | None = None) -> None:
                    if buffer:
                        writes.append(len(buffer))
                    write(buffer, timeout)

                stream.write = counted  # type: ignore[method-assign]
                return stream

        backend._inner = Counted()
        with httpx.Client(base_url=box["url"], transport=transport) as http:
            answer = http.post("/v1/executions", json={"command": "true"})
        assert answer.json() == {"method": "POST", "body": '{"command":"true"}'}
        assert len(writes) == 1, writes
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)
        loop.close()
