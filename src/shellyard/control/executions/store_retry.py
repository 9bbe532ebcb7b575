"""Work whose outcome must be recorded waits out a full database volume (docs/limits.md "Full
disk, long commands and bounded records").

A PostgreSQL database has no room kept for it the way a SQLite home has (store/ballast.py):
once its volume is full, recording an execution's end fails with ``StoreFull``. The outcome
is not lost (the runner keeps it, and asking again is idempotent, E10), so the watcher tries
again, backing off, until space is freed, instead of giving up and leaving the record
``running`` with its workspace's writer held until a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shellyard.errors import StoreFull

log = logging.getLogger("shellyard.control.executions")

T = TypeVar("T")

#: First wait after a refused write, and the longest between two tries.
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0


async def while_store_full(attempt: Callable[[], Awaitable[T]], what: str) -> T:
    """Run ``attempt``; while it meets a full database volume, wait and run it again. Also
    for a start the runner made already (its process runs: the record must say so, or the
    workspace's writer stays held by a record that never started)."""
    delay = FIRST_RETRY_S
    while True:
        try:
            return await attempt()
        except StoreFull as exc:
            if delay == FIRST_RETRY_S:
                log.warning(
                    "%s waits for room in the database: %s; trying again until space is freed",
                    what,
                    exc.message,
                    extra={"action": "store_full_retry"},
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)
