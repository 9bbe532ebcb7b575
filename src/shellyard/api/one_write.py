"""An answer's head and body in one send (docs/benchmarks.md §29).

uvicorn's HTTP protocols write an answer's status line and headers, then its body, each with
its own ``transport.write``: two sends for every JSON answer, so the client wakes and reads
twice. This transport holds a write of at most :data:`HOLD_MAX` bytes (an answer's head) and
sends it with the next write (its body) as one send, at once; a write that no other follows
in the same turn of the loop goes out at the end of that turn. So a JSON answer leaves as
soon as its body is written, a streamed body is never held back more than one write or
copied more than once, and an answer that waits for its body (a stream of events) has its
headers sent at the end of the turn that wrote them, as before in every way a client can
see. Closing sends what is held first, as the socket's own buffer does.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: A write up to this size (an answer's head is ~200 bytes) waits for the next write or the
#: end of the loop's turn; anything larger is written at once.
HOLD_MAX = 16 * 1024


class OneWrite:
    """``inner``, with the small writes of one loop turn joined; stands for an
    ``asyncio.Transport`` (what it does not define is ``inner``'s)."""

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop
        self._held = b""
        self._flush_due = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held:  # the write that follows a held one sends both, at once
            data, self._held = self._held + bytes(data), b""
            self._inner.write(data)
            return
        if len(data) <= HOLD_MAX and not self._inner.is_closing():
            self._held = bytes(data)
            if not self._flush_due:
                self._flush_due = True
                self._loop.call_soon(self._flush)
            return
        self._inner.write(data)

    def _flush(self) -> None:
        self._flush_due = False
        if self._held:
            data, self._held = self._held, b""
            self._inner.write(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:  # in order with what is held (never the socket's own)
            self.write(data)

    def close(self) -> None:
        self._flush()
        self._inner.close()

    def abort(self) -> None:
        self._held = b""
        self._inner.abort()

    def write_eof(self) -> None:
        self._flush()
        self._inner.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size() + len(self._held)

    def __getattr__(self, name: str) -> Any:
        # Everything that does not write (is_closing, reading, extra info): the socket's own.
        return getattr(self._inner, name)


__all__ = ["HOLD_MAX", "OneWrite"]
