"""The SDK's HTTP connections: a request's head and its first body bytes in one write.

httpcore sends an HTTP/1.1 request as one write for the head and one per body chunk. For a
small JSON call (run_shell and every other operation) that is two segments on the wire, so
the server's event loop wakes twice and parses twice before it can answer, and the sender
pays two sends (docs/benchmarks.md §29: the CPU and round trip of one execution). Here a
connection's stream holds the head of each request and sends it with the next write (the
first body chunk, or the empty end of a request without a body) or, at the latest, before the
next read. Nothing else changes: later body chunks go out as they come (an upload streams as
before), and a write that fails while the held head is sent before a read is left to the read
to report, as httpcore does for a request whose server answered early.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from shellyard.sdk.answer_clock import CLOCK, AnswerClock
from shellyard.sdk.native import AsyncioBackend


def _cut(timeout: float | None, late: type[Exception]) -> tuple[float | None, AnswerClock | None]:
    """``timeout`` cut to the current JSON call's whole-answer clock (sdk/bounds.py), and that
    clock when it is the one that cut it; ``late`` at once when no time is left."""
    clock = CLOCK.get()
    if clock is None:
        return timeout, None
    bounded, cut = clock.bound(timeout)
    if bounded is not None and bounded <= 0:
        clock.expired = True
        raise late(clock.message())
    return bounded, clock if cut else None


def _unsent() -> None:
    """A write of the request failed, so it never went whole: httpcore suppresses the error
    and reads (a server may answer early), and the read's ReadError or "disconnected" must
    not make a POST ``AnswerLost`` (sdk/base.py ``_failed``; docs/security.md "Attack pass
    (session 51)")."""
    clock = CLOCK.get()
    if clock is not None:
        clock.unsent = True


def _late(clock: AnswerClock | None) -> None:
    """A timeout came: the clock's when it had cut the wait."""
    if clock is not None:
        clock.expired = True


class _AsyncStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._held = b""
        #: The next write starts a request (the connection is new, or a response was read).
        self._head_next = True

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self._head_next and not self._held and buffer:
            self._head_next = False
            self._held = buffer
            return
        data, self._held = self._held + buffer, b""
        if data:
            bounded, clock = _cut(timeout, httpcore.WriteTimeout)
            try:
                await self._inner.write(data, bounded)
            except httpcore.WriteTimeout:
                _late(clock)
                raise
            except httpcore.WriteError:
                _unsent()
                raise

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            data, self._held = self._held, b""
            # the read says what became of the connection (httpcore's own rule)
            try:
                await self._inner.write(data, _cut(timeout, httpcore.WriteTimeout)[0])
            except httpcore.WriteError:
                _unsent()
        self._head_next = True
        bounded, clock = _cut(timeout, httpcore.ReadTimeout)
        try:
            return await self._inner.read(max_bytes, bounded)
        except httpcore.ReadTimeout:
            _late(clock)
            raise

    async def aclose(self) -> None:
        self._held = b""
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _AsyncStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _SyncStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._held = b""
        self._head_next = True

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self._head_next and not self._held and buffer:
            self._head_next = False
            self._held = buffer
            return
        data, self._held = self._held + buffer, b""
        if data:
            bounded, clock = _cut(timeout, httpcore.WriteTimeout)
            try:
                self._inner.write(data, bounded)
            except httpcore.WriteTimeout:
                _late(clock)
                raise
            except httpcore.WriteError:
                _unsent()
                raise

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            data, self._held = self._held, b""
            try:
                self._inner.write(data, _cut(timeout, httpcore.WriteTimeout)[0])
            except httpcore.WriteError:
                _unsent()
        self._head_next = True
        bounded, clock = _cut(timeout, httpcore.ReadTimeout)
        try:
            return self._inner.read(max_bytes, bounded)
        except httpcore.ReadTimeout:
            _late(clock)
            raise

    def close(self) -> None:
        self._held = b""
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _SyncStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _AsyncBackend(httpcore.AsyncNetworkBackend):
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
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _AsyncStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _AsyncStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _SyncBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _SyncStream(
            self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _SyncStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def async_transport() -> httpx.AsyncHTTPTransport:
    """httpx's own transport (the defaults an ``httpx.AsyncClient`` makes for itself) whose
    connections send a request's head with its body."""
    transport = httpx.AsyncHTTPTransport()
    pool = transport._pool
    # httpcore names the backend of a pool only at construction, which httpx does not
    # expose; an httpcore without the attribute keeps its own (two writes, as before).
    if isinstance(pool, httpcore.AsyncConnectionPool) and hasattr(pool, "_network_backend"):
        # on asyncio, sockets without anyio's layer (sdk/native.py)
        pool._network_backend = _AsyncBackend(AsyncioBackend(pool._network_backend))
    return transport


def sync_transport() -> httpx.HTTPTransport:
    """``async_transport`` for the blocking ``httpx.Client``."""
    transport = httpx.HTTPTransport()
    pool = transport._pool
    if isinstance(pool, httpcore.ConnectionPool) and hasattr(pool, "_network_backend"):
        pool._network_backend = _SyncBackend(pool._network_backend)
    return transport
