"""How much and how long the SDK reads for one JSON answer (docs/operations.md, "The SDK's
bounds on an answer").

A JSON answer is read whole before it is parsed, so without a bound a server (or a man in the
middle on ``http://``) that streams an answer without end grows the client's memory without
end; and a timeout per read lets an answer dripped a byte per (timeout − ε) last for ever.
Both clients' every path (sdk/lean.py's, httpx's for the blocking ``Client`` and for
``AsyncClient`` elsewhere) applies the two bounds here to JSON calls:

- :data:`MAX_JSON_BYTES` of body (decoded): the largest legitimate answer is ``run_shell``
  at ``max_output_length`` 10,000,000 of control characters, each escaped in six bytes
  (60 MB, measured: docs/benchmarks.md); a listing of 10,000 long paths is ~9 MB.
- an :class:`AnswerClock`: the whole exchange (request, head, body) within the call's
  ``timeout_s`` plus a second per :data:`MIN_RATE` bytes of body received (decoded; framing,
  head and empty compressed blocks earn nothing), the rule the server applies
  to a request's body (api/connections.py): an answer faster than 64 KiB/s is never cut.

Byte streams (downloads, log following, the wake stream) keep their per-read progress
timeouts and no size bound: they are read as they arrive, never whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar

import httpx

from shellyard.errors import RunnerUnavailable, ShellyardError

#: Most bytes of one JSON answer's body (``max_json_bytes`` of a client overrides it).
MAX_JSON_BYTES = 256 << 20
#: Bytes per second of an answer's body that earn it a second past its ``timeout_s``.
MIN_RATE = 64 * 1024


class AnswerTooLarge(httpx.RemoteProtocolError):
    """A JSON answer passed the bound: its connection is closed unread."""


class AnswerTooSlow(httpx.ReadTimeout):
    """A JSON answer did not complete within its :class:`AnswerClock` (sdk/lean.py's)."""


def too_large(limit: int, what: str) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"the control plane's answer to {what} passed {limit:,} bytes, the SDK's bound on a "
        f"JSON answer (max_json_bytes; the largest legitimate one is about 60 MB); its "
        "connection was closed unread. Check the server's URL (a proxy or a man in the middle "
        "on http:// can send this), or raise max_json_bytes"
    )


def too_large_error(exc: AnswerTooLarge) -> ShellyardError:
    """What the caller gets: not retryable as such (the same answer would come again)."""
    return ShellyardError(str(exc))


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

    def error(self) -> RunnerUnavailable | None:
        """The caller's error when a timeout came from this clock (retryable, as a timeout)."""
        if not self.expired:
            return None
        return RunnerUnavailable(self.message())


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


def current_clock() -> AnswerClock | None:
    return CLOCK.get()


__all__ = [
    "CLOCK",
    "MAX_JSON_BYTES",
    "MIN_RATE",
    "RESENDABLE",
    "AnswerClock",
    "AnswerTooLarge",
    "AnswerTooSlow",
    "advice",
    "current_clock",
    "too_large",
    "too_large_error",
]
