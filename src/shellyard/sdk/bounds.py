"""How much and how long the SDK reads for one JSON answer (docs/operations.md, "The SDK's
bounds on an answer").

A JSON answer is read whole before it is parsed, so without a bound a server (or a man in the
middle on ``http://``) that streams an answer without end grows the client's memory without
end; and a timeout per read lets an answer dripped a byte per (timeout − ε) last for ever.
Both clients' every path (sdk/lean.py's, httpx's for the blocking ``Client`` and for
``AsyncClient`` elsewhere) applies two bounds to JSON calls, kept in sdk/answer_clock.py
(which needs no httpx: the CLI's fast path applies them too); here, httpx's errors for them:

- ``MAX_JSON_BYTES`` of body (decoded): the largest legitimate answer is ``run_shell`` at
  ``max_output_length`` 10,000,000 of control characters, each escaped in six bytes (60 MB,
  measured: docs/benchmarks.md); a listing of 10,000 long paths is ~9 MB.
- an ``AnswerClock``: the whole exchange (request, head, body) within the call's
  ``timeout_s`` plus a second per ``MIN_RATE`` bytes of body received (decoded; framing,
  head and empty compressed blocks earn nothing), the rule the server applies
  to a request's body (api/connections.py): an answer faster than 64 KiB/s is never cut.

Byte streams (downloads, log following, the wake stream) keep their per-read progress
timeouts and no size bound: they are read as they arrive, never whole.
"""

from __future__ import annotations

import httpx

from shellyard.errors import ShellyardError
from shellyard.sdk.answer_clock import AnswerClock, too_large_message


class AnswerTooLarge(httpx.RemoteProtocolError):
    """A JSON answer passed the bound: its connection is closed unread."""


class AnswerTooSlow(httpx.ReadTimeout):
    """A JSON answer did not complete within its :class:`AnswerClock` (sdk/lean.py's)."""

    def __init__(self, clock: AnswerClock) -> None:
        super().__init__(clock.message())
        self.clock = clock


def too_large(limit: int, what: str) -> AnswerTooLarge:
    return AnswerTooLarge(too_large_message(limit, what))


def too_large_error(exc: AnswerTooLarge) -> ShellyardError:
    """What the caller gets: not retryable as such (the same answer would come again)."""
    return ShellyardError(str(exc))
