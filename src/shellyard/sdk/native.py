"""The async SDK's sockets on asyncio itself, not through anyio (docs/benchmarks.md §56).

httpcore reaches the network of an asyncio program through anyio: each read and each write
of a connection opens a cancel scope for its timeout (``anyio.fail_after``), asks sniffio
which event loop runs, and checks the task's cancellation, and a connection's reuse polls
its socket. For one REST call (a write, two or three reads) that was a fifth of the client's
CPU beside the call's own work. Here a connection is an ``asyncio.Protocol`` whose bytes wait
in a buffer until httpcore reads them; a timeout is one timer on the loop, armed only when a
read or a drain has to wait.

What httpcore relies on is kept: its exceptions (``ReadTimeout``, ``ReadError``,
``WriteError``, ``ConnectTimeout``, ``ConnectError``), its socket options and local address,
TLS (``loop.start_tls``), the ``is_readable`` check before a kept connection is reused (a
connection the server closed is readable: its end of file), a bounded buffer (reading pauses
past :data:`HIGH_WATER` bytes, so a download is held back by the socket, not kept in memory).
Outside asyncio (trio) the backend it wraps does everything, as before.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any, cast

import httpcore

#: Bytes received and not yet read past which the connection stops reading from its socket.
HIGH_WATER = 1 << 20


class WaitingProtocol(asyncio.Protocol):
    """A client connection's transport, the reader's wake-up and the writer's drain: what this
    module's and sdk/lean.py's connections share."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.drain: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport by construction (create_connection), but not always an instance
        # of asyncio.Transport: uvloop's are classes of their own with the same methods (an
        # isinstance assertion here failed inside uvloop's callback, the transport was never
        # kept, and every call of a program on uvloop failed as "connection closed").
        self.transport = cast(asyncio.Transport, transport)

    def pause_writing(self) -> None:
        self.drain = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)
        self.drain = None

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(WaitingProtocol):
    """One socket's received bytes and state; ``_Stream`` reads and writes through it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.chunks: list[bytes] = []
        self.size = 0
        self.eof = False
        self.lost: Exception | None = None
        self.closed = False
        self.paused_reading = False

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER and not self.paused_reading and self.transport is not None:
            self.paused_reading = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.eof = True
        self.lost = exc
        self._wake()
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)


async def _wait(future: asyncio.Future[None], timeout: float | None, late: type[Exception]) -> None:
    """``future`` done, or ``late`` raised after ``timeout`` seconds (None: no limit)."""
    if timeout is None:
        await future
        return
    timer = future.get_loop().call_later(timeout, _expire, future)
    try:
        await future
    except TimeoutError:  # set by the timer: nothing came in time
        raise late(f"no progress within {timeout} s") from None
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        conn = self._connection
        while not conn.chunks:
            if conn.eof:
                if conn.lost is not None:
                    raise httpcore.ReadError(str(conn.lost) or type(conn.lost).__name__)
                return b""
            conn.waiter = conn.loop.create_future()
            await _wait(conn.waiter, timeout, httpcore.ReadTimeout)
        data = conn.chunks[0]
        if len(data) <= max_bytes:
            conn.chunks.pop(0)
        else:
            data, conn.chunks[0] = data[:max_bytes], data[max_bytes:]
        conn.size -= len(data)
        if conn.paused_reading and conn.size <= HIGH_WATER // 2 and conn.transport is not None:
            conn.paused_reading = False
            conn.transport.resume_reading()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        conn = self._connection
        if conn.closed or conn.transport is None or conn.transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        conn.transport.write(buffer)
        if conn.drain is not None:  # the socket's buffer is full: wait until it drains
            await _wait(conn.drain, timeout, httpcore.WriteTimeout)
            if conn.closed:
                raise httpcore.WriteError("the connection closed while writing")

    async def aclose(self) -> None:
        transport = self._connection.transport
        if transport is not None and not transport.is_closing():
            transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        conn = self._connection
        assert conn.transport is not None
        try:
            tls = await asyncio.wait_for(
                conn.loop.start_tls(
                    conn.transport, conn, ssl_context, server_hostname=server_hostname
                ),
                timeout,
            )
        except TimeoutError as exc:
            await self.aclose()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except (OSError, ssl.SSLError) as exc:
            await self.aclose()
            raise httpcore.ConnectError(str(exc)) from exc
        conn.transport = cast(asyncio.Transport, tls)  # as in connection_made: no isinstance
        return self

    def get_extra_info(self, info: str) -> Any:
        conn = self._connection
        transport = conn.transport
        if info == "is_readable":
            # what a kept connection would read before its next answer: bytes or its end
            return bool(conn.chunks) or conn.eof or transport is None or transport.is_closing()
        if transport is None:
            return None
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        return None


async def _connected(
    loop: asyncio.AbstractEventLoop,
    opening: Any,
    timeout: float | None,
) -> _Stream:
    connection = _Connection(loop)
    try:
        await asyncio.wait_for(opening(lambda: connection), timeout)
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(str(exc) or "connect timed out") from exc
    except OSError as exc:
        raise httpcore.ConnectError(str(exc)) from exc
    return _Stream(connection)


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # trio (or no loop): the wrapped backend's business
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Connections on the running asyncio loop; ``inner`` (httpcore's own) elsewhere."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = running_loop()
        if loop is None:
            return await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        options = list(socket_options or ())
        local = (local_address, 0) if local_address else None

        async def opening(factory: Any) -> Any:
            # asyncio sets TCP_NODELAY on its TCP sockets, as anyio does
            transport, _ = await loop.create_connection(factory, host, port, local_addr=local)
            sock = transport.get_extra_info("socket")
            for option in options:
                sock.setsockopt(*option)
            return transport

        return await _connected(loop, opening, timeout)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = running_loop()
        if loop is None:
            return await self._inner.connect_unix_socket(path, timeout, socket_options)
        options = list(socket_options or ())

        async def opening(factory: Any) -> Any:
            transport, _ = await loop.create_unix_connection(factory, path)
            sock: socket.socket = transport.get_extra_info("socket")
            for option in options:
                sock.setsockopt(*option)
            return transport

        return await _connected(loop, opening, timeout)

    async def sleep(self, seconds: float) -> None:
        if running_loop() is None:
            await self._inner.sleep(seconds)
        else:
            await asyncio.sleep(seconds)


__all__ = ["HIGH_WATER", "AsyncioBackend", "running_loop"]
