"""The async SDK's JSON calls and downloads over plain ``http://``: keep-alive HTTP/1.1 on the
running asyncio loop, answers parsed by llhttp (httptools, the server's own parser), without
httpx and httpcore in between (docs/benchmarks.md §61).

Why: ``shellyard mcp`` forwards each tool call to ``shellyard serve`` as one REST call, and
httpx + httpcore were 64 % of that process's CPU per ``run_shell`` (§57): building an
``httpx.Request``, the pool's bookkeeping, h11's state machine in Python, an
``httpx.Response``. One call here is a ``bytes`` head written with its body in one send, and
a protocol whose parser callbacks fill the answer as the bytes arrive.

What it keeps from the httpx path (``AsyncSender`` falls back to it for anything else:
``https://``, a loop that is not asyncio's, the in-process client of /mcp):

- the same timeouts: ``timeout_s`` for connecting, for each wait on a read (no progress
  within it), and for a write to drain, as ``httpx.Timeout(timeout_s)``;
- the same exceptions and texts: a refused connection is ``httpx.ConnectError`` with the
  socket's error, a reset ``httpx.ReadError``, a server gone before its answer
  ``httpx.RemoteProtocolError("Server disconnected without sending a response.")``, so
  ``AsyncSender`` turns them into the same ``RunnerUnavailable`` as before;
- a connection idle past :data:`IDLE_S` is not reused (the server closes its own at
  ``api.connections.KEEP_ALIVE_S``); a kept connection the server closed is seen at reuse
  (its end of file already read) and dropped; one that breaks before any
  byte of the answer came back is retried once on a new connection when the request was not
  sent or its method is idempotent (a POST that may have run is not sent twice);
- an answer is the one asked for: interim (1xx) answers are skipped, the parser stops at
  the answer's end (a second answer in the same read fails the connection, not the call),
  bytes arriving on an idle connection fail it unread, a ``Transfer-Encoding`` other than
  ``chunked`` is refused (as h11 did: llhttp would read it to the connection's end), and
  :data:`MAX_HEAD_BYTES` received without a byte of body (an endless head, 1xx answers,
  chunk framing or trailers) fail the call (docs/security.md "Attack pass (session 48)");
- bounded memory for bytes streams: a download's received bytes wait in the protocol up to
  :data:`HIGH_WATER`, past which the socket is no longer read until the caller takes them.
  A JSON answer is read whole, as pydantic needs it, so it has the bounds of sdk/bounds.py:
  at most ``max_json_bytes`` of body (a larger ``Content-Length`` fails at the head) and the
  whole exchange within its ``timeout_s`` plus a second per 64 KiB received, whatever the
  pace of its reads.

Connections: at most :data:`MAX_BUSY` calls of one client hold a connection at once, and at
most :data:`MAX_IDLE` idle ones are kept, so one client opens at most 256 (the server closes
a client address's connections past ``api.connections.MAX_CONNECTIONS_PER_CLIENT``, 256). A
call past :data:`MAX_BUSY` waits for a connection without a deadline of its own (httpx's pool
failed it after 30 s); its own timeout starts once it has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httptools
import httpx

from shellyard.sdk.answer_clock import MAX_JSON_BYTES, RESENDABLE, AnswerClock
from shellyard.sdk.bounds import AnswerTooSlow, too_large
from shellyard.sdk.native import WaitingProtocol

#: Bytes of a download received and not yet taken past which the socket is not read.
HIGH_WATER = 1 << 20
#: Calls of one client holding a connection at once; more wait for one.
MAX_BUSY = 224
#: Idle keep-alive connections kept per client; past it a released one is closed.
MAX_IDLE = 32
#: Seconds an idle connection is kept: below the server's own idle close
#: (``api.connections.KEEP_ALIVE_S``, 5 s), so a POST is not sent into a connection the
#: server is closing at that moment (as httpx's pool expires its idle ones after 5 s).
IDLE_S = 4.0
#: Most bytes of an answer taken from the server without a byte of its body among them: its
#: head (status line, headers, any 1xx answers before it), or a chunked body's framing and
#: trailers between two bytes of body (httptools holds a header line whole until it ends).
MAX_HEAD_BYTES = 64 * 1024
#: Methods sent again on a new connection when a kept one broke before its answer began
#: (the set the answer clock's advice uses too: sent again, each does what it did once).
IDEMPOTENT = RESENDABLE
#: httpx's own wording for a server that closed before answering (httpcore's h11 error).
DISCONNECTED = "Server disconnected without sending a response."
#: Characters of a path left as they are (httpx's quoting of a URL's path).
_PATH_SAFE = "/:@!$&'()*+,;=%~"

#: httpx's own logger: the request log reads as before the lean client
_log = logging.getLogger("httpx")


class _Stale(Exception):
    """A kept connection broke before any byte of the answer: ``cause`` if not retried."""

    def __init__(self, cause: httpx.TransportError, sent: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.sent = sent


class _Extra(Exception):
    """Raised in a parser callback to stop llhttp (the reason is the connection's failure)."""


class _Connection(WaitingProtocol):
    """One socket to the server and the answer being received on it (llhttp's callbacks)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.parser = httptools.HttpResponseParser(self)
        self.eof = False
        self.lost: Exception | None = None
        self.failure: httpx.TransportError | None = None
        self.paused = False
        #: A download: its body is held to :data:`HIGH_WATER` (a JSON answer is read whole).
        self.streaming = False
        #: A JSON answer's bounds (sdk/bounds.py): most bytes of body, the whole-answer clock.
        self.limit: int | None = None
        self.clock: AnswerClock | None = None
        #: The request's method and path, for the bound's message.
        self.what = ""
        #: When it was last put back idle (the loop's clock).
        self.idle_since = 0.0
        self._start()

    def _start(self) -> None:
        """Ready for the next answer."""
        self.status = 0
        #: Bytes received since the last byte of body (or the request), none of them body.
        self.head_bytes = 0
        self.head_done = False
        self.framed = False  # Content-Length or chunked: its end is known without EOF
        self.codings: list[bytes] = []  # Transfer-Encoding's values
        self.keep_alive = True
        self.chunks: list[bytes] = []
        self.size = 0
        self.body_bytes = 0
        self.done = False
        self.received = False
        #: A request is out on it: bytes received while it is idle answer nothing asked.
        self.asked = False

    # asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        self.received = True
        if not self.asked or self.failure is not None:
            # An answer to no request: taken, it would be the next request's (a desync);
            # kept unread in an idle connection, it grew it without a bound.
            self._fail(httpx.RemoteProtocolError("the server sent an answer nobody asked for"))
            return
        body_bytes = self.body_bytes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the server switched protocols unasked (101)"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"a malformed answer: {exc}"))
        if self.body_bytes != body_bytes:
            self.head_bytes = 0
        elif not self.done:
            # a read without a byte of body: head, 1xx answers, chunk framing or trailers
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                where = "head" if not self.head_done else "chunk framing or trailers"
                self._fail(
                    httpx.RemoteProtocolError(
                        f"the answer's {where} passed {MAX_HEAD_BYTES} bytes without any body"
                    )
                )
        if (
            self.streaming
            and self.size > HIGH_WATER
            and not self.paused
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        if self.head_done and not self.done and not self.framed:
            self.done = True  # a body that ends with the connection (no length given)
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.lost = exc
        self.transport = None
        self._wake()
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)

    # llhttp's callbacks

    def on_message_begin(self) -> None:
        if self.done:
            # A second answer to one request (in the same read as the first): it must not
            # replace the first's status nor add to its body; the parser stops here and the
            # connection is not reused (a pipelined extra would answer the next request).
            self._fail(httpx.RemoteProtocolError("the server sent an answer nobody asked for"))
            raise _Extra

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length":
            self.framed = True
            limit = self.limit
            if limit is not None and value.strip().isdigit() and int(value) > limit:
                self._fail(too_large(limit, self.what))  # refused before a byte of its body
                raise _Extra
        elif lower == b"transfer-encoding":
            self.codings.append(value)

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): skipped, as h11 does; the
            # final answer follows on the same connection (its bytes count in head_bytes).
            self.codings = []
            self.framed = False
            return
        if self.codings:
            # llhttp reads a body whose last coding is not ``chunked`` to the end of the
            # connection, and takes "Chunked" as chunked: ended early, either was a
            # truncated success. httpx (h11) refused any coding but ``chunked``; so here.
            codings = b",".join(self.codings).split(b",")
            if [coding.strip().lower() for coding in codings] != [b"chunked"]:
                self._fail(
                    httpx.RemoteProtocolError("Only Transfer-Encoding: chunked is supported")
                )
                raise _Extra
            self.framed = True
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True
        if status in (204, 304):
            self.framed = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.size += len(body)
        self.body_bytes += len(body)
        if self.clock is not None:
            self.clock.received = self.body_bytes
        if self.limit is not None and self.body_bytes > self.limit:
            # a JSON answer without end (a chunked one has no length to refuse at its head)
            self._fail(too_large(self.limit, self.what))
            raise _Extra

    def on_message_complete(self) -> None:
        if self.head_done:  # not the end of an interim (1xx) answer
            self.done = True

    # the caller's side

    def _fail(self, error: httpx.TransportError) -> None:
        if self.failure is None:
            self.failure = error
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        """Idle and still open: no end of file, nothing unasked-for received."""
        transport = self.transport
        return (
            not self.eof
            and not self.received
            and self.failure is None
            and transport is not None
            and not transport.is_closing()
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise httpx.WriteError("the connection is closed")
        transport.write(data)

    async def drained(self, timeout: float) -> None:
        if self.drain is not None:
            await self._wait(self.drain, timeout, httpx.WriteTimeout)
            if self.transport is None:
                raise httpx.WriteError("the connection closed while writing")

    async def _wait(
        self, future: asyncio.Future[None], timeout: float, late: type[httpx.TimeoutException]
    ) -> None:
        clock, cut = self.clock, False
        if clock is not None:  # a JSON answer: no wait past its whole-answer clock
            bounded, cut = clock.bound(timeout)
            timeout = bounded if bounded is not None else timeout
            if timeout <= 0:
                clock.expired = True
                raise AnswerTooSlow(clock)
        timer = self.loop.call_later(timeout, _expire, future)
        try:
            await future
        except TimeoutError:
            if cut and clock is not None:
                clock.expired = True
                raise AnswerTooSlow(clock) from None
            raise late(f"no progress within {timeout} s") from None
        finally:
            timer.cancel()

    def _broken(self) -> httpx.TransportError:
        """What ended the connection before the answer did, in httpx's terms."""
        if self.failure is not None:
            return self.failure
        if self.lost is not None:
            return httpx.ReadError(str(self.lost) or type(self.lost).__name__)
        if not self.head_done:
            return httpx.RemoteProtocolError(DISCONNECTED)
        return httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body"
        )

    async def head(self, timeout: float) -> None:
        """Wait for the answer's status and headers."""
        while not self.head_done:
            if self.failure is not None or self.eof:
                raise self._broken()
            self.waiter = self.loop.create_future()
            await self._wait(self.waiter, timeout, httpx.ReadTimeout)

    async def chunk(self, timeout: float) -> bytes | None:
        """The next bytes of the body received, or None once it ended."""
        while not self.chunks:
            if self.done:
                return None
            if self.failure is not None or self.eof:
                raise self._broken()
            self.waiter = self.loop.create_future()
            await self._wait(self.waiter, timeout, httpx.ReadTimeout)
        data = self.chunks.pop(0)
        self.size -= len(data)
        if self.paused and self.size <= HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def body(self, timeout: float) -> bytes:
        """The whole body (a JSON answer)."""
        while not self.done:
            if self.failure is not None or self.eof:
                raise self._broken()
            self.waiter = self.loop.create_future()
            await self._wait(self.waiter, timeout, httpx.ReadTimeout)
        chunks, self.chunks, self.size = self.chunks, [], 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _query_value(value: Any) -> str:
    """A query value as httpx writes it (``primitive_value_to_str``)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return ""
    return str(value)


class LeanHttp:
    """Keep-alive connections of one client to one ``http://`` server, and its headers."""

    def __init__(self, host: str, port: int, prefix: str, headers: Mapping[str, str]) -> None:
        self.host = host
        self.port = port
        #: The headers given (the token's, the agent's), for ``as_agent``'s copy.
        self.extra = dict(headers)
        self._prefix = prefix.rstrip("/")
        authority = host if port == 80 else f"{host}:{port}"
        if ":" in host:  # an IPv6 literal
            authority = f"[{host}]" if port == 80 else f"[{host}]:{port}"
        self._origin = f"http://{authority}"
        lines = [f"Host: {authority}", "Accept: */*", "User-Agent: shellyard-sdk"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._headers = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy: asyncio.Semaphore | None = None
        #: Most bytes of one JSON answer's body (sdk/bounds.py).
        self.max_json_bytes = MAX_JSON_BYTES

    @classmethod
    def for_url(cls, url: str, headers: Mapping[str, str]) -> LeanHttp | None:
        """The lean client of ``url``, or None where httpx stays (not plain ``http://``)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.query or parts.fragment:
            return None
        try:
            port = parts.port or 80
            for name, value in headers.items():
                if "\r" in name + value or "\n" in name + value:
                    return None
                (name + value).encode("latin-1")
        except (ValueError, UnicodeEncodeError):  # a bad port; a header httpx would refuse
            return None
        return cls(parts.hostname, port, parts.path, headers)

    def _target(self, path: str, params: Mapping[str, Any] | None) -> str:
        target = quote(self._prefix + "/" + path.lstrip("/"), safe=_PATH_SAFE)
        if params:
            pairs = [
                (key, _query_value(item))
                for key, value in params.items()
                for item in (value if isinstance(value, list | tuple) else (value,))
            ]
            target += "?" + urlencode(pairs)
        return target

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """The request's head and body, for one write."""
        head = f"{method} {self._target(path, params)} HTTP/1.1\r\n".encode("latin-1")
        head += self._headers
        if headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        if body is None:
            if method in ("POST", "PUT", "PATCH"):
                head += b"Content-Length: 0\r\n"
            return head + b"\r\n"
        return head + b"Content-Length: %d\r\nContent-Type: application/json\r\n\r\n%s" % (
            len(body),
            body,
        )

    def _logged(
        self, method: str, path: str, params: Mapping[str, Any] | None, status: int
    ) -> None:
        """httpx's line for each answer, on its logger: ``--log-level info`` shows the requests
        as it did with httpx (tests/doors/cli/test_first_minute.py); nothing is built below
        INFO."""
        if _log.isEnabledFor(logging.INFO):
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = ""
            url = self._origin + self._target(path, params)
            _log.info('HTTP Request: %s %s "HTTP/1.1 %d %s"', method, url, status, phrase)

    def _slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._busy is None:
            # connections of an earlier loop (a test's asyncio.run) are of no use here
            for conn in self._idle:
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    conn.close()
            self._idle = []
            self._loop = loop
            self._busy = asyncio.Semaphore(MAX_BUSY)
        return self._busy

    async def _connect(self, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(loop)
        try:
            async with asyncio.timeout(timeout):
                # asyncio and uvloop set TCP_NODELAY on their TCP sockets
                await loop.create_connection(lambda: conn, self.host, self.port)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.done and conn.keep_alive and not conn.chunks and len(self._idle) < MAX_IDLE:
            conn._start()  # asked is False: what arrives now fails it
            conn.streaming = False
            conn.limit = conn.clock = None
            if conn.paused and conn.transport is not None:
                # a kept connection left paused would never read its next answer
                conn.paused = False
                conn.transport.resume_reading()
            if conn.reusable():
                conn.idle_since = conn.loop.time()
                self._idle.append(conn)
                return
        conn.close()

    async def _opened(
        self,
        data: bytes,
        method: str,
        timeout: float,
        *,
        streaming: bool = False,
        clock: AnswerClock | None = None,
        what: str = "",
    ) -> _Connection:
        """A connection with the request sent and the answer's head received. ``clock``: a
        JSON answer's, which also bounds its size (a stream has neither bound)."""
        limit = None if streaming else self.max_json_bytes
        while self._idle:
            conn = self._idle.pop()
            if not conn.reusable() or conn.loop.time() - conn.idle_since > IDLE_S:
                conn.close()
                continue
            try:
                conn.streaming, conn.limit, conn.clock, conn.what = streaming, limit, clock, what
                return await self._exchange(conn, data, timeout, kept=True)
            except _Stale as stale:
                conn.close()
                if stale.sent and method not in IDEMPOTENT:
                    raise stale.cause from None
                break  # once, on a new connection below
        conn = await self._connect(timeout)
        conn.streaming, conn.limit, conn.clock, conn.what = streaming, limit, clock, what
        return await self._exchange(conn, data, timeout, kept=False)

    async def _exchange(
        self, conn: _Connection, data: bytes, timeout: float, *, kept: bool
    ) -> _Connection:
        sent = False
        conn.asked = True
        try:
            conn.write(data)
            sent = True
            await conn.drained(timeout)
            await conn.head(timeout)
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            conn.close()
            if kept and not conn.received:
                raise _Stale(exc, sent) from exc
            raise
        except BaseException:
            conn.close()
            raise
        return conn

    async def call(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        body: bytes | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        """One request; the answer's status and whole body."""
        data = self._request(method, path, params, body)
        async with self._slots():
            # the whole exchange, from here (a call waiting for a slot has not begun)
            clock = AnswerClock(timeout, asyncio.get_running_loop().time, method)
            conn = await self._opened(data, method, timeout, clock=clock, what=f"{method} {path}")
            try:
                content = await conn.body(timeout)
            except BaseException:
                conn.close()
                raise
            status = conn.status
            self._release(conn)
            self._logged(method, path, params, status)
            return status, content

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        timeout: float,
    ) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        """One request whose answer's body is read as it arrives: its status and chunks."""
        data = self._request(method, path, params, None, headers)
        async with self._slots():
            conn = await self._opened(data, method, timeout, streaming=True)
            self._logged(method, path, params, conn.status)

            async def chunks() -> AsyncIterator[bytes]:
                while (chunk := await conn.chunk(timeout)) is not None:
                    yield chunk

            try:
                yield conn.status, chunks()
            except BaseException:
                conn.close()
                raise
            if conn.done:
                self._release(conn)
            else:  # the caller stopped early: the rest of the body is not read
                conn.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                conn.close()


__all__ = ["HIGH_WATER", "IDEMPOTENT", "IDLE_S", "MAX_BUSY", "MAX_IDLE", "LeanHttp"]
