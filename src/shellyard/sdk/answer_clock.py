"""The SDK's bounds on one JSON answer that need no HTTP library: its size and its clock
(sdk/bounds.py says why). The CLI's fast path (cli/entry.py), which never imports httpx,
reads its answer under these same bounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar

from shellyard.errors import AnswerLost, RunnerUnavailable, ShellyardError

#: Most bytes of one JSON answer's body (``max_json_bytes`` of a client overrides it).
MAX_JSON_BYTES = 256 << 20
#: Bytes per second of an answer's body that earn it a second past its ``timeout_s``.
MIN_RATE = 64 * 1024


def too_large_message(limit: int, what: str) -> str:
    return (
        f"the control plane's answer to {what} passed {limit:,} bytes, the SDK's bound on a "
        f"JSON answer (max_json_bytes; the largest legitimate one is about 60 MB); its "
        "connection was closed unread. Check the server's URL (a proxy or a man in the middle "
        "on http:// can send this), or raise max_json_bytes"
    )


def unreadable(raw: bytes, what: str) -> ShellyardError:
    """The error for a successful answer the client cannot read as what it asked for
    (``what``: "is not JSON", "is not what the SDK expects (...)"): its first 80 bytes as a
    ``bytes`` repr, so a control code is shown escaped, never sent to a terminal."""
    return ShellyardError(
        f"the control plane's answer {what}: {raw[:80]!r}. Check the server's URL (a proxy "
        "or another service may answer there) and that this client and the server are the "
        "same shellyard version"
    )


class AnswerClock:
    """The time one JSON exchange may take: ``timeout_s`` from its start plus a second per
    :data:`MIN_RATE` bytes of body received. ``expired`` is set once a wait was cut by it."""

    def __init__(
        self, timeout_s: float, now: Callable[[], float] = time.monotonic, method: str = "GET"
    ) -> None:
        self.timeout_s = timeout_s
        self.now = now
        #: The request's method: a POST whose answer was cut may have taken effect.
        self.method = method
        self.start = now()
        self.received = 0
        self.expired = False
        #: A write of the request failed (sdk/wire.py): it never went whole, so nothing can
        #: have acted on it. httpcore hides that failure and reports the read after it.
        self.unsent = False

    def left(self) -> float:
        """Seconds left for the whole answer (≤ 0: none)."""
        return self.start + self.timeout_s + self.received / MIN_RATE - self.now()

    def message(self) -> str:
        return (
            f"the control plane's answer did not complete within {self.timeout_s:g} s plus a "
            f"second per {MIN_RATE // 1024} KiB received ({self.received:,} bytes came); "
            + advice(self.method)
        )

    def bound(self, timeout: float | None) -> tuple[float | None, bool]:
        """A read's or write's ``timeout`` cut to what is left (True: the clock cut it; 0 or
        less left: the caller raises its timeout at once)."""
        left = self.left()
        # A wait begun with the exchange (a server silent from the start) stays the read
        # timeout's own, "cannot reach" as before (it ends at most a tenth of the timeout
        # past the clock); one the clock shortens more is the clock's.
        if timeout is None or left < 0.9 * timeout:
            return left, True
        return timeout, False

    def late_error(self) -> RunnerUnavailable:
        """The caller's error for an answer this clock cut: retryable as a timeout, unless
        the request may act twice (then ``AnswerLost``: look first)."""
        kind = RunnerUnavailable if self.method.upper() in RESENDABLE else AnswerLost
        return kind(self.message())

    def error(self) -> RunnerUnavailable | None:
        """``late_error`` when a timeout came from this clock."""
        return self.late_error() if self.expired else None


#: Methods whose request, sent again, does what it did once (the rest may act twice).
RESENDABLE = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


def advice(method: str) -> str:
    """What to do after an answer cut by its clock: the request was sent whole, so a POST
    (``run_shell``) may have run, and "retry" would run it again (docs/security.md "Attack
    pass (session 49)")."""
    if method.upper() in RESENDABLE:
        return "retry, or check the network to the server"
    return (
        f"the server may have acted on this {method.upper()} already (a command may be "
        "running): look before sending it again (list the executions), or send it with an "
        "idempotency_key so that sending it again returns the first"
    )


#: The clock of the JSON call the current thread or task is making through httpx (wire.py's
#: streams cut their reads and writes to it); None during byte streams.
CLOCK: ContextVar[AnswerClock | None] = ContextVar("shellyard_sdk_answer_clock", default=None)


__all__ = [
    "CLOCK",
    "MAX_JSON_BYTES",
    "MIN_RATE",
    "RESENDABLE",
    "AnswerClock",
    "advice",
    "too_large_message",
    "unreadable",
]
