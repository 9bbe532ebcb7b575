"""The server's HTTP connections, bounded (docs/security.md "Limits at each door").

uvicorn (0.54, h11) closes a keep-alive connection idle after an answer, but not one that
never finishes sending its request's headers: a client sending a byte every few seconds
holds its socket forever, and any number of them may be open. This protocol adds:

- a header deadline: a connection whose request headers are not complete
  :data:`HEADER_TIMEOUT_S` after it opened (or after its previous answer) is closed;
- a body deadline: a request whose body makes no progress for :data:`BODY_IDLE_S` (no byte
  arrives while the server is ready to read) is closed; the handler sees the client gone
  and an upload being streamed is dropped (staged, so nothing lands);
- a cap per client address: past :data:`MAX_CONNECTIONS_PER_CLIENT` open connections from
  one address, a new one is closed at once (the server-wide cap is uvicorn's
  ``limit_concurrency``, answered 503).

Its answers go out through ``OneWrite`` (api/one_write.py): an answer's head and a small body
in one send instead of two.
"""

from __future__ import annotations

import asyncio
import os
from typing import cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from shellyard.api.one_write import OneWrite

#: Seconds a client has to send a request's headers.
HEADER_TIMEOUT_S = 10.0
#: Seconds a request's body may make no progress while the server waits for it
#: (``SHELLYARD_BODY_IDLE_S`` overrides it, for tests).
BODY_IDLE_S = float(os.environ.get("SHELLYARD_BODY_IDLE_S", "30"))
#: Most connections open at once from one client address.
MAX_CONNECTIONS_PER_CLIENT = 256
#: Most connections and running requests of the whole server (uvicorn answers 503 past it).
MAX_CONCURRENCY = 1024
#: Seconds an idle keep-alive connection stays open after an answer.
KEEP_ALIVE_S = 5


class BoundedH11(H11Protocol):
    _header_deadline: asyncio.TimerHandle | None = None
    _body_deadline: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_body()

    def _watch_body(self) -> None:
        """Re-arm the body deadline on each byte of a body still being sent."""
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self._body_deadline = self.loop.call_later(BODY_IDLE_S, self._body_late)

    def _body_late(self) -> None:
        self._body_deadline = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        if self.flow.read_paused:  # the server is not reading: not the client's delay
            self._body_deadline = self.loop.call_later(BODY_IDLE_S, self._body_late)
            return
        self.logger.warning(
            "closing a connection from %s: its request body made no progress for %g s",
            self.client[0] if self.client else "?",
            BODY_IDLE_S,
        )
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Every write of the protocol and its answers (flow control keeps the socket's own).
        self.transport = cast(asyncio.Transport, OneWrite(transport, self.loop))
        host = self.client[0] if self.client else None
        if host is not None:
            same = sum(
                1
                for other in self.connections
                if isinstance(other, H11Protocol) and other.client and other.client[0] == host
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
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()  # no complete request headers in time

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None
        super().connection_lost(exc)


__all__ = [
    "BODY_IDLE_S",
    "HEADER_TIMEOUT_S",
    "KEEP_ALIVE_S",
    "MAX_CONCURRENCY",
    "MAX_CONNECTIONS_PER_CLIENT",
    "BoundedH11",
]
