"""The server's HTTP connections, bounded (docs/security.md "Limits at each door").

uvicorn (0.55) closes a keep-alive connection idle after an answer, but not one that never
finishes sending its request's headers: a client sending a byte every few seconds holds its
socket forever, and any number of them may be open. This protocol (uvicorn's httptools one:
the request is parsed by llhttp in C, not by h11 in Python, a fifth of the server's CPU for a
small request; docs/benchmarks.md §56) adds:

- a header size bound: a request line and headers past :data:`MAX_HEAD_BYTES` are answered
  400 and the connection is closed (counted as they arrive, so a header that never ends is
  not kept growing in memory);
- a bound on what is not body while a body arrives (chunk size lines, their extensions,
  trailers): past :data:`MAX_HEAD_BYTES` of it since the last byte of body, 400 and closed
  (the parser keeps a trailer's name and value in memory until it ends, so one that never
  ends grew the server without bound, each piece copying all before it);
- a bound on pipelined requests: past :data:`MAX_PIPELINED` requests waiting behind the one
  being answered, the rest are not parsed; the waiting ones are answered and the last answer
  closes the connection (the client sends the rest again on a new one, RFC 9112 9.3.2). The
  parser reads a whole read's worth of requests at once (256 KiB: thousands of small ones),
  and each waiting one holds its scope and state, ~1.3 KiB: 9 MiB per connection);
- a header deadline: a connection whose request headers are not complete
  :data:`HEADER_TIMEOUT_S` after it opened (or after its previous answer) is closed (with a
  408 when part of a request came; the deadline does not move with the bytes);
- a body deadline: a request whose body makes no progress for :data:`BODY_IDLE_S` (no byte
  arrives while the server is ready to read) is closed; the handler sees the client gone
  and an upload being streamed is dropped (staged, so nothing lands);
- a body's whole time: :data:`BODY_TIMEOUT_S` from its headers, plus a second for each
  :data:`BODY_MIN_RATE` bytes received (time the server is not reading not counted), else
  408 (or closed, if an answer began) — the idle deadline resets on every byte, so a body
  at a byte every 29 s held its connection for as long as it declared;
- an unsupported ``Upgrade`` (``h2c``; there is no websocket route) is ignored: the request
  is answered as HTTP/1.1 and what follows it is read as usual. llhttp stops at an upgrade
  request's headers and takes what follows for the new protocol (a request pipelined behind
  it was dropped, a body skipped and read as the next request); the request is replayed
  to the parser without its ``Upgrade`` so it is framed as any other;
- a cap per client address: past :data:`MAX_CONNECTIONS_PER_CLIENT` open connections from
  one address, a new one is closed at once (the server-wide cap is uvicorn's
  ``limit_concurrency``, answered 503).

Its answers go out through ``OneWrite`` (api/one_write.py): an answer's head and a small body
in one send instead of two.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import cast

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from shellyard import settings_env
from shellyard.api.one_write import OneWrite

#: Seconds a client has to send a request's headers.
HEADER_TIMEOUT_S = 10.0
#: Seconds a request's body may make no progress while the server waits for it
#: (``SHELLYARD_BODY_IDLE_S`` overrides it, for tests).
BODY_IDLE_S = 30.0
#: Seconds a request's body may take, from its headers, before the time it earns by
#: arriving (``SHELLYARD_BODY_TIMEOUT_S`` overrides it).
BODY_TIMEOUT_S = 60.0
#: Bytes of body that earn it one more second: an upload faster than this (64 KiB/s) is never
#: cut, whatever its size; a body at a byte every few seconds is, at BODY_TIMEOUT_S.
BODY_MIN_RATE = 64 * 1024
#: Most connections open at once from one client address.
MAX_CONNECTIONS_PER_CLIENT = 256
#: Most connections and running requests of the whole server (uvicorn answers 503 past it).
MAX_CONCURRENCY = 1024
#: Seconds an idle keep-alive connection stays open after an answer.
KEEP_ALIVE_S = 5
#: Most bytes of a request line and its headers.
MAX_HEAD_BYTES = 16 * 1024
#: Most requests of one connection waiting behind the one being answered (pipelined).
MAX_PIPELINED = 16


class HeadTooLarge(Exception):
    """Raised from a parser callback: the parser stops and uvicorn answers 400 and closes."""


class UnsupportedUpgrade(Exception):
    """Raised from a parser callback: a CONNECT (an upgrade that cannot be ignored)."""


class PipelineFull(Exception):
    """Raised from a parser callback: the parser stops; what was queued is answered."""


@functools.cache
def body_limits() -> tuple[float, float]:
    """(idle, whole) seconds of a request's body, from the environment. Read at the first
    connection, not at import: the server's start checks the values first
    (``settings_env.check_environment``), so a bad one is refused naming the variable, not
    met here as a bare ``float`` error."""
    idle = settings_env.get("SHELLYARD_BODY_IDLE_S")
    whole = settings_env.get("SHELLYARD_BODY_TIMEOUT_S")
    return (
        BODY_IDLE_S if idle is None else float(idle),
        BODY_TIMEOUT_S if whole is None else float(whole),
    )


class BoundedHttp(HttpToolsProtocol):
    _header_deadline: asyncio.TimerHandle | None = None
    _body_deadline: asyncio.TimerHandle | None = None
    #: The bytes arriving are a request's line and headers (from the connection's start, or
    #: from the end of the previous request's body, until its headers are complete).
    _in_head = True
    #: Bytes received while in a head: the parser keeps an unfinished header in memory.
    _head_received = 0
    #: The request line and headers the parser has given so far, of the current request.
    _head_size = 0
    #: The request's headers are complete and its body is not.
    _in_body = False
    #: Requests begun on this connection (a read may end one and begin the next).
    _messages = 0
    #: Bytes of body given by the parser, of this connection.
    _body_bytes = 0
    #: Bytes received in a body since its last byte of body (framing, trailers).
    _frame_bytes = 0
    #: The pipeline reached its bound: nothing more is parsed on this connection.
    _full = False
    #: The request being parsed asks for an upgrade the server does not make: it is given
    #: to the parser again without it (``_replay``), not to the application.
    _upgrade_ignored = False
    #: When the current body's headers completed (loop time), and the seconds credited to
    #: it while the server was not reading.
    _body_started = 0.0
    _body_credit = 0.0
    #: ``_body_bytes`` when the current body's headers completed.
    _body_start_bytes = 0
    _body_whole_deadline: asyncio.TimerHandle | None = None
    #: ``body_limits()``, set when the connection is made
    _body_idle_s = BODY_IDLE_S
    _body_timeout_s = BODY_TIMEOUT_S

    def data_received(self, data: bytes) -> None:
        if self._full:
            return  # its queued answers go out, the last one closes the connection
        if self._in_head:
            self._head_received += len(data)
        in_body, message, body_bytes = self._in_body, self._messages, self._body_bytes
        self._feed(data)
        if self.transport.is_closing() or self._full:
            return
        if self._in_head and self._head_received > MAX_HEAD_BYTES:
            self.send_400_response(_too_large_text())
            return
        if in_body and self._in_body and message == self._messages:
            # a read that gave no body byte: all of it was framing or trailers
            if self._body_bytes == body_bytes:
                self._frame_bytes += len(data)
            else:
                self._frame_bytes = 0
            if self._frame_bytes > MAX_HEAD_BYTES:
                self._frame_too_large()
                return
        self._watch_body()

    def _feed(self, data: bytes) -> None:
        """uvicorn's ``data_received``, but an upgrade it does not make is replayed."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade as stop:
            if self._upgrade_ignored:
                self._replay(data[stop.args[0] :])
            elif self._should_upgrade():  # pragma: no cover - no websocket protocol is set
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _replay(self, rest: bytes) -> None:
        """The request whose upgrade was ignored, to the parser again without ``Upgrade``
        (and without ``upgrade`` in ``Connection``), then what followed it: the parser frames
        its body and the requests behind it as any other's."""
        self._upgrade_ignored = False
        version = self.parser.get_http_version().encode("ascii")
        lines = [self.parser.get_method(), b" ", self.url, b" HTTP/", version, b"\r\n"]
        for name, value in self.headers:
            if name == b"upgrade":
                continue
            if name == b"connection":
                tokens = [t.strip() for t in value.split(b",")]
                value = b", ".join(t for t in tokens if t and t.lower() != b"upgrade")
                if not value:
                    continue
            lines += [name, b": ", value, b"\r\n"]
        lines.append(b"\r\n")
        # A parser of its own: llhttp ended the upgrade request's message, and with
        # ``Connection: close`` among its tokens the old parser (uvicorn's leniency for data
        # after close) dropped the replay without a word: the request was never answered.
        self.parser = _parser(self)
        self._feed(b"".join(lines) + rest)

    def _frame_too_large(self) -> None:
        text = (
            f"Chunk framing or trailers larger than {MAX_HEAD_BYTES} bytes between two bytes "
            "of body."
        )
        self.logger.warning(
            "closing a connection from %s: %s", self.client[0] if self.client else "?", text
        )
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # an answer is on its way: a 400 would be inside it
        else:
            self.send_400_response(text)

    def send_400_response(self, msg: str) -> None:
        if self._full:
            return  # not a bad request: the pipeline's bound (on_message_begin)
        super().send_400_response(msg)

    # Parser callbacks (uvicorn's, with the head's size counted).
    def on_message_begin(self) -> None:
        if len(self.pipeline) >= MAX_PIPELINED:
            # The queued ones are complete requests (this one began after the last ended):
            # answer them, the last with "connection: close"; parse nothing more.
            self._full = True
            self.pipeline[0][0].keep_alive = False
            self.logger.warning(
                "closing a connection from %s after its %d queued answers: more than %d "
                "pipelined requests",
                self.client[0] if self.client else "?",
                len(self.pipeline),
                MAX_PIPELINED,
            )
            raise PipelineFull()
        self._messages += 1
        self._head_size = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._grow(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def _grow(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD_BYTES:
            raise HeadTooLarge(_too_large_text())

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and not self._should_upgrade():
            if self.parser.get_method() == b"CONNECT":
                raise UnsupportedUpgrade("CONNECT is not served here.")
            # Not given to the application: replayed without the upgrade (``_feed``), as a
            # server without HTTP/2 answers it (RFC 9110 7.8: the upgrade may be ignored).
            self._upgrade_ignored = True
            return
        self._in_head = False
        self._in_body = True
        self._frame_bytes = 0
        self._disarm()
        super().on_headers_complete()
        self._body_started, self._body_credit = self.loop.time(), 0.0
        self._body_start_bytes = self._body_bytes

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._upgrade_ignored:
            return  # its body (if any) was skipped: the replay frames it
        self._in_body = False
        self._in_head = True  # what comes next is the next request's head
        self._head_received = 0
        self._disarm_whole_body()
        super().on_message_complete()

    def _arm_whole_body(self, after: float) -> None:
        self._disarm_whole_body()
        self._body_whole_deadline = self.loop.call_later(after, self._body_too_slow)

    def _disarm_whole_body(self) -> None:
        if self._body_whole_deadline is not None:
            self._body_whole_deadline.cancel()
            self._body_whole_deadline = None

    def _body_too_slow(self) -> None:
        """The body's whole time: its allowance grows with each :data:`BODY_MIN_RATE` bytes
        received, and while the server is not reading (its own backlog) the clock is stopped,
        a second at a time."""
        self._body_whole_deadline = None
        if not self._in_body or self.transport.is_closing():
            return
        if self._server_holds_body():
            self._body_credit += 1.0
            self._arm_whole_body(1.0)
            return
        received = self._body_bytes - self._body_start_bytes
        allowed = self._body_started + self._body_credit + self._body_timeout_s
        left = allowed + received / BODY_MIN_RATE - self.loop.time()
        if left > 0:
            self._arm_whole_body(left)
            return
        self._timed_out(
            f"The request body was not complete {self._body_timeout_s:g} s after its headers, plus "
            f"a second for each {BODY_MIN_RATE // 1024} KiB received: send the body at least "
            f"that fast (a larger one in parts), then send the request again."
        )

    def _server_holds_body(self) -> bool:
        """The server is not reading the body (its backlog), or has not asked for it yet (the
        client waits for ``100 Continue``, sent when the application first reads)."""
        waiting = self.cycle is not None and self.cycle.waiting_for_100_continue
        return self.flow.read_paused or waiting

    def _timed_out(self, text: str) -> None:
        """408 and closed (only closed if an answer began); the application sees the client
        gone (an upload being streamed is dropped: staged, nothing lands)."""
        self.logger.warning(
            "closing a connection from %s: %s", self.client[0] if self.client else "?", text
        )
        if self.cycle is not None and not self.cycle.response_complete:
            started = self.cycle.response_started
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            if started:
                self.transport.close()
                return
        body = text.encode()
        head = [STATUS_LINE[408]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def _watch_body(self) -> None:
        """Re-arm the body deadline on each byte of a body still being sent."""
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None
        if self._in_body and not self.transport.is_closing():
            self._body_deadline = self.loop.call_later(self._body_idle_s, self._body_late)
            if self._body_whole_deadline is None:  # armed once a body outlasts its first read
                after = self._body_started + self._body_timeout_s - self.loop.time()
                self._arm_whole_body(max(after, 0.0))

    def _body_late(self) -> None:
        self._body_deadline = None
        if not self._in_body or self.transport.is_closing():
            return
        if self._server_holds_body():  # not the client's delay
            self._body_deadline = self.loop.call_later(self._body_idle_s, self._body_late)
            return
        self.logger.warning(
            "closing a connection from %s: its request body made no progress for %g s",
            self.client[0] if self.client else "?",
            self._body_idle_s,
        )
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._body_idle_s, self._body_timeout_s = body_limits()
        # Every write of the protocol and its answers (flow control keeps the socket's own).
        self.transport = cast(asyncio.Transport, OneWrite(transport, self.loop))
        host = self.client[0] if self.client else None
        if host is not None:
            same = sum(
                1
                for other in self.connections
                if (client := getattr(other, "client", None)) and client[0] == host
            )
            if same > MAX_CONNECTIONS_PER_CLIENT:
                self.logger.warning(
                    "closing a connection from %s: it has %d open, more than %d",
                    host,
                    same - 1,
                    MAX_CONNECTIONS_PER_CLIENT,
                )
                transport.close()
                return
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_received == 0:
            self.transport.close()  # an idle connection: nothing was asked, nothing to answer
            return
        self._timed_out(
            f"The request line and headers were not complete {HEADER_TIMEOUT_S:g} s after "
            "the connection opened (or after the previous answer): send them at once."
        )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # armed for the next request unless its headers came already (pipelined)
        if self._in_head and not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_whole_body()
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None
        super().connection_lost(exc)


def _parser(protocol: HttpToolsProtocol) -> httptools.HttpRequestParser:
    """A request parser as uvicorn makes one (``HttpToolsProtocol.__init__``)."""
    parser = httptools.HttpRequestParser(protocol)
    # uvicorn's: answer the first request of a pipeline that follows a "close"
    with contextlib.suppress(AttributeError):  # httptools < 0.6.3
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


def _too_large_text() -> str:
    return f"Request line and headers larger than {MAX_HEAD_BYTES} bytes."


__all__ = [
    "BODY_IDLE_S",
    "BODY_MIN_RATE",
    "BODY_TIMEOUT_S",
    "HEADER_TIMEOUT_S",
    "KEEP_ALIVE_S",
    "MAX_CONCURRENCY",
    "MAX_CONNECTIONS_PER_CLIENT",
    "MAX_HEAD_BYTES",
    "MAX_PIPELINED",
    "BoundedHttp",
]
